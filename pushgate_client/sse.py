"""An incremental Server-Sent Events parser (sans-I/O): feed text, get events.

Follows the HTML Living Standard's event-stream interpretation: ``event``, ``data``
(joined by newlines), ``id`` (remembered as the last event id), ``retry``, comments.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Event:
    event: str
    data: str
    id: str | None


class SseParser:
    def __init__(self) -> None:
        self._buffer = ""
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None
        self.last_event_id: str | None = None
        self.retry_ms: int | None = None

    def feed(self, text: str) -> list[Event]:
        """Parse a chunk; return the events it completed."""
        self._buffer += text
        events: list[Event] = []
        while True:
            cut = self._buffer.find("\n")
            if cut < 0:
                break
            line = self._buffer[:cut].rstrip("\r")
            self._buffer = self._buffer[cut + 1 :]
            event = self._line(line)
            if event is not None:
                events.append(event)
        return events

    def _line(self, line: str) -> Event | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self._id = value
        elif name == "retry" and value.isdigit():
            self.retry_ms = int(value)
        return None

    def _dispatch(self) -> Event | None:
        if self._id is not None:
            self.last_event_id = self._id
        if not self._data and not self._event:
            return None
        event = Event(self._event or "message", "\n".join(self._data), self._id)
        self._event, self._data, self._id = "", [], None
        return event

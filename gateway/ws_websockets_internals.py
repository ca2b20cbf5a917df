"""Everything the WebSocket fast path reads of ``websockets`` beyond its public API, in one place.

The fast path (:mod:`gateway.ws_server_protocol`) cuts a client's bytes into frames itself
only while ``websockets``' sans-I/O parser has consumed every byte and waits for a new frame;
it asks that here, of the parser's state: its buffered bytes, whether a fragmented message is
under way, whether it failed, its size limits, and which generator the parser is suspended
in. It unmasks payloads with ``websockets``' C ``apply_mask``. None of that is public API, so
it is imported (through :mod:`gateway.ws_server_protocol`) only on the ``websockets``
releases :mod:`gateway.ws_protocol` names as tested.
"""

from __future__ import annotations

from typing import Any

from websockets.protocol import Protocol, State
from websockets.streams import StreamReader

try:  # the C implementation, as websockets uses it
    from websockets.speedups import apply_mask as apply_mask
except ImportError:  # pragma: no cover (pure-Python websockets builds)
    from websockets.utils import apply_mask as apply_mask

# The generator websockets' parser waits in between two frames.
_BETWEEN_FRAMES = StreamReader.at_eof.__code__


def between_frames(conn: Protocol) -> bool:
    """Whether ``conn``'s parser has consumed every byte and waits for a new frame of an open
    connection without extensions (so cutting the stream into frames elsewhere loses nothing)."""
    if (
        conn.state is not State.OPEN
        or conn.extensions
        or conn.reader.buffer
        or conn.current_size is not None
        or conn.parser_exc is not None
    ):
        return False
    # The parser is a generator waiting in a chain of sub-generators; between frames the
    # innermost is StreamReader.at_eof. Anything else keeps websockets' own path.
    waiting: Any = conn.parser
    while (inner := getattr(waiting, "gi_yieldfrom", None)) is not None:
        waiting = inner
    return getattr(waiting, "gi_code", None) is _BETWEEN_FRAMES


def frame_size_limit(conn: Protocol) -> int | None:
    """The largest payload ``conn`` accepts in one frame (None: no limit)."""
    sizes = (conn.max_message_size, getattr(conn, "max_fragment_size", None))
    limits = [n for n in sizes if n is not None]
    return min(limits) if limits else None


def within_message(conn: Protocol) -> bool:
    """Whether a fragmented message is under way (its next frame is a continuation)."""
    return conn.current_size is not None


def parser_failed(conn: Protocol) -> bool:
    """Whether ``conn``'s parser stopped on an error (what follows is discarded)."""
    return conn.parser_exc is not None

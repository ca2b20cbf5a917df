"""WebSocket framing for the push fast path, without I/O (RFC 6455, section 5.2).

Two small pieces that :mod:`gateway.ws_server_protocol` uses to move the common frames of
an open ``/v1/ws`` connection without ``websockets``' general parser and serializer:

- :func:`text_frame_header`: the header of a server text frame (final, not masked), so a
  frame to the client is ``header + payload`` with no ``Frame`` object in between;
- :class:`FrameSplitter`: cuts the bytes a client sends into whole frames (a partial frame
  waits in its buffer for the rest); :func:`text_payload` unmasks the payload of a frame
  that is a whole text message (final, masked, no reserved bits, opcode 1).

Everything else (control frames, fragments, binary frames, anything malformed) is handed
on as whole frames to ``websockets``, which keeps the protocol's state and its errors: a
frame it sees is always complete, so its parser is always between frames. A frame
announcing more than ``max_size`` bytes turns the splitter into a pass-through at once, so
it never buffers more than ``websockets`` itself would before refusing (1009).
"""

from __future__ import annotations

import struct

try:  # the C implementation, as websockets uses it
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover (pure-Python websockets builds)
    from websockets.utils import apply_mask

_SHORT_HEADERS = [bytes((0x81, n)) for n in range(126)]
_MEDIUM_HEADER = struct.Struct("!BBH")
_LONG_HEADER = struct.Struct("!BBQ")
# FIN set, no reserved bits, opcode 1 (text).
_FINAL_TEXT = 0x81
_MASKED = 0x80


def text_frame_header(length: int) -> bytes:
    """The header of an unmasked, final text frame with a payload of ``length`` bytes."""
    if length < 126:
        return _SHORT_HEADERS[length]
    if length < 1 << 16:
        return _MEDIUM_HEADER.pack(_FINAL_TEXT, 126, length)
    return _LONG_HEADER.pack(_FINAL_TEXT, 127, length)


def _payload_at(frame: bytes | bytearray, start: int) -> tuple[int, int] | None:
    """(offset of the payload after the length fields, payload length) of the frame at
    ``start``, or None when its header is not complete yet."""
    available = len(frame) - start
    if available < 2:
        return None
    length = frame[start + 1] & 0x7F
    if length == 126:
        if available < 4:
            return None
        return start + 4, int.from_bytes(frame[start + 2 : start + 4], "big")
    if length == 127:
        if available < 10:
            return None
        return start + 10, int.from_bytes(frame[start + 2 : start + 10], "big")
    return start + 2, length


def text_payload(frame: bytes) -> bytes | None:
    """The unmasked payload of a whole frame that is a complete client text message; None
    for any other frame (control, fragment, binary, unmasked, reserved bits)."""
    if frame[0] != _FINAL_TEXT or not frame[1] & _MASKED:
        return None
    at = _payload_at(frame, 0)
    assert at is not None  # a whole frame
    offset = at[0]
    return apply_mask(frame[offset + 4 :], frame[offset : offset + 4])


class FrameSplitter:
    """Cuts a client's byte stream into whole frames."""

    __slots__ = ("_buffer", "max_size", "passthrough")

    def __init__(self, max_size: int | None) -> None:
        self._buffer = bytearray()
        # The largest payload a frame may announce before the splitter stops splitting.
        self.max_size = max_size
        # True once a frame was too large: from then on data is handed on as it comes.
        self.passthrough = False

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes) -> list[bytes]:
        """The whole frames that ``data`` completes, in order (in pass-through: everything
        not handed on yet, as one piece)."""
        if self.passthrough:
            return [data] if data else []
        if self._buffer:
            self._buffer += data
            data = bytes(self._buffer)
            self._buffer.clear()
        frames: list[bytes] = []
        pos, end_of_data = 0, len(data)
        while pos < end_of_data:
            at = _payload_at(data, pos)
            if at is None:
                break
            offset, length = at
            if self.max_size is not None and length > self.max_size:
                self.passthrough = True
                frames.append(data[pos:])
                return frames
            if data[pos + 1] & _MASKED:
                offset += 4
            end = offset + length
            if end > end_of_data:
                break
            frames.append(data[pos:end])
            pos = end
        if pos < end_of_data:
            self._buffer += data[pos:]
        return frames

    def take_buffer(self) -> bytes:
        """What waits for the rest of a frame (handed on when splitting stops)."""
        rest = bytes(self._buffer)
        self._buffer.clear()
        return rest

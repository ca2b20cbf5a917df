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

from .ws_websockets_internals import apply_mask

_SHORT_HEADERS = [bytes((0x81, n)) for n in range(126)]
_MEDIUM_HEADER = struct.Struct("!BBH")
_LONG_HEADER = struct.Struct("!BBQ")
_LENGTH16 = struct.Struct("!H").unpack_from
_LENGTH64 = struct.Struct("!Q").unpack_from
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


def text_payload(frame: bytes) -> bytes | None:
    """The unmasked payload of a whole frame that is a complete client text message; None
    for any other frame (control, fragment, binary, unmasked, reserved bits)."""
    if frame[0] != _FINAL_TEXT:
        return None
    code = frame[1]
    if not code & _MASKED:
        return None
    code &= 0x7F
    mask_at = 2 if code < 126 else 4 if code == 126 else 10
    return apply_mask(frame[mask_at + 4 :], frame[mask_at : mask_at + 4])


def unmask(data: bytes, mask_at: int, end: int) -> bytes:
    """The payload of a client text frame cut by :meth:`FrameSplitter.cut`, unmasked."""
    return apply_mask(data[mask_at + 4 : end], data[mask_at : mask_at + 4])


class FrameSplitter:
    """Cuts a client's byte stream into whole frames."""

    __slots__ = ("_buffer", "max_size", "passthrough")

    def __init__(self, max_size: int | None) -> None:
        # The start of a frame whose rest has not come yet (bytes: joined to the next read
        # in one copy).
        self._buffer = b""
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
        data, spans = self.cut(data)
        return [data[start:end] for start, _, end in spans]

    def cut(self, data: bytes) -> tuple[bytes, list[tuple[int, int, int]]]:
        """:meth:`feed` without the copies: the bytes the frames are in, and each frame as
        ``(start, mask_at, end)`` in them, ``mask_at`` the offset of the mask of a frame that is
        a whole client text message (final, masked, no reserved bits, opcode 1; its payload
        follows the mask up to ``end``), -1 for any other frame."""
        if self.passthrough:
            return data, [(0, -1, len(data))] if data else []
        if self._buffer:
            data = self._buffer + data
            self._buffer = b""
        spans: list[tuple[int, int, int]] = []
        pos, end_of_data = 0, len(data)
        max_size = self.max_size
        while end_of_data - pos >= 2:
            code = data[pos + 1]
            length = code & 0x7F
            if length < 126:
                offset = pos + 2
            elif length == 126:
                if end_of_data - pos < 4:
                    break
                offset, length = pos + 4, _LENGTH16(data, pos + 2)[0]
            else:
                if end_of_data - pos < 10:
                    break
                offset, length = pos + 10, _LENGTH64(data, pos + 2)[0]
            if max_size is not None and length > max_size:
                self.passthrough = True
                spans.append((pos, -1, end_of_data))
                return data, spans
            if code & _MASKED:
                end = offset + 4 + length
                mask_at = offset if data[pos] == _FINAL_TEXT else -1
            else:
                end = offset + length
                mask_at = -1
            if end > end_of_data:
                break
            spans.append((pos, mask_at, end))
            pos = end
        if pos < end_of_data:
            self._buffer = data[pos:]
        return data, spans

    def take_buffer(self) -> bytes:
        """What waits for the rest of a frame (handed on when splitting stops)."""
        rest = self._buffer
        self._buffer = b""
        return rest

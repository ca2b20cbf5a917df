"""``MD5OfMessageBody`` and ``MD5OfMessageAttributes`` exactly as AWS computes them.

SDKs (Java, Go, .NET, the JavaScript v3 client) recompute these and refuse an answer whose
checksum differs, so the encoding is AWS's, byte for byte: attributes sorted by name, and
for each the name, the data type, one transport byte (1 for String and Number, 2 for
Binary, by the type's prefix before any ``.custom`` suffix) and the value, every string
and value prefixed by its length as a 4-byte big-endian integer.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections.abc import Mapping
from typing import Any

STRING_TRANSPORT = 1
BINARY_TRANSPORT = 2


def md5_of_body(body: str) -> str:
    """The hex MD5 of a message body's UTF-8 bytes."""
    return hashlib.md5(body.encode("utf-8"), usedforsecurity=False).hexdigest()


def _field(raw: bytes) -> bytes:
    return struct.pack(">I", len(raw)) + raw


def attribute_value_bytes(value: Mapping[str, Any]) -> tuple[int, bytes]:
    """The transport byte and the raw value of one attribute (as JSON carries it)."""
    data_type = str(value["DataType"])
    if data_type.split(".", 1)[0] == "Binary":
        binary = value["BinaryValue"]
        raw = binary if isinstance(binary, bytes) else base64.b64decode(binary)
        return BINARY_TRANSPORT, raw
    return STRING_TRANSPORT, str(value["StringValue"]).encode("utf-8")


def md5_of_attributes(attributes: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The hex MD5 AWS returns for message attributes, or None when there are none."""
    if not attributes:
        return None
    digest = hashlib.md5(usedforsecurity=False)
    for name in sorted(attributes):
        value = attributes[name]
        transport, raw = attribute_value_bytes(value)
        digest.update(_field(name.encode("utf-8")))
        digest.update(_field(str(value["DataType"]).encode("utf-8")))
        digest.update(bytes([transport]))
        digest.update(_field(raw))
    return digest.hexdigest()

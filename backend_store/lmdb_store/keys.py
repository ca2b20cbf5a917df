"""Byte layouts of the LMDB keys. Big-endian integers so byte order is numeric order."""

from __future__ import annotations

import binascii
import functools
import hashlib
import re
import struct

from ..attributes import check_queue_name
from ..errors import InvalidReceipt, InvalidRequest
from ..types import Receipt

_U64 = struct.Struct(">Q")
_U64x2 = struct.Struct(">QQ")
_U64x3 = struct.Struct(">QQQ")

RECEIPT_TOKEN_BYTES = 12
_RECEIPT = struct.Struct(f">QQ{RECEIPT_TOKEN_BYTES}s")


def u64(n: int) -> bytes:
    return _U64.pack(n)


def read_u64(b: bytes, offset: int = 0) -> int:
    value: int = _U64.unpack_from(b, offset)[0]
    return value


# Tenant ids come from auth, not from this store: refuse the ones that could forge a key
# (a NUL would let tenant "a" share a prefix with tenant "a\0b").
_TENANT = re.compile(r"[^\x00-\x1f\x7f]{1,128}")


def tenant_prefix(tenant: str) -> bytes:
    if not isinstance(tenant, str) or not _TENANT.fullmatch(tenant):
        raise InvalidRequest("tenant ids are 1-128 characters without control characters")
    try:
        return tenant.encode() + b"\0"
    except UnicodeEncodeError:
        raise InvalidRequest("tenant id is not valid Unicode") from None


@functools.lru_cache(maxsize=8192)
def queue_key(tenant: str, name: str) -> bytes:
    """``queues`` db: tenant and name; a tenant's queues share the prefix ``tenant\\0``.

    Memoized: every operation builds it, and checking both names each time showed in profiles.
    """
    check_queue_name(name)
    return tenant_prefix(tenant) + name.encode()


def message_key(qid: int, seq: int) -> bytes:
    """``msgs`` db: one record per stored message, in seq order within a queue."""
    return _U64x2.pack(qid, seq)


def visibility_key(qid: int, visible_ms: int, seq: int) -> bytes:
    """``vis`` db: every receivable message once, ordered by when it becomes visible."""
    return _U64x3.pack(qid, visible_ms, seq)


def expiry_key(qid: int, sent_ms: int, seq: int) -> bytes:
    """``expiry`` db: dead-lettered messages, whose original ``sent_at`` breaks seq order."""
    return _U64x3.pack(qid, sent_ms, seq)


def split_visibility_key(key: bytes) -> tuple[int, int, int]:
    qid, visible_ms, seq = _U64x3.unpack(key)
    return qid, visible_ms, seq


def group_prefix(qid: int, group: str) -> bytes:
    raw = group.encode()
    if len(raw) > 255:
        # Long group ids are hashed so keys stay under LMDB's 511-byte limit.
        raw = b"#" + hashlib.sha256(raw).digest()
    return u64(qid) + len(raw).to_bytes(2, "big") + raw


def group_key(qid: int, group: str, seq: int) -> bytes:
    """``groups`` db: a FIFO queue's messages per group in send order; the first is the head."""
    return group_prefix(qid, group) + u64(seq)


def dedupe_key(qid: int, token: bytes) -> bytes:
    return u64(qid) + token


def dedupe_expiry_key(expires_ms: int, qid: int, token: bytes) -> bytes:
    return _U64x2.pack(expires_ms, qid) + token


# URL-safe base64 through binascii directly: ``base64.urlsafe_b64encode``/``decode`` do the
# same (translate, then binascii) behind two more calls, which showed at one receipt per message.
_TO_URLSAFE = bytes.maketrans(b"+/", b"-_")
_FROM_URLSAFE = bytes.maketrans(b"-_", b"+/")


def encode_receipt(qid: int, seq: int, token: bytes) -> Receipt:
    raw = binascii.b2a_base64(_RECEIPT.pack(qid, seq, token), newline=False)
    return Receipt(raw.translate(_TO_URLSAFE).rstrip(b"=").decode())


def decode_receipt(receipt: str) -> tuple[int, int, bytes]:
    """Split a receipt into (qid, seq, token); anything malformed is :class:`InvalidReceipt`."""
    if not isinstance(receipt, str) or len(receipt) > 64:
        raise InvalidReceipt("malformed receipt")
    try:
        # As base64.urlsafe_b64decode: ASCII only (a UnicodeEncodeError is a ValueError),
        # characters outside the alphabet are passed over.
        text = receipt.encode("ascii").translate(_FROM_URLSAFE) + b"=" * (-len(receipt) % 4)
        qid, seq, token = _RECEIPT.unpack(binascii.a2b_base64(text))
    except (binascii.Error, ValueError, struct.error):
        raise InvalidReceipt("malformed receipt") from None
    return qid, seq, token

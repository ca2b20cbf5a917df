"""Encryption at rest: message bodies sealed with AES-GCM under a key id.

A keyring holds every key that may still be needed to open old records and names
one active key for new ones, so keys rotate without rewriting the store: add a new
key, make it active, and keep the old one until the old messages are gone.

Key file (JSON)::

    {"active": "k2", "keys": {"k1": "<base64 of 32 bytes>", "k2": "<base64 of 32 bytes>"}}

or the same JSON in the ``PUSHGATE_ENCRYPTION_KEYS`` environment variable.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
from collections.abc import Mapping
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .errors import ConfigurationError, Unavailable

ENV_VAR = "PUSHGATE_ENCRYPTION_KEYS"
_NONCE = 12


class Keyring:
    """AES-256-GCM keys by id; ``active`` seals, any of them opens."""

    def __init__(self, keys: Mapping[str, bytes], active: str) -> None:
        if active not in keys:
            raise ConfigurationError(f"active encryption key {active!r} is not in the keyring")
        for key_id, key in keys.items():
            if len(key) != 32:
                raise ConfigurationError(f"encryption key {key_id!r} must be 32 bytes (AES-256)")
            if not 0 < len(key_id.encode()) < 256:
                raise ConfigurationError("encryption key ids must be 1-255 bytes")
        self.active = active
        self._keys = dict(keys)
        self._ciphers = {key_id: AESGCM(key) for key_id, key in keys.items()}
        self._active_cipher = self._ciphers[active]
        self._active_prefix = bytes([len(active.encode())]) + active.encode()

    @property
    def key_ids(self) -> frozenset[str]:
        return frozenset(self._ciphers)

    def seal(self, plaintext: bytes, associated: bytes = b"") -> bytes:
        """Encrypt; the result names its key so it can be opened after rotation."""
        nonce = os.urandom(_NONCE)
        return self._active_prefix + nonce + self._active_cipher.encrypt(nonce, plaintext, associated)

    def derive(self, purpose: bytes) -> bytes:
        """A secret for ``purpose`` derived from the active key (keyed hashes at rest)."""
        return hmac.new(self._keys[self.active], purpose, hashlib.sha256).digest()

    def seal_with(self, key_id: str, plaintext: bytes) -> bytes:
        """Encrypt under a named key (start-up key checks; new data uses :meth:`seal`)."""
        nonce = os.urandom(_NONCE)
        prefix = bytes([len(key_id.encode())]) + key_id.encode()
        return prefix + nonce + self._ciphers[key_id].encrypt(nonce, plaintext, b"")

    def open(self, sealed: bytes, associated: bytes = b"") -> bytes:
        """Decrypt what :meth:`seal` made; a missing key or a bad tag is :class:`Unavailable`."""
        n = sealed[0]
        key_id = sealed[1 : 1 + n].decode()
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise Unavailable(f"record sealed with unknown encryption key {key_id!r}")
        nonce = sealed[1 + n : 1 + n + _NONCE]
        try:
            return cipher.decrypt(nonce, sealed[1 + n + _NONCE :], associated)
        except InvalidTag:
            raise Unavailable("record failed authentication (wrong key or corrupt data)") from None

    @staticmethod
    def key_id_of(sealed: bytes) -> str:
        return sealed[1 : 1 + sealed[0]].decode()

    @classmethod
    def from_json(cls, text: str) -> Keyring:
        try:
            doc = json.loads(text)
            keys = {str(k): base64.b64decode(v, validate=True) for k, v in doc["keys"].items()}
            active = str(doc["active"])
        except (ValueError, KeyError, TypeError, AttributeError, binascii.Error) as exc:
            raise ConfigurationError(f"bad encryption key document: {exc}") from None
        return cls(keys, active)

    @classmethod
    def from_file(cls, path: str | Path) -> Keyring:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigurationError(f"cannot read encryption key file {path}: {exc.strerror}") from None
        return cls.from_json(text)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Keyring | None:
        text = (os.environ if environ is None else environ).get(ENV_VAR)
        return cls.from_json(text) if text else None

    @staticmethod
    def generate_document(key_id: str = "k1") -> str:
        """A new key document with one random key (for ``pushgate`` set-up and tests)."""
        key = base64.b64encode(AESGCM.generate_key(256)).decode()
        return json.dumps({"active": key_id, "keys": {key_id: key}})

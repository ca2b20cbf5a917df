"""Start-up configuration of the store: store URLs and encryption keyrings.

Every mistake here must be a :class:`ConfigurationError` naming what is wrong, raised
before the store takes traffic; never a stack trace from deep inside.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from backend_store import open_backend
from backend_store.encryption import ENV_VAR, Keyring
from backend_store.errors import ConfigurationError, Unavailable
from backend_store.url import lmdb_path


def doc(active: str = "k1", **keys: bytes) -> str:
    keys = keys or {"k1": os.urandom(32)}
    return json.dumps({"active": active, "keys": {k: base64.b64encode(v).decode() for k, v in keys.items()}})


# URLs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "path"),
    [("lmdb:///var/lib/pushgate", Path("/var/lib/pushgate")), ("lmdb://data/store", Path("data/store"))],
)
def test_lmdb_urls(url: str, path: Path) -> None:
    assert lmdb_path(url) == path


@pytest.mark.parametrize("url", ["lmdb://", "redis://localhost:6379", "", "/just/a/path", "memory://"])
def test_bad_store_urls(url: str) -> None:
    with pytest.raises(ConfigurationError):
        open_backend(url)


# Keyrings ---------------------------------------------------------------------------


def test_seal_and_open_round_trip_and_name_their_key() -> None:
    ring = Keyring.from_json(doc())
    sealed = ring.seal(b"secret body", b"context")
    assert b"secret body" not in sealed
    assert Keyring.key_id_of(sealed) == "k1"
    assert ring.open(sealed, b"context") == b"secret body"
    # Same plaintext, fresh nonce: equal bodies do not look equal at rest.
    assert ring.seal(b"secret body") != ring.seal(b"secret body")


def test_open_refuses_tampering_wrong_context_and_unknown_keys() -> None:
    ring = Keyring.from_json(doc())
    sealed = bytearray(ring.seal(b"secret body", b"ctx"))
    with pytest.raises(Unavailable):
        ring.open(bytes(sealed), b"other ctx")
    sealed[-1] ^= 1
    with pytest.raises(Unavailable):
        ring.open(bytes(sealed), b"ctx")
    other = Keyring.from_json(doc("k9", k9=os.urandom(32)))
    with pytest.raises(Unavailable, match="k9"):
        ring.open(other.seal(b"x"))


def test_rotation_opens_old_and_seals_with_the_new_key() -> None:
    k1, k2 = os.urandom(32), os.urandom(32)
    old = Keyring.from_json(doc("k1", k1=k1))
    rotated = Keyring.from_json(doc("k2", k1=k1, k2=k2))
    assert rotated.open(old.seal(b"old")) == b"old"
    assert Keyring.key_id_of(rotated.seal(b"new")) == "k2"
    assert rotated.key_ids == {"k1", "k2"}


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        "{}",
        json.dumps({"active": "k1"}),
        json.dumps({"active": "k1", "keys": {"k1": "not base64!"}}),
        json.dumps({"active": "k1", "keys": {"k1": base64.b64encode(b"short").decode()}}),
        json.dumps({"active": "k2", "keys": {"k1": base64.b64encode(os.urandom(32)).decode()}}),
        json.dumps({"active": "", "keys": {"": base64.b64encode(os.urandom(32)).decode()}}),
    ],
    ids=["garbage", "list", "empty", "no-keys", "bad-base64", "short-key", "active-missing", "empty-id"],
)
def test_bad_key_documents(text: str) -> None:
    with pytest.raises(ConfigurationError):
        Keyring.from_json(text)


def test_key_file_and_environment(tmp_path: Path) -> None:
    key_file = tmp_path / "keys.json"
    key_file.write_text(Keyring.generate_document("main"))
    assert Keyring.from_file(key_file).active == "main"
    with pytest.raises(ConfigurationError, match=r"missing\.json"):
        Keyring.from_file(tmp_path / "missing.json")

    assert Keyring.from_env({}) is None
    from_env = Keyring.from_env({ENV_VAR: key_file.read_text()})
    assert from_env is not None and from_env.active == "main"
    with pytest.raises(ConfigurationError):
        Keyring.from_env({ENV_VAR: "{"})

"""``pushgate admin``, run as a real subprocess on a real data directory."""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
import orjson
import pytest

from backend_store import StoreOptions, open_backend
from backend_store.backend import Backend
from backend_store.encryption import Keyring
from backend_store.errors import Unauthorized
from backend_store.types import QueueName, TenantId
from gateway.admin_cli import main
from gateway.auth.authenticator import Authenticator
from gateway.settings import default_store_url
from tests.conftest import ManualClock, scaled

from .keys import HS_SECRET, ec_pair, rsa_pair

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Result:
    code: int
    out: dict[str, Any]
    err: str


@pytest.fixture(autouse=True)
def no_pushgate_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith("PUSHGATE_")]:
        monkeypatch.delenv(name)


async def admin(data_dir: Path, *args: str) -> Result:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PUSHGATE_")}
    env["PYTHONPATH"] = str(REPO)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.admin_cli",
        "--data",
        str(data_dir),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=data_dir.parent,
    )
    stdout, stderr = await asyncio.wait_for(proc.communicate(), scaled(30))
    assert proc.returncode is not None
    lines = stdout.decode().splitlines()
    if proc.returncode == 0:
        assert len(lines) == 1, stdout  # exactly one JSON object
        return Result(0, orjson.loads(lines[0]), stderr.decode())
    assert not lines, stdout
    assert stderr.strip()
    return Result(proc.returncode, {}, stderr.decode())


def admin_in_process(capsys: pytest.CaptureFixture[str], data_dir: Path, *args: str) -> Result:
    """The same command through ``main`` in this process: quicker, for the many error cases."""
    code = main(["--data", str(data_dir), *args])
    captured = capsys.readouterr()
    if code == 0:
        return Result(0, orjson.loads(captured.out), captured.err)
    assert not captured.out and captured.err.strip()
    return Result(code, {}, captured.err)


async def ok(data_dir: Path, *args: str) -> dict[str, Any]:
    result = await admin(data_dir, *args)
    assert result.code == 0, result.err
    return result.out


async def open_store(data_dir: Path, keyring: Keyring | None = None) -> Backend:
    """The store a gateway serving ``data_dir`` opens."""
    store = open_backend(default_store_url(data_dir), StoreOptions(keyring=keyring, sweep_interval_s=0))
    await store.start()
    return store


async def test_tenants(data_dir: Path) -> None:
    assert await ok(data_dir, "tenant", "create", "acme", "--origin", "https://app.acme.com") == {
        "tenant": "acme",
        "origins": ["https://app.acme.com"],
    }
    await ok(data_dir, "tenant", "create", "globex")
    listed = await ok(data_dir, "tenant", "list")
    assert [(t["tenant"], t["origins"]) for t in listed["tenants"]] == [
        ("acme", ["https://app.acme.com"]),
        ("globex", []),
    ]
    duplicate = await admin(data_dir, "tenant", "create", "acme")
    assert duplicate.code == 1 and "exists" in duplicate.err
    changed = await ok(data_dir, "tenant", "set-origins", "globex", "--origin", "http://localhost:3000")
    assert changed == {"tenant": "globex", "origins": ["http://localhost:3000"]}


async def test_keys_create_list_revoke(data_dir: Path) -> None:
    await ok(data_dir, "tenant", "create", "acme")
    created = await ok(data_dir, "key", "create", "--tenant", "acme", "--scope", "send:orders-* receive:*")
    assert set(created) == {"key_id", "key", "tenant", "scopes"}
    assert created["tenant"] == "acme"
    assert created["scopes"] == ["receive:*", "send:orders-*"]
    assert created["key"].startswith("pgk_" + created["key_id"] + "_")
    listed = await ok(data_dir, "key", "list", "--tenant", "acme")
    assert [k["key_id"] for k in listed["keys"]] == [created["key_id"]]
    assert created["key"] not in str(listed)
    assert listed["keys"][0]["revoked_at"] is None
    assert await ok(data_dir, "key", "revoke", created["key_id"]) == {"revoked": created["key_id"]}
    listed = await ok(data_dir, "key", "list", "--tenant", "acme")
    assert listed["keys"][0]["revoked_at"] is not None
    store = await open_store(data_dir)
    try:
        with pytest.raises(Unauthorized, match="revoked"):
            await Authenticator(store).authenticate(created["key"])
    finally:
        await store.close()


def test_key_errors(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def run(*args: str) -> Result:
        return admin_in_process(capsys, data_dir, *args)

    assert run("tenant", "create", "acme").code == 0
    missing = run("key", "create", "--tenant", "ghost", "--scope", "admin")
    assert missing.code == 1 and "ghost" in missing.err
    assert run("key", "create", "--tenant", "acme", "--scope", "root").code == 1
    assert run("key", "revoke", "0000000000000000").code == 1
    assert run("key", "list", "--tenant", "ghost").code == 1
    assert run("key", "create", "--tenant", "acme").code == 2


async def test_jwt_key_add_list_remove(data_dir: Path, tmp_path: Path) -> None:
    await ok(data_dir, "tenant", "create", "acme")
    secret_file = tmp_path / "hs.secret"
    secret_file.write_bytes(HS_SECRET + b"\n")
    pem_file = tmp_path / "rsa.pem"
    pem_file.write_bytes(rsa_pair().public_pem)
    ec_file = tmp_path / "ec.pem"
    ec_file.write_bytes(ec_pair().public_pem)
    added = await ok(
        data_dir,
        "jwt-key",
        "add",
        "--tenant",
        "acme",
        "--kid",
        "k1",
        "--alg",
        "HS256",
        "--secret-file",
        str(secret_file),
    )
    assert added == {"tenant": "acme", "kid": "k1", "alg": "HS256"}
    await ok(
        data_dir,
        "jwt-key",
        "add",
        "--tenant",
        "acme",
        "--kid",
        "r1",
        "--alg",
        "RS256",
        "--public-key-file",
        str(pem_file),
    )
    await ok(
        data_dir,
        "jwt-key",
        "add",
        "--tenant",
        "acme",
        "--kid",
        "e1",
        "--alg",
        "ES256",
        "--public-key-file",
        str(ec_file),
    )
    listed = await ok(data_dir, "jwt-key", "list", "--tenant", "acme")
    assert sorted((k["kid"], k["alg"]) for k in listed["keys"]) == [
        ("e1", "ES256"),
        ("k1", "HS256"),
        ("r1", "RS256"),
    ]
    assert HS_SECRET.decode() not in str(listed)

    store = await open_store(data_dir)
    try:
        auth = Authenticator(store)
        claims = {"sub": "u", "tenant": "acme", "scope": "send:q", "exp": 2_000_000_000}
        # The trailing newline of the secret file is not part of the secret.
        token = jwt.encode(claims, HS_SECRET, algorithm="HS256", headers={"kid": "k1"})
        assert (await auth.authenticate(token)).subject == "u"
        token = jwt.encode(claims, ec_pair().private, algorithm="ES256", headers={"kid": "e1"})
        assert (await auth.authenticate(token)).subject == "u"
    finally:
        await store.close()

    assert await ok(data_dir, "jwt-key", "remove", "--tenant", "acme", "--kid", "k1") == {
        "removed": "k1",
        "tenant": "acme",
    }
    assert (await admin(data_dir, "jwt-key", "remove", "--tenant", "acme", "--kid", "k1")).code == 1


def test_jwt_key_errors(data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert admin_in_process(capsys, data_dir, "tenant", "create", "acme").code == 0
    pem_file = tmp_path / "rsa.pem"
    pem_file.write_bytes(rsa_pair().public_pem)
    short = tmp_path / "short"
    short.write_bytes(b"tiny")
    base = ["jwt-key", "add", "--tenant", "acme", "--kid", "k"]
    cases = [
        ([*base, "--alg", "HS256", "--public-key-file", str(pem_file)], 2),  # HS256 needs a secret
        ([*base, "--alg", "RS256", "--secret-file", str(short)], 2),  # RS256 needs a public key
        ([*base, "--alg", "HS256", "--secret-file", str(short)], 1),  # too short
        ([*base, "--alg", "HS256", "--secret-file", str(pem_file)], 1),  # a PEM as HMAC secret
        ([*base, "--alg", "ES256", "--public-key-file", str(pem_file)], 1),  # wrong key type
        ([*base, "--alg", "HS512", "--secret-file", str(short)], 2),  # unsupported algorithm
        ([*base, "--alg", "HS256", "--secret-file", str(tmp_path / "missing")], 1),
        ([*base, "--alg", "HS256"], 2),  # neither file
        (["jwt-key", "add", "--tenant", "acme", "--kid", "pushgate-minted", "--alg", "RS256",
          "--public-key-file", str(pem_file)], 1),  # reserved kid
    ]  # fmt: skip
    for args, code in cases:
        result = admin_in_process(capsys, data_dir, *args)
        assert result.code == code, (args, result.err)


async def test_delete_queue(data_dir: Path) -> None:
    store = await open_store(data_dir)
    try:
        await store.create_queue(TenantId("acme"), QueueName("jobs"), {})
    finally:
        await store.close()
    assert await ok(data_dir, "delete-queue", "--tenant", "acme", "jobs") == {"deleted": "jobs"}
    gone = await admin(data_dir, "delete-queue", "--tenant", "acme", "jobs")
    assert gone.code == 1 and "jobs" in gone.err


def test_usage_errors(data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert admin_in_process(capsys, data_dir, "frobnicate").code == 2
    assert admin_in_process(capsys, data_dir).code == 2
    assert admin_in_process(capsys, data_dir, "tenant", "create", "bad/name").code == 1
    assert admin_in_process(capsys, data_dir, "tenant", "create", "x", "--origin", "not-a-url").code == 1
    missing_dir = admin_in_process(capsys, tmp_path / "no-such-dir", "tenant", "list")
    assert missing_dir.code == 1 and "no data directory" in missing_dir.err
    assert not (tmp_path / "no-such-dir").exists()


async def test_cli_beside_a_running_gateway(data_dir: Path) -> None:
    """The CLI and a gateway's store share the directory; a revoke reaches the gateway
    when its cache entry expires (or at once after invalidate())."""
    store = await open_store(data_dir)
    try:
        cache_clock = ManualClock()
        auth = Authenticator(store, cache_ttl_s=5.0, clock=cache_clock)
        await auth.tenants.create("acme")
        created = await ok(data_dir, "key", "create", "--tenant", "acme", "--scope", "send:*")
        principal = await auth.authenticate(created["key"])
        assert principal.subject == created["key_id"]
        await ok(data_dir, "key", "revoke", created["key_id"])
        assert await auth.authenticate(created["key"]) == principal  # cached
        cache_clock.advance(5.0)
        with pytest.raises(Unauthorized, match="revoked"):
            await auth.authenticate(created["key"])
        await ok(data_dir, "tenant", "create", "globex")
        assert sorted(t.name for t in await auth.tenants.list_all()) == ["acme", "globex"]
    finally:
        await store.close()


async def test_encrypted_store_needs_its_keys(data_dir: Path, tmp_path: Path) -> None:
    key_file = tmp_path / "keys.json"
    key_file.write_text(Keyring.generate_document("k1"))
    store = await open_store(data_dir, Keyring.from_file(key_file))
    await store.close()
    refused = await admin(data_dir, "tenant", "create", "acme")
    assert refused.code == 1 and "encrypt" in refused.err
    created = await ok(data_dir, "--encryption-key-file", str(key_file), "tenant", "create", "acme")
    assert created["tenant"] == "acme"


def test_main_in_process_accepts_a_leading_admin(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["admin", "--data", str(data_dir), "tenant", "create", "acme"]) == 0
    assert orjson.loads(capsys.readouterr().out) == {"tenant": "acme", "origins": []}
    assert main(["--data", str(data_dir), "tenant", "list"]) == 0
    assert [t["tenant"] for t in orjson.loads(capsys.readouterr().out)["tenants"]] == ["acme"]
    assert main(["--help"]) == 0

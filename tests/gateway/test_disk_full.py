"""A full disk (docs/store.md, "Full disk or map"): sends get ``503 unavailable``; the gateway
keeps serving; receives, acks and nacks still work; space freed by acks is reused.

The disk is a real one that fills: ``pushgate serve`` runs in its own mount namespace
(``unshare -rm``, no root needed where user namespaces are allowed) with its data
directory on a 3 MiB tmpfs. Where namespaces are not allowed, the same child runs under
``prlimit --fsize`` (a file size limit: the writes fail with EFBIG instead of ENOSPC; the
gateway must answer the same way).
"""

from __future__ import annotations

import base64
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.conftest import scaled
from tests.fixtures.small_disk import namespaces_allowed, on_small_disk

from .processes import REPO, ServeProcess

# The embedded store's own disk filling up (a cluster node's disk use: tests/cluster/test_node_storage.py).
pytestmark = pytest.mark.embedded_only

DISK_BYTES = 3 * 1024 * 1024


def serve_on_a_small_disk(data: Path) -> tuple[ServeProcess, str]:
    data.mkdir()
    serve = [sys.executable, "-m", "gateway.cli", "serve", "--data", str(data), "--port", "0"]
    if namespaces_allowed():
        args, how = [*on_small_disk(data, DISK_BYTES), *serve], "tmpfs (ENOSPC)"
    else:
        args, how = ["prlimit", f"--fsize={DISK_BYTES}", *serve], "RLIMIT_FSIZE (EFBIG)"
    return ServeProcess(args, cwd=REPO).wait_until_serving(30), how


def test_a_full_disk_refuses_sends_and_keeps_receives_and_acks(
    tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    proc, how = serve_on_a_small_disk(tmp_path / "data")
    record_property("full_disk", how)
    try:
        assert proc.key is not None
        headers = {"Authorization": f"Bearer {proc.key}"}
        with httpx.Client(base_url=proc.url, headers=headers, timeout=scaled(30)) as http:
            assert http.put("/v1/queues/big", json={"max_message_bytes": 1 << 20}).status_code == 201
            body = base64.b64encode(os.urandom(48 << 10)).decode()
            stored = 0
            for _ in range(4 * DISK_BYTES // len(body)):  # far more than fits
                r = http.post("/v1/queues/big/messages", json={"body": body})
                if r.status_code != 201:
                    break
                stored += 1
            assert r.status_code == 503, f"{how}: {r.status_code} {r.text}"
            assert r.json()["code"] == "unavailable" and "retry-after" in r.headers
            if how.startswith("tmpfs"):  # a full file system is named as such (a file size limit is not)
                assert r.json()["detail"] == "disk full", r.text
            assert stored > 0
            assert http.get("/healthz").status_code == 200

            # Receives, acks and nacks rewrite only small delivery state: they still work.
            got = http.post("/v1/queues/big/receive", json={"max": 5}).json()["messages"]
            assert len(got) == 5
            receipts = [m["receipt"] for m in got]
            assert http.post("/v1/queues/big/ack", json={"receipts": receipts[:3]}).json()["acked"] == 3
            assert http.post("/v1/queues/big/nack", json={"receipts": receipts[3:]}).json()["nacked"] == 2
            # Space the acks freed is reused: a send fits again.
            assert http.post("/v1/queues/big/messages", json={"body": "small"}).status_code == 201
            stats = http.get("/v1/queues/big").json()["stats"]
            assert stats["visible"] + stats["in_flight"] == stored - 3 + 1
    finally:
        assert proc.terminate() == -signal.SIGTERM, "".join(proc.output)


def test_the_reserve_sends_may_not_use_is_set_on_the_command_line(tmp_path: Path) -> None:
    # docs/store.md, "Full disk or map": a reserve larger than any disk (16 TiB) leaves no
    # room for a send; everything else works.
    serve = [sys.executable, "-m", "gateway.cli", "serve", "--data", str(tmp_path / "data"), "--port", "0"]
    proc = ServeProcess([*serve, "--disk-reserve-mib", str(16 << 20)], cwd=REPO).wait_until_serving(30)
    try:
        assert proc.key is not None
        headers = {"Authorization": f"Bearer {proc.key}"}
        with httpx.Client(base_url=proc.url, headers=headers, timeout=scaled(30)) as http:
            assert http.put("/v1/queues/q").status_code == 201
            r = http.post("/v1/queues/q/messages", json={"body": "small"})
            # "store is full" where the map's maximum (64 GiB) is less than the disk's room.
            assert r.status_code == 503 and r.json()["detail"] in ("disk full", "store is full"), r.text
            assert http.post("/v1/queues/q/receive", json={"wait_s": 0}).json()["messages"] == []
    finally:
        assert proc.terminate() == -signal.SIGTERM, "".join(proc.output)

"""Crash safety: what the store acknowledged survives SIGKILL, exactly once.

A child process (``crash_child.py``) sends tens of thousands of messages from concurrent
producers and logs each acknowledged id after ``send`` returned. The test kills it with
SIGKILL at a different point each run, reopens the store, receives everything, and checks
that every logged id is there once, and that no message was stored twice.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from backend_store import Lsn, StoreOptions, open_backend
from backend_store.encryption import ENV_VAR, Keyring
from backend_store.lmdb_store.engine import LmdbBackend

from ..conftest import scaled
from .crash_child import PAD, QUEUE, TENANT
from .harness import receive_all

CHILD = Path(__file__).with_name("crash_child.py")
REPO = Path(__file__).resolve().parents[2]
TOTAL = 25_000
PRODUCERS = 64


def read_acks(path: Path) -> dict[str, int]:
    """Acknowledged ``id -> index``; a torn last line (killed mid-write) is not an ack."""
    text = path.read_text(encoding="ascii") if path.exists() else ""
    lines = text.split("\n")[:-1]  # everything before the last newline
    acks: dict[str, int] = {}
    for line in lines:
        msg_id, index = line.split(" ")
        assert msg_id not in acks, f"the store returned id {msg_id} twice"
        acks[msg_id] = int(index)
    return acks


def count_lines(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


# Kill points spread over the run; every other run with bodies sealed and a replication log
# kept, as a backend node runs, so those writes are cut by the kill too.
RUNS = [(500, False), (3_000, True), (8_000, False), (14_000, True), (20_000, False)]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kill_after", "sealed_and_logged"),
    RUNS,
    ids=[f"kill-after-{n}{'-encrypted-logged' if s else ''}" for n, s in RUNS],
)
async def test_acknowledged_sends_survive_sigkill(
    tmp_path: Path, kill_after: int, sealed_and_logged: bool
) -> None:
    store_dir = tmp_path / "store"
    ack_file = tmp_path / "acks.txt"
    url = f"lmdb://{store_dir}"
    key_doc = Keyring.generate_document() if sealed_and_logged else None
    log_keep = 100_000 if sealed_and_logged else 0

    def options() -> StoreOptions:
        return StoreOptions(
            keyring=Keyring.from_json(key_doc) if key_doc else None, replication_log_keep=log_keep
        )

    store = open_backend(url, options())
    await store.start()
    await store.create_queue(TENANT, QUEUE, {})
    await store.close()

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    env.pop(ENV_VAR, None)
    if key_doc:
        env[ENV_VAR] = key_doc
    with (tmp_path / "child.log").open("wb") as log:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            str(CHILD),
            str(store_dir),
            str(ack_file),
            str(TOTAL),
            str(PRODUCERS),
            str(log_keep),
            stdout=log,
            stderr=log,
            env=env,
        )
        try:
            deadline = time.monotonic() + scaled(60)
            # Polling a file the child appends to: no event to wait on across processes.
            while count_lines(ack_file) < kill_after:
                assert child.returncode is None, f"child exited early: {(tmp_path / 'child.log').read_text()}"
                assert time.monotonic() < deadline, f"child logged only {count_lines(ack_file)} acks in time"
                await asyncio.sleep(0.005)
            child.send_signal(signal.SIGKILL)
        finally:
            if child.returncode is None:
                child.kill()
            await child.wait()
    assert child.returncode == -signal.SIGKILL

    acks = read_acks(ack_file)
    assert kill_after <= len(acks) < TOTAL, "the kill did not land mid-run"

    store = open_backend(url, options())
    await store.start()
    try:
        got = await receive_all(store, TENANT, QUEUE)
        stats = (await store.get_queue(TENANT, QUEUE)).stats
        if sealed_and_logged:
            # The log is whole up to the last committed batch: nothing torn at its end.
            assert isinstance(store, LmdbBackend)
            entries = await store.read_replication_log(Lsn(0), limit=1_000_000)
            assert [lsn for lsn, _ in entries] == list(range(1, store.last_lsn + 1))
    finally:
        await store.close()

    ids = [m.id for m in got]
    assert len(ids) == len(set(ids)), "a message was delivered twice"
    indexes = [int(m.body[:9]) for m in got]
    assert len(indexes) == len(set(indexes)), "a message was stored twice"
    assert all(m.body[9:] == PAD for m in got), "a stored body is damaged"
    by_id: dict[str, int] = {m.id: int(m.body[:9]) for m in got}
    missing = [i for i in acks if i not in by_id]
    assert not missing, f"{len(missing)} of {len(acks)} acknowledged messages lost, e.g. {missing[:3]}"
    assert all(by_id[i] == index for i, index in acks.items()), "an id came back with another body"
    # Sent but not yet acknowledged when killed: may or may not be there, but never more than sent.
    assert len(got) <= TOTAL
    assert stats.in_flight == len(got) and stats.visible == 0

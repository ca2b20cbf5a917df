"""Real ``pushgate node`` processes journal their replicas (docs/store.md, "Durability"): one
sync per commit on the leader and on each follower, counted with strace on the running
processes; and a leader SIGKILLed under sync sends comes back by replaying its journal,
having lost no acknowledged send.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backend_store.lmdb_store.checkpoint import JOURNAL_FILES
from tests.conftest import scaled
from tests.fixtures.etcd_server import unique_prefix

from .processes import ClusterHarness
from .workload import RF3_SYNC, Producers, Q, T, has_replicas, replicated_everywhere

SENDS = 60
# strace -y names each descriptor's file: fdatasync(12</tmp/.../partitions/0/journal>) = 0
_CALL = re.compile(r"\b(fdatasync|fsync|pwrite64)\((\d+)<([^>]*)>")
# A write to a descriptor opened O_DSYNC is a sync too: LMDB writes its meta page that way
# when it syncs each commit (its fdatasync is of the data pages).
_O_DSYNC = 0o10000


@pytest.fixture
async def harness(etcd_endpoints: list[str], tmp_path: Path) -> AsyncIterator[ClusterHarness]:
    h = ClusterHarness(etcd_endpoints, tmp_path, unique_prefix("journal") + "/")
    try:
        yield h
    finally:
        await h.close()


class SyncTrace:
    """strace attached to a running process: the syncs it makes, by file."""

    def __init__(self, pid: int, out: Path) -> None:
        self.pid = pid
        self.out = out
        self._err = out.with_suffix(".err")
        with self._err.open("wb") as err:
            self._strace = subprocess.Popen(
                [
                    "strace",
                    "-f",
                    "-y",
                    "-e",
                    "trace=fdatasync,fsync,pwrite64",
                    "-o",
                    str(out),
                    "-p",
                    str(pid),
                ],
                stderr=err,
                start_new_session=True,
            )
        deadline = time.monotonic() + scaled(10)
        # "Process N attached with M threads": every thread is traced from here.
        while "attached" not in self._err.read_text():
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"strace did not attach: {self._err.read_text()}")
            time.sleep(0.01)

    def stop(self) -> dict[str, int]:
        """Detach; return the number of syncs of each file (fdatasync, fsync, and writes
        to a descriptor opened O_DSYNC)."""
        os.kill(self._strace.pid, signal.SIGINT)
        self._strace.wait(timeout=scaled(10))
        syncs: dict[str, int] = {}
        dsync: dict[int, bool] = {}
        for match in _CALL.finditer(self.out.read_text()):
            call, fd, path = match.group(1), int(match.group(2)), match.group(3)
            if call == "pwrite64":
                if fd not in dsync:
                    dsync[fd] = self._opened_dsync(fd)
                if not dsync[fd]:
                    continue
            syncs[path] = syncs.get(path, 0) + 1
        return syncs

    def _opened_dsync(self, fd: int) -> bool:
        try:
            info = Path(f"/proc/{self.pid}/fdinfo/{fd}").read_text()
        except OSError:
            return False
        flags = next(int(line.split()[1], 8) for line in info.splitlines() if line.startswith("flags:"))
        return bool(flags & _O_DSYNC)


def syncs_of(syncs: dict[str, int], directory: Path) -> tuple[int, int]:
    """(syncs of the node's journal, every sync of a file of the replica in ``directory``):
    a node's replicas share one journal beside them (docs/cluster.md, section 5)."""
    journals = {str(directory.parent / name) for name in JOURNAL_FILES}
    journal = sum(n for path, n in syncs.items() if path in journals)
    others = sum(n for path, n in syncs.items() if path.startswith(str(directory) + "/"))
    return journal, others


async def test_one_sync_per_commit_on_leader_and_followers_and_a_kill_loses_nothing(
    harness: ClusterHarness, tmp_path: Path
) -> None:
    h = await harness.start(nodes=3, managers=1)
    await h.create_queue(T, Q, RF3_SYNC)
    pid = await h.partition_of(T, Q)
    await h.wait_for("three replicas", lambda: has_replicas(h, pid, 3))
    leader, _, _ = await h.serving_leader(pid)
    await h.send_until_ok(pid, T, Q, "warm-up")
    await replicated_everywhere(h, pid, list(h.nodes))

    # Idle: each send is one commit on the leader and one on each follower; each syncs once
    # (its journal), where LMDB alone synced twice (data pages, then meta page).
    traces = {}
    for name, node in h.nodes.items():
        assert node.process is not None
        traces[name] = await asyncio.to_thread(SyncTrace, node.process.pid, tmp_path / f"strace-{name}.txt")
    try:
        for i in range(SENDS):
            await h.send_until_ok(pid, T, Q, f"idle-{i}")
        await replicated_everywhere(h, pid, list(h.nodes))
    finally:
        counted = {name: await asyncio.to_thread(trace.stop) for name, trace in traces.items()}
    for name, syncs in counted.items():
        journal, others = syncs_of(syncs, h.root / name / "partitions" / str(pid))
        # The leader: a commit and a journal sync for each send (nothing acknowledged
        # unsynced), a few more for commits of its own (a heartbeat, a sweep). A follower:
        # one for each apply, which may carry two sends' entries (the other follower made
        # the quorum of the first). The LMDB file is synced by checkpoints only, about once
        # a second (three syncs each: data file, checkpoint file, directory).
        assert (SENDS if name == leader else SENDS // 2) <= journal <= SENDS + 10, (name, syncs)
        assert others <= SENDS // 4, (name, syncs)

    # SIGKILL the leader under sync sends: it restarts on its data, replays its journal, and
    # nothing acknowledged is lost anywhere.
    producers = Producers(h, pid)
    producers.start()
    await producers.more(30, "sends before the kill")
    h.nodes[leader].kill()
    await h.serving_leader(pid, not_node=leader)
    await producers.more(20, "sends after the failover")
    await producers.stop()
    h.nodes[leader].start()
    await replicated_everywhere(h, pid, list(h.nodes))
    producers.check(await h.read_queue(pid, T, Q))
    assert "replayed after an unclean stop" in h.nodes[leader].log_path.read_text()

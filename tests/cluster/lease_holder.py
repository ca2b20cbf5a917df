"""A child process that wins a campaign and holds it: the stand-in for a partition leader
that tests kill (SIGKILL) or freeze (SIGSTOP) to see its lease expire.

Usage: ``python -m tests.cluster.lease_holder ENDPOINTS KEY``. Prints ``epoch N`` once it
holds ``KEY``; when its session is lost it prints ``lost`` and then ``fenced_commit
True|False`` for a commit fenced on its old epoch, and exits.
"""

from __future__ import annotations

import asyncio
import sys
import time

from backend_store.cluster.coordination.coordinator import Claim, Coordinator, CoordinatorUnavailable, Session
from backend_store.cluster.coordination.etcd_coordinator import EtcdCoordinator
from tests.conftest import scaled


async def claim_key(coordinator: Coordinator, key: str) -> tuple[Session, Claim]:
    """Open a 2 s session and campaign, retrying while etcd does not answer in time (a busy
    machine can starve a call past its deadline; a real leader retries too)."""
    deadline = time.monotonic() + scaled(15)
    while True:
        try:
            session = await coordinator.open_session(2.0)
            return session, await coordinator.campaign(session, key, b"holder")
        except CoordinatorUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def main(endpoints: str, key: str) -> None:
    async with EtcdCoordinator(endpoints, timeout_s=scaled(2.0)) as coordinator:
        session, claim = await claim_key(coordinator, key)
        print(f"epoch {claim.epoch}" if claim.won else "lost the campaign", flush=True)
        if not claim.won:
            return
        await session.lost.wait()
        print("lost", flush=True)
        ok = await coordinator.fenced_commit(
            key, claim.epoch, {key + "/written-by-old-holder": b"x"}, holder=claim.holder
        )
        print(f"fenced_commit {ok}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))

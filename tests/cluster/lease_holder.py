"""A child process that wins a campaign and holds it: the stand-in for a partition leader
that tests kill (SIGKILL) or freeze (SIGSTOP) to see its lease expire.

Usage: ``python -m tests.cluster.lease_holder ENDPOINTS KEY``. Prints ``epoch N`` once it
holds ``KEY``; when its session is lost it prints ``lost`` and then ``fenced_commit
True|False`` for a commit fenced on its old epoch, and exits.
"""

from __future__ import annotations

import asyncio
import sys

from backend_store.cluster.etcd_coordinator import EtcdCoordinator


async def main(endpoints: str, key: str) -> None:
    async with EtcdCoordinator(endpoints) as coordinator:
        session = await coordinator.open_session(2.0)
        claim = await coordinator.campaign(session, key, b"holder")
        print(f"epoch {claim.epoch}" if claim.won else "lost the campaign", flush=True)
        if not claim.won:
            return
        await session.lost.wait()
        print("lost", flush=True)
        ok = await coordinator.fenced_commit(key, claim.epoch, {key + "/written-by-old-holder": b"x"})
        print(f"fenced_commit {ok}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))

"""Hold a store's LMDB write lock from another process, as a long write by ``pushgate admin``
would: every commit of the gateway waits until it is let go. A real way to make the store
slow for as long as a test needs, without touching the gateway's code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import TracebackType

from tests.conftest import scaled

_HOLDER = """
import sys, lmdb
env = lmdb.open(sys.argv[1], max_dbs=64, lock=True)
txn = env.begin(write=True)
print("held", flush=True)
sys.stdin.readline()
txn.abort()
env.close()
"""


class StoreWriteLock:
    """``with StoreWriteLock(data_dir / "store"):`` the gateway's writer is blocked inside."""

    def __init__(self, store_dir: Path) -> None:
        self.store_dir = store_dir
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> StoreWriteLock:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(self.store_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.strip() == "held", f"the lock holder did not start: {line!r}"
        return self

    def release(self) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        assert proc.stdin is not None
        try:
            proc.stdin.write("\n")
            proc.stdin.close()
            proc.wait(scaled(10))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

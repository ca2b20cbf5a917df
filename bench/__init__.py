"""Benchmarks: scripts run from a checkout (``python bench/<name>.py``); see bench/README.md.

Every benchmark imports this package, and most start servers they stop in ``finally``
blocks, by PID or process group. Python runs those blocks on Ctrl-C (SIGINT), not on
SIGTERM, which is what ``timeout`` and CI runners send: a benchmark ended that way left
its servers running (a whole ``pushgate dev-cluster`` of seven processes, a fifth of a core
idle), under the next benchmark's figures. So SIGTERM ends a benchmark as Ctrl-C does.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


if (
    threading.current_thread() is threading.main_thread()
    and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
):
    signal.signal(signal.SIGTERM, _interrupt)

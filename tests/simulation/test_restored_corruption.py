"""The simulation's seed that found a partition record no manager could repair: it holds.

``etcd`` seed 6980 (session 31's sweep of seeds 6000-7199): etcd is restored three times and
partition 3's record is corrupted between the second backup and the third restore. The second
restore held no map at all, so the managers' views emptied; the third brought back the
corrupted record, which every manager then took for one it "never read", so none wrote it
again, every node kept p3 as a stray, and a FIFO group took no send after healing
(``available-after-heal``). A manager now repairs such a record from the last one it read,
whenever that was (``manager/manager.py``: ``_ever_read``).
"""

from __future__ import annotations

from .simulation import config_for, run_seed

MIX, SEED = "etcd", 6980


def test_a_corrupted_record_brought_back_by_a_restore_is_repaired() -> None:
    result = run_seed(config_for(SEED, MIX))
    assert result.ok, (
        f"{result.summary()}\nreplay: scripts/simulate --seed {SEED} --faults {MIX}\n{result.trace_text(40)}"
    )
    assert result.acked > 0

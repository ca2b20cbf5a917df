"""The deterministic simulation in CI: seeds that must hold, the known failures, exact replay.

docs/testing.md ("Simulation") says what is simulated and how to run thousands of seeds
(``scripts/simulate``). Here:

- every seed of ``CI_SEEDS`` outside ``KNOWN_DEFECT_SEEDS`` holds every invariant (among
  them the seeds that found issue 24's defects 1, 2, 3, 4, 6 and 7 on main at 1628f52);
- each seed of ``KNOWN_DEFECT_SEEDS`` still breaks its invariant (when a fix makes one
  hold, this fails on purpose: move it out of the table, into CI);
- a seed replays exactly, also in another process with another ``PYTHONHASHSEED``: the
  production ``Node`` and ``PartitionHost`` every run drives (issue 49) leave nothing to
  chance either (no set iterated in an order of addresses, no thread, no wall clock;
  node_serving.py keeps its tasks in a dict).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .faults import Forced, scripted
from .seeds import CI_SEEDS, KNOWN_DEFECT_SEEDS
from .simulation import Config, config_for, run_seed

REPO = Path(__file__).resolve().parents[2]

HOLDING = [
    (mix, seed) for mix, seeds in CI_SEEDS.items() for seed in seeds if (mix, seed) not in KNOWN_DEFECT_SEEDS
]
KNOWN = sorted(KNOWN_DEFECT_SEEDS)

# The seed that found defect 1 on 1628f52 (an etcd wiped and started again): a run through
# identity's refusal, the restore and the heal, replayed (it holds since session 29).
REPLAYED = ("etcd", 4)


@pytest.mark.parametrize(("mix", "seed"), HOLDING, ids=[f"{m}-{s}" for m, s in HOLDING])
def test_seed_holds_every_invariant(mix: str, seed: int) -> None:
    result = run_seed(config_for(seed, mix))
    assert result.ok, result.report()
    assert result.acked > 0, "a run that acknowledged nothing tested nothing"


if KNOWN:  # defined only while the table lists a seed (an empty parameter set is a skip)

    @pytest.mark.parametrize(("mix", "seed"), KNOWN, ids=[f"{m}-{s}" for m, s in KNOWN])
    def test_a_known_defect_seed_still_fails(mix: str, seed: int) -> None:
        """Today's code: the seed breaks the invariant the table names (fixed: move it to CI)."""
        invariant, shows = KNOWN_DEFECT_SEEDS[(mix, seed)]
        result = run_seed(config_for(seed, mix))
        assert result.violation is not None, (
            f"seed {seed} ({mix}) holds now ({shows}): if that was fixed, remove it from"
            f" KNOWN_DEFECT_SEEDS (tests/simulation/seeds.py)\n{result.summary()}"
        )
        assert result.violation.invariant == invariant, result.report()


def test_the_seeds_that_found_issue_24s_defects_run_in_ci() -> None:
    """The finders of 1628f52 and of session 29 (docs/testing.md) are ordinary CI seeds now:
    each must hold."""
    finders = [("etcd", 4), ("ops", 1), ("process", 11), ("disk", 2), ("restore", 1), ("minority", 18)]
    finders += [("etcd", 3), ("all", 13), ("all", 27)]
    assert [f for f in finders if f not in HOLDING] == []


def test_a_seed_replays_exactly() -> None:
    mix, seed = REPLAYED
    first, second = run_seed(config_for(seed, mix)), run_seed(config_for(seed, mix))
    assert (first.digest, first.events) == (second.digest, second.events)
    assert first.trace == second.trace
    assert first.violation == second.violation


# A pools seed too: its nodes apply queue records by partition, from sets of etcd keys
# (session 59: their order came from the hash seed until the partitions were sorted).
@pytest.mark.parametrize(("mix", "seed"), [HOLDING[0], ("pools", 3)])
def test_a_seed_replays_in_another_process_whatever_the_hash_seed(mix: str, seed: int) -> None:
    here = run_seed(config_for(seed, mix))
    code = (
        "from tests.simulation.simulation import config_for, run_seed;"
        f"print(run_seed(config_for({seed}, {mix!r})).digest)"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == here.digest


def test_a_forced_fault_starts_on_its_target_at_its_time_for_its_while() -> None:
    """A scripted race (``faults.Forced``): the fault starts on the node the map designates
    for the partition at the time asked, lasts the time asked, and replays exactly."""
    forced = (Forced(2.0, "cut-peers", "leader:1", 5.0),)
    config = Config(seed=0, mix=scripted("forced", forced), trace_keep=100_000)
    result = run_seed(config)
    assert result.ok, result.report()
    chaos = [(at, text) for at, who, text in result.trace if who == "chaos"]
    started = [(at, text) for at, text in chaos if text.startswith("fault cut-peers on ")]
    assert len(started) == 1, chaos
    at, text = started[0]
    node = text.removeprefix("fault cut-peers on ")
    assert [a for a, t in chaos if t == f"healed {node}"] == [pytest.approx(at + 5.0)], chaos
    led = [t for _, who, t in result.trace if who == node and t.startswith("partition 1: leading")]
    assert led, f"{node} never led p1 before it was cut off"
    assert run_seed(config).digest == result.digest

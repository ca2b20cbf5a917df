"""Issue 25's targets, each figure against its bound, as one table (``peer_compare.py --targets``).

``peer_compare.py`` measures the peer comparison itself (max rate and paced 2,000 msg/s,
both frame kinds, both consumers, and with ``--cluster`` the cluster against the embedded
store and NATS JetStream R3); ``--targets`` then runs ``push_latency.py`` (one message at a
time through one gateway and through a second one) and ``throttle_bench.py`` parts 0 and 1
(what a limit check and limits set on a gateway cost) for as many rounds, and this module
prints every target with each round's figure, the median, and whether the median meets it.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
# The consumer kinds of peer_compare.py (--acks).
ACKS = {"frame": "acks every frame", "half": "acks every 50"}


@dataclass(frozen=True)
class Target:
    """One bound of the issue and the figures measured for it, one per round."""

    name: str
    bound: float
    at_least: bool  # True: the figure must reach the bound; False: stay at or under it
    unit: str
    values: Sequence[float]

    @property
    def met(self) -> bool:
        median = statistics.median(self.values)
        return median >= self.bound if self.at_least else median <= self.bound


def ratios(results: dict[str, dict[str, Any]], phase_name: str, mode: str) -> tuple[float, float]:
    """(throughput, server CPU per message) of a Pushgate case as ratios to Redis's."""
    base, r = results[f"redis {phase_name}"], results[f"pushgate {mode} {phase_name}"]
    return r["msg_per_s"] / base["msg_per_s"], r["cpu_us_per_msg"] / max(base["cpu_us_per_msg"], 1e-9)


def cluster_ratios(results: dict[str, dict[str, Any]], mode: str) -> tuple[float, float] | None:
    """(throughput against the embedded store's, against NATS JetStream R3's) of the cluster."""
    if f"cluster {mode} max" not in results:
        return None
    r = results[f"cluster {mode} max"]["msg_per_s"]
    return r / results[f"pushgate {mode} max"]["msg_per_s"], r / results["nats max"]["msg_per_s"]


def peer_targets(
    rounds: Sequence[dict[str, dict[str, Any]]], phases: Sequence[str], modes: Sequence[str]
) -> list[Target]:
    """The targets of peer_compare.py's own rounds (ratios to Redis of the same round)."""
    targets: list[Target] = []
    for acks, consumer in ACKS.items():
        kind = [r for r in rounds if r[""]["acks"] == acks]
        if not kind:
            continue
        for mode in modes:
            single = mode == "frame per message"
            for phase in phases:
                each = [ratios(r, phase, mode) for r in kind]
                cpu = [c for _, c in each]
                case = f"{phase}, {mode}, {consumer}"
                if phase == "max":
                    throughput = [t for t, _ in each]
                    targets.append(
                        Target(f"{case}: throughput vs Redis", 1.0 if single else 1.3, True, "x", throughput)
                    )
                    targets.append(
                        Target(f"{case}: server CPU/msg vs Redis", 2.0 if single else 1.5, False, "x", cpu)
                    )
                else:
                    paced = [r[f"pushgate {mode} paced"] for r in kind]
                    targets.append(Target(f"{case}: p50", 2.0, False, " ms", [p["p50_ms"] for p in paced]))
                    targets.append(Target(f"{case}: p99", 5.0, False, " ms", [p["p99_ms"] for p in paced]))
                    targets.append(Target(f"{case}: server CPU/msg vs Redis", 1.5, False, "x", cpu))
            clustered = [pair for r in kind if (pair := cluster_ratios(r, mode)) is not None]
            if clustered:
                case = f"cluster RF 3, {mode}, {consumer}"
                targets.append(
                    Target(f"{case}: vs the embedded store", 0.8, True, "x", [e for e, _ in clustered])
                )
                targets.append(
                    Target(f"{case}: vs NATS JetStream R3", 1.0, True, "x", [n for _, n in clustered])
                )
    return targets


def latency_and_limit_targets(rounds: int) -> list[Target]:
    """Run push_latency.py and throttle_bench.py (parts 0 and 1) for ``rounds`` rounds each."""
    with tempfile.TemporaryDirectory(prefix="pushgate-targets-") as tmp:
        latency_file, limits_file = Path(tmp) / "latency.json", Path(tmp) / "limits.json"
        for script, out, extra in (
            ("push_latency.py", latency_file, []),
            ("throttle_bench.py", limits_file, ["--parts", "0,1"]),
        ):
            # Their own reports go to stderr here: stdout stays this run's table.
            subprocess.run(
                [sys.executable, str(BENCH / script), "--rounds", str(rounds), "--json", str(out), *extra],
                check=True,
                stdout=sys.stderr,
            )
        latency = json.loads(latency_file.read_text())
        limits = json.loads(limits_file.read_text())
    ratio = limits["cpu_ratio"]
    return [
        Target("one message at a time, one gateway: p50", 1.5, False, " ms", latency["one_p50_ms"]),
        Target(
            "one message at a time, second gateway: p50 over one gateway's",
            0.5,
            False,
            " ms",
            latency["extra_p50_ms"],
        ),
        Target(
            "limit check, three rules, in memory", 5.0, False, " us", limits["check_3_rules_us"]["memory"]
        ),
        Target(
            "limits set, empty receives, in memory: share of the rate without",
            0.95,
            True,
            "",
            ratio["poll none +limits"],
        ),
        Target(
            "limits set, sends, in memory: share of the rate without",
            0.95,
            True,
            "",
            ratio["send none +limits"],
        ),
        Target(
            "limits set, empty receives, Redis: share of the rate without",
            0.85,
            True,
            "",
            ratio["poll redis none +limits"],
        ),
        Target(
            "limits set, sends, Redis: share of the rate without",
            0.85,
            True,
            "",
            ratio["send redis none +limits"],
        ),
    ]


def print_targets(targets: Sequence[Target]) -> None:
    print("\nissue 25's targets: each round's figure, the median, and whether the median meets the bound")
    for t in targets:
        sign = ">=" if t.at_least else "<="
        rounds = ", ".join(f"{v:.2f}" for v in t.values)
        verdict = "met" if t.met else "NOT MET"
        print(
            f"  {t.name:<70} {sign} {t.bound:g}{t.unit}: median {statistics.median(t.values):.2f}{t.unit} ({rounds})  {verdict}"
        )
    met = sum(t.met for t in targets)
    print(f"  {met} of {len(targets)} met")

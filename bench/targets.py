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


def peer_targets(
    rounds: Sequence[dict[str, dict[str, Any]]], phases: Sequence[str], modes: Sequence[str]
) -> list[Target]:
    """The targets of peer_compare.py's own rounds (ratios to Redis of the same round)."""
    targets: list[Target] = []
    kinds = sorted({r[""]["acks"] for r in rounds})
    for acks in kinds:
        kind = [r for r in rounds if r[""]["acks"] == acks]
        consumer = "acks every frame" if acks == "frame" else "acks every 50"
        for mode in modes:
            single = mode == "frame per message"
            if "max" in phases:
                throughput = [
                    r[f"pushgate {mode} max"]["msg_per_s"] / r["redis max"]["msg_per_s"] for r in kind
                ]
                cpu = [_cpu_ratio(r, mode, "max") for r in kind]
                targets.append(
                    Target(
                        f"max, {mode}, {consumer}: throughput vs Redis",
                        1.0 if single else 1.3,
                        True,
                        "x",
                        throughput,
                    )
                )
                targets.append(
                    Target(
                        f"max, {mode}, {consumer}: server CPU/msg vs Redis",
                        2.0 if single else 1.5,
                        False,
                        "x",
                        cpu,
                    )
                )
            if "paced" in phases:
                paced = [r[f"pushgate {mode} paced"] for r in kind]
                targets.append(
                    Target(f"paced, {mode}, {consumer}: p50", 2.0, False, " ms", [p["p50_ms"] for p in paced])
                )
                targets.append(
                    Target(f"paced, {mode}, {consumer}: p99", 5.0, False, " ms", [p["p99_ms"] for p in paced])
                )
                targets.append(
                    Target(
                        f"paced, {mode}, {consumer}: server CPU/msg vs Redis",
                        1.5,
                        False,
                        "x",
                        [_cpu_ratio(r, mode, "paced") for r in kind],
                    )
                )
            clustered = [r for r in kind if f"cluster {mode} max" in r]
            if clustered:
                cluster = [r[f"cluster {mode} max"]["msg_per_s"] for r in clustered]
                embedded = [r[f"pushgate {mode} max"]["msg_per_s"] for r in clustered]
                nats = [r["nats max"]["msg_per_s"] for r in clustered]
                targets.append(
                    Target(
                        f"cluster RF 3, {mode}, {consumer}: vs the embedded store",
                        0.8,
                        True,
                        "x",
                        [c / e for c, e in zip(cluster, embedded, strict=True)],
                    )
                )
                targets.append(
                    Target(
                        f"cluster RF 3, {mode}, {consumer}: vs NATS JetStream R3",
                        1.0,
                        True,
                        "x",
                        [c / n for c, n in zip(cluster, nats, strict=True)],
                    )
                )
    return targets


def _cpu_ratio(results: dict[str, dict[str, Any]], mode: str, phase: str) -> float:
    base = float(results[f"redis {phase}"]["cpu_us_per_msg"])
    return float(results[f"pushgate {mode} {phase}"]["cpu_us_per_msg"]) / max(base, 1e-9)


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

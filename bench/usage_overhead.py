"""The gateway's cost of recording usage: the same load with usage on and off, one run.

Run: ``python bench/usage_overhead.py [--rounds 3] [--seconds 3]``

Two ``pushgate serve`` processes on this machine, identical but for usage recording:
``on`` (the default, flushing every 10 s) and ``off`` (``PUSHGATE_USAGE_FLUSH_INTERVAL_S=0``:
the observe point feeds the Prometheus message counts only). Only one is under load at a time; the phases alternate
on/off ``--rounds`` times so drift on a shared machine hits both alike. Per phase:

- ``http send``: ``POST /v1/queues/bench/messages`` of 1 KiB bodies on 64 keep-alive
  connections (``bench/http_bench.py``'s load generator, another process); each 201 is a
  usage observation (and an fsynced message);
- ``ws e2e``: ``bench/push_e2e.py``'s max phase: a WebSocket producer, a consumer
  pushed to with prefetch 100 acking every 20: observations of sends, pushes (one latency
  per message) and acks.

First, in this process, the recording code alone (``push/observed.py`` into the observe
point with both sinks, with the metrics sink only, and with no sink): microseconds per send request, per pushed message
(batches of 10) and per acked receipt, to set against the gateway's CPU per message.

Printed: the median over rounds of messages/s and of the gateway's CPU per message, and
on/off ratios (1.00 = recording costs nothing measurable; the run-to-run spread here is
several percent, so read ratios within ~5% of 1 as noise).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.http_bench import _load
from bench.push_common import cpu_seconds, create_queue, machine, start_gateway, stop
from bench.push_e2e import run_phase


def _http_send(url: str, key: str, pid: int, seconds: float) -> tuple[float, float]:
    create_queue(url, key, "bench")  # the queue http_bench.py's load sends to
    before = cpu_seconds(pid)
    result = _load(url, key, "send", seconds, 64, 1024)
    cpu = cpu_seconds(pid) - before
    return result["msg_per_s"], cpu / max(result["messages"], 1) * 1e6


def _ws_e2e(url: str, key: str, pid: int, seconds: float, round_no: int) -> tuple[float, float]:
    args = argparse.Namespace(seconds=seconds, size=1024, prefetch=100, window=256, producer="ws")
    result = run_phase(url, key, args, f"r{round_no}", None, pid)
    return result["msg_per_s"], result["gateway_cpu_us_per_msg"]


def micro() -> None:
    import time
    import timeit

    from backend_store.types import (
        AckResult,
        MessageId,
        NewMessage,
        QueueName,
        Receipt,
        ReceivedMessage,
        SendResult,
    )
    from gateway.metrics_messages import MessageCounts
    from gateway.usage.aggregator import UsageAggregator
    from push.observed import record_delivered, record_sends, record_settled
    from push.observer import Observers

    now = time.time()
    message, result = NewMessage(b"x" * 1024), SendResult(MessageId("id"), 1)
    batch = [
        ReceivedMessage(
            QueueName("q"),
            MessageId("id"),
            i,
            Receipt(f"r{i}"),
            b"x" * 1024,
            True,
            {},
            None,
            now,
            1,
            now + 30,
        )
        for i in range(10)
    ]
    receipts = [f"r{i}" for i in range(10)]
    queue_of = dict.fromkeys(receipts, "q")
    acked = AckResult(10)
    n = 100_000
    print("recording code alone, us:")
    sinks = (
        ("usage+metrics", Observers([MessageCounts(), UsageAggregator()])),
        ("metrics", Observers([MessageCounts()])),
        ("no sink", Observers()),
    )
    for name, observer in sinks:
        send = timeit.timeit(
            functools.partial(record_sends, observer, "t", "q", "http", [message], [result], 0.001), number=n
        )
        push = timeit.timeit(
            functools.partial(record_delivered, observer, "t", "q", "ws", batch, now), number=n // 10
        )
        ack = timeit.timeit(
            functools.partial(record_settled, observer, "t", "ack", "ws", receipts, queue_of, acked),
            number=n // 10,
        )
        print(
            f"  {name:<14} send {send / n * 1e6:.2f}/request, push {push / n * 1e6:.2f}/message, "
            f"ack {ack / n * 1e6:.2f}/receipt"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    print(machine(), f"load average {os.getloadavg()[0]:.1f}")
    micro()
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="pushgate-usage-") as tmp:
        gateways: dict[str, Any] = {}
        for name, interval in (("on", "10"), ("off", "0")):
            os.environ["PUSHGATE_USAGE_FLUSH_INTERVAL_S"] = interval
            gateways[name] = start_gateway(Path(tmp) / name)
        os.environ.pop("PUSHGATE_USAGE_FLUSH_INTERVAL_S")
        try:
            for round_no in range(args.rounds):
                for name in ("on", "off") if round_no % 2 == 0 else ("off", "on"):
                    proc, url, key = gateways[name]
                    results.setdefault(("http send", name), []).append(
                        _http_send(url, key, proc.pid, args.seconds)
                    )
                    results.setdefault(("ws e2e", name), []).append(
                        _ws_e2e(url, key, proc.pid, args.seconds, round_no)
                    )
        finally:
            for proc, _, _ in gateways.values():
                stop(proc)
        usage_files = list((Path(tmp) / "on" / "usage").rglob("*.parquet"))
    print(
        f"\n{args.rounds} rounds of {args.seconds:g} s per phase; medians; usage files written (on): {len(usage_files)}"
    )
    print(
        f"{'load':<10} {'on msg/s':>9} {'off msg/s':>10} {'ratio':>6} {'on CPU/msg':>11} {'off CPU/msg':>12} {'ratio':>6}"
    )
    for load in ("http send", "ws e2e"):
        on = results[(load, "on")]
        off = results[(load, "off")]
        rate_on, rate_off = statistics.median(r for r, _ in on), statistics.median(r for r, _ in off)
        cpu_on, cpu_off = statistics.median(c for _, c in on), statistics.median(c for _, c in off)
        print(
            f"{load:<10} {rate_on:>9.0f} {rate_off:>10.0f} {rate_on / rate_off:>6.2f} "
            f"{cpu_on:>9.0f}us {cpu_off:>10.0f}us {cpu_on / cpu_off:>6.2f}"
        )


if __name__ == "__main__":
    main()

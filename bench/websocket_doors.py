"""What the WebSocket fast path buys over the public doors an untested release runs on.

Run: ``python bench/websocket_doors.py [--messages 20000] [--rounds 3]``

Two ``pushgate serve`` processes, embedded store: one as installed (uvicorn and
``websockets`` at the tested releases: the fast path, gateway/ws_server_protocol.py), one
told it runs an untested uvicorn (a ``.dist-info`` that says 0.99.0 first on its
``PYTHONPATH``; the code is the same), which serves uvicorn's public ``websockets-sansio``
protocol through the same push handler (gateway/ws_protocol.py, docs/http.md). Each round
runs ``peer_compare.py``'s producer and consumer at full rate against each gateway in turn
(``--messages`` of 1 KiB, acking every frame), a frame per message and batch frames, and
prints the gateway's CPU per message and the rate. Rounds alternate the gateways so a
shared machine's load falls on both alike; quote the range over the rounds.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.peer_compare import MODES, phase
from bench.push_common import create_queue, machine, start_gateway, stop

UNTESTED_UVICORN = "0.99.0"


def untested_uvicorn(root: Path) -> dict[str, str]:
    """The environment of a gateway that finds uvicorn 0.99.0's metadata first."""
    info = root / f"uvicorn-{UNTESTED_UVICORN}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: uvicorn\nVersion: {UNTESTED_UVICORN}\n")
    return {"PYTHONPATH": str(root)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory(prefix="pushgate-doors-") as tmp:
        gateways = {
            "fast path": start_gateway(Path(tmp) / "fast"),
            "public doors": start_gateway(Path(tmp) / "public", env=untested_uvicorn(Path(tmp) / "site")),
        }
        try:
            for round_no in range(args.rounds):
                order = list(gateways) if round_no % 2 == 0 else list(reversed(gateways))
                for mode, batch in MODES.values():
                    for door in order:
                        proc, url, key = gateways[door]
                        queue = f"doors-{round_no}-{batch}-{door.replace(' ', '-')}"
                        create_queue(url, key, queue)
                        total = str(args.messages)
                        result = phase(
                            ["_pg_consume", url, key, queue, total, str(batch), "frame"],
                            ["_pg_produce", url, key, queue, total, str(args.size), "0", str(batch)],
                            [proc.pid],
                            args.messages,
                        )
                        print(
                            f"round {round_no + 1} {mode:17} {door:12} "
                            f"gateway CPU {result['cpu_us_per_msg']:6.1f} us/msg, "
                            f"{result['msg_per_s']:8.0f} msg/s",
                            flush=True,
                        )
        finally:
            for proc, _, _ in gateways.values():
                stop(proc)


if __name__ == "__main__":
    main()

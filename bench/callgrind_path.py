"""Instructions per message on the message path's plain computation, counted by callgrind.

Run: ``python bench/callgrind_path.py [--part store|push|both] [--messages 2000,4000]``

Counts instructions (valgrind's callgrind, so the figure does not move with the machine's
load, unlike CPU time on a shared machine) of two in-process drivers, each run twice with a
different number of messages; the difference of the two counts over the difference of the
messages is the cost of one message, without the interpreter's start and the imports:

- ``store``: the embedded store as the gateway uses it (``open_backend``, a journaling store
  on ``/dev/shm`` when there is one, so its syncs cost next to nothing and are not counted
  anyway): per round, one send of ``--batch`` messages, a receive of them held in memory (as
  a push subscription's are) and one ack of their receipts;
- ``push``: a frame per message through the WebSocket fast path's codec and ``pushgate.v1``:
  the producer's masked ``send`` frames cut and unmasked (``gateway.ws_frames``), parsed
  (``push.ws_protocol``, ``push.messages``), their ``ok`` replies and the consumer's
  ``message`` frames encoded with their headers, and its ``ack`` frames parsed.

Whichever build is in place is measured: run it before and after ``scripts/build-compiled``
(bench/README.md, "Compiling the message path"). ``--run PART N`` is one driver run (what
valgrind runs).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from backend_store import NewMessage, QueueName, StoreOptions, TenantId, open_backend  # noqa: E402
from backend_store.types import MessageId, ReceivedMessage, SendResult  # noqa: E402
from bench.push_common import machine  # noqa: E402
from gateway.auth.principal import Principal  # noqa: E402
from gateway.ws_frames import FrameSplitter, text_frame_header, unmask  # noqa: E402
from gateway.ws_websockets_internals import apply_mask  # noqa: E402
from push.messages import encode_message  # noqa: E402
from push.settings import PushSettings  # noqa: E402
from push.ws_protocol import AckRequest, SendRequest, WsProtocol, delivery_encoder  # noqa: E402

TENANT = TenantId("bench")
QUEUE = QueueName("bench")
BATCH = 50
BODY = b'{"order":12345,"item":"a small JSON body of about a hundred bytes","qty":3}'


async def store_run(messages: int, directory: str) -> None:
    store = open_backend(f"lmdb://{directory}/store", StoreOptions(map_size=1 << 28, journal=True))
    await store.start()
    try:
        await store.create_queue(TENANT, QUEUE, {})
        batch = [NewMessage(body=BODY) for _ in range(BATCH)]
        for _ in range(messages // BATCH):
            await store.send(TENANT, QUEUE, batch)
            # The embedded store's receive for push subscriptions (not on the Backend protocol).
            got = await store.receive_in_memory(TENANT, QUEUE, BATCH, 30)  # type: ignore[attr-defined]
            result = await store.ack(TENANT, [m.receipt for m in got])
            if len(got) != BATCH or result.failed:
                raise SystemExit(f"received {len(got)} of {BATCH}, ack failed: {result.failed}")
    finally:
        await store.close()


def client_frame(payload: bytes) -> bytes:
    """A client text frame (masked, as a browser sends it)."""
    mask = b"\x1f\x2e\x3d\x4c"
    masked = apply_mask(payload, mask)
    n = len(payload)
    length = bytes((0x80 | n,)) if n < 126 else bytes((0x80 | 126,)) + n.to_bytes(2, "big")
    return b"\x81" + length + mask + masked


def push_run(messages: int) -> None:
    producer, consumer = WsProtocol(PushSettings()), WsProtocol(PushSettings())
    principal = Principal(TENANT, frozenset({"send:*", "receive:*"}), "bench")
    producer.authenticated(principal)
    consumer.authenticated(principal)
    body = orjson.dumps(BODY.decode())
    # What the clients send, made before the count starts to matter (their cost is per run).
    sends = [
        client_frame(b'{"op":"send","id":%d,"queue":"bench","body":%s}' % (i, body)) for i in range(messages)
    ]
    receipts = [f"AAAAAAAAAAEAAAAAAAAA{i:08d}cmVjZWlwdA" for i in range(messages)]
    acks = [client_frame(b'{"op":"ack","receipts":["%s"]}' % r.encode()) for r in receipts]
    encode = delivery_encoder("bench")
    producer_in, consumer_in = FrameSplitter(1 << 20), FrameSplitter(1 << 20)
    out: list[bytes] = []
    # Producer: several frames a read, as the gateway sees them (3.5-5.4 frames a read).
    for start in range(0, messages, 4):
        data, spans = producer_in.cut(b"".join(sends[start : start + 4]))
        requests = [producer.receive_text(unmask(data, mask_at, end).decode()) for _, mask_at, end in spans]
        ids = []
        for request in requests:
            if not isinstance(request, SendRequest):
                raise SystemExit(f"not a send: {request}")
            ids.append(request.id)
        producer.sent_many(ids, [_sent(i) for i in range(len(ids))])
        for frame in producer.data_to_send():
            out.append(text_frame_header(len(frame)))
            out.append(frame)
    # Consumer: a message frame per delivery, an ack frame per message.
    for start in range(0, messages, 4):
        payloads = [encode_message(_delivery(receipts[i])) for i in range(start, min(start + 4, messages))]
        for frame in encode(payloads, len(payloads)):
            out.append(text_frame_header(len(frame)))
            out.append(frame)
        data, spans = consumer_in.cut(b"".join(acks[start : start + 4]))
        for _, mask_at, end in spans:
            if not isinstance(consumer.receive_text(unmask(data, mask_at, end).decode()), AckRequest):
                raise SystemExit("not an ack")
    if len(out) != 4 * messages:
        raise SystemExit(f"{len(out)} frames out for {messages} messages")


def _sent(i: int) -> SendResult:
    return SendResult(id=MessageId(f"m{i}"), seq=i, duplicate=False)


def _delivery(receipt: str) -> ReceivedMessage:
    return ReceivedMessage(QUEUE, "m1", 1, receipt, BODY, True, {}, None, 1.0, 1, 31.0)  # type: ignore[arg-type]


def instructions(part: str, messages: int) -> int:
    """Instructions of one driver run under callgrind."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                sys.executable,
                __file__,
                "--run",
                part,
                str(messages),
            ],
            check=True,
            capture_output=True,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        )
        found = re.search(r"^summary:\s+(\d+)", out.read_text(), re.M)
        if found is None:
            raise SystemExit("no summary in callgrind's output")
        return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", choices=["store", "push", "both"], default="both")
    parser.add_argument("--messages", default="1000,3000", help="the two runs' message counts")
    parser.add_argument("--run", nargs=2, metavar=("PART", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        part, n = args.run[0], int(args.run[1])
        if part == "store":
            shm = Path("/dev/shm")
            with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as tmp:
                asyncio.run(store_run(n, tmp))
        else:
            push_run(n)
        return
    low, high = (int(n) for n in args.messages.split(","))
    print(machine())
    print(f"compiled build: {_compiled()}")
    for part in ["store", "push"] if args.part == "both" else [args.part]:
        a, b = instructions(part, low), instructions(part, high)
        print(f"{part}: {(b - a) / (high - low):,.0f} instructions per message ({low} and {high} messages)")


def _compiled() -> str:
    import importlib

    names = [line.strip() for line in (REPO / "scripts" / "compiled-modules.txt").read_text().splitlines()]
    modules = [n for n in names if n and not n.startswith("#")]
    done = [n for n in modules if (importlib.import_module(n).__file__ or "").endswith(".so")]
    return ", ".join(done) or "none (pure Python)"


if __name__ == "__main__":
    main()

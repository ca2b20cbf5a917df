"""What mutual TLS adds to moving node-protocol bytes: CPU per message, TLS against plaintext.

One process, one loopback connection through ``serve_node_protocol`` (the node's listener)
and ``asyncio.open_connection`` (as ``NodeClient`` and leader links dial), certificates made
for the run (``tls_certs.py``). The client writes ``--messages`` messages of ``--size`` bytes
in writes of ``--batch`` messages (as ``NodeStream`` flushes many frames in one write); the
server reads them all. Both ends run in this process, so the CPU time per message covers
encrypting and decrypting it, plus asyncio's SSL protocol (Python code in 3.11) on both
sides. Rounds alternate plaintext and TLS, so both see the same machine; compare the two
columns of one run, and the difference with the nodes' CPU per send that
``cluster_bench.py`` prints (each sync send crosses about six node-protocol messages: the
request, two shipments, two acknowledgements, the reply).

    .venv/bin/python bench/tls_bench.py --messages 200000 --size 1024 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend_store.cluster.protocol.tls import NodeTls, serve_node_protocol
from backend_store.cluster.protocol.tls_certs import make_cluster_certificates


async def one_round(
    server_tls: ssl.SSLContext | None, client_tls: ssl.SSLContext | None, messages: int, size: int, batch: int
) -> float:
    """CPU seconds per message (both ends), for one connection."""
    total = messages * size
    received = asyncio.Event()

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        left = total
        while left > 0:
            data = await reader.read(256 * 1024)
            if not data:
                break
            left -= len(data)
        received.set()
        writer.close()

    server = await serve_node_protocol(sink, "127.0.0.1", 0, server_tls)
    port = server.sockets[0].getsockname()[1]
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_tls)
        chunk = b"x" * (size * batch)
        started = time.process_time()
        for _ in range(messages // batch):
            writer.write(chunk)
            await writer.drain()
        await received.wait()
        cpu = time.process_time() - started
        writer.close()
    finally:
        server.close()
    return cpu / messages


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="pushgate-tls-bench-") as tmp:
        certs = make_cluster_certificates(Path(tmp), ["node", "client"])
        node, client = NodeTls.load(certs["node"]), NodeTls.load(certs["client"])
        plain: list[float] = []
        tls: list[float] = []
        for _ in range(args.rounds):
            plain.append(await one_round(None, None, args.messages, args.size, args.batch))
            tls.append(await one_round(node.server, client.client, args.messages, args.size, args.batch))
        p, t = statistics.median(plain) * 1e6, statistics.median(tls) * 1e6
        print(
            f"{args.messages} messages of {args.size} bytes, {args.batch} per write, {args.rounds} rounds each"
        )
        print(f"plaintext  {p:6.2f} us CPU per message (both ends)")
        print(f"mutual TLS {t:6.2f} us CPU per message (both ends)   +{t - p:.2f} us")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8, help="messages per write (NodeStream batches frames)")
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(parser.parse_args()))

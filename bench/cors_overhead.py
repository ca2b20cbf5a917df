"""What the CORS / origin layer costs per request: no Origin (servers, curl), an allowed
browser origin (token cache hit and origin check), a foreign one (refused).

The middleware wraps an ASGI app that answers at once, so the figures are the layer's own
cost; compare them with a whole request through the gateway (bench/http_bench.py, tens of
microseconds). Prints microseconds per request and the ratio to the bare app.

    python bench/cors_overhead.py [--requests 50000]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from gateway.cors import CorsMiddleware
from gateway.services import GatewayServices
from gateway.settings import Settings


async def bare(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def noop_send(message: Any) -> None:
    pass


async def noop_receive() -> Any:
    return {"type": "http.request", "body": b""}


def scope(headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/queues/q/messages",
        "query_string": b"",
        "headers": headers,
    }


async def timed(app: Any, request: dict[str, Any], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        await app(request, noop_receive, noop_send)
    return (time.perf_counter() - start) / n * 1e6


async def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        services = GatewayServices.build(Settings(data_dir=Path(tmp)))
        await services.start()
        try:
            auth = services.authenticator
            await auth.tenants.create("web", ["https://app.example"])
            _, key = await auth.api_keys.create("web", "send:*")
            cors = CorsMiddleware(bare, auth, services.origin_rule)
            host = (b"host", b"gw.example")
            bearer = (b"authorization", f"Bearer {key}".encode())
            cases = {
                "bare app": (bare, scope([host, bearer])),
                "no Origin": (cors, scope([host, bearer, (b"content-type", b"application/json")])),
                "allowed Origin": (cors, scope([host, bearer, (b"origin", b"https://app.example")])),
                "foreign Origin (403)": (cors, scope([host, bearer, (b"origin", b"https://evil.example")])),
            }
            for app, request in cases.values():
                await timed(app, request, n // 10)  # warm the caches
            base = None
            for name, (app, request) in cases.items():
                us = min([await timed(app, request, n) for _ in range(3)])
                base = base or us
                print(f"{name:22} {us:7.2f} us/request  {us / base:5.1f}x bare  (+{us - base:.2f} us)")
        finally:
            await services.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=50_000)
    asyncio.run(main(parser.parse_args().requests))

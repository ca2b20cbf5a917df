"""The ``pushgate`` command: ``serve`` runs the gateway, ``admin`` manages tenants and keys,
``usage`` runs usage reports."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from backend_store.errors import ConfigurationError

from .settings import Settings


def _serve_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run the gateway. Every flag can also come from PUSHGATE_<FLAG> in the environment "
        "(PUSHGATE_DATA_DIR, PUSHGATE_HOST, PUSHGATE_PORT, PUSHGATE_STORE_URL, PUSHGATE_TLS_CERT, "
        "PUSHGATE_TLS_KEY, PUSHGATE_ENCRYPTION_KEY_FILE; the key document itself in PUSHGATE_ENCRYPTION_KEYS).",
    )
    parser.add_argument("--data", dest="data_dir", type=Path, help="data directory (created if missing)")
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default 8080; 0 picks a free one)")
    parser.add_argument("--store", dest="store_url", help="store URL (default lmdb://<data>/store)")
    parser.add_argument("--tls-cert", type=Path, help="PEM certificate chain: serve HTTPS")
    parser.add_argument("--tls-key", type=Path, help="PEM private key for --tls-cert")
    parser.add_argument("--encryption-key-file", type=Path, help="JSON key document: encrypt bodies at rest")
    parser.add_argument("--jwt-audience", help="the aud claim JWTs must carry (default: none allowed)")
    parser.add_argument("--max-request-bytes", type=int, help="largest request body (default 4 MiB)")
    parser.add_argument(
        "--metrics-listen", help="HOST:PORT: also serve /metrics there, without a token (a private network)"
    )
    parser.add_argument(
        "--metrics-queue-series", type=int, help="queues with their own /metrics series (default 100)"
    )
    parser.add_argument("--alert-webhook-url", help="POST alert transitions here as JSON")
    parser.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"])
    parser.add_argument(
        "--redis",
        dest="redis_url",
        help="share rate limits, wake-ups and cache invalidations with other gateways through "
        "this Redis (redis://host:port; PUSHGATE_REDIS_URL); default: this process only",
    )
    parser.add_argument(
        "--redis-fail",
        choices=["open", "closed"],
        help="when Redis is unreachable: serve without rate limits (open, default) or answer 503 (closed)",
    )
    parser.add_argument(
        "--usage-flush-interval",
        dest="usage_flush_interval_s",
        type=float,
        help="seconds between usage file flushes (default 10; 0 turns usage recording off)",
    )
    parser.add_argument("--gateway-name", help="names this gateway's usage files (default: the host name)")
    return parser


def serve(argv: Sequence[str]) -> int:
    args = _serve_parser("pushgate serve").parse_args(argv)
    try:
        settings = Settings.from_sources(vars(args)).with_changes(announce_bootstrap=True)
        settings.keyring()  # a bad key file fails here, with a clear message, not inside uvicorn
    except ConfigurationError as exc:
        print(f"pushgate serve: {exc.detail}", file=sys.stderr)
        return 2

    from .app import create_app
    from .server import GatewayServer, uvicorn_config

    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    app = create_app(settings)
    server = GatewayServer(uvicorn_config(settings, app), app.state.services, announce=True)
    server.run()
    # uvicorn exits with 3 when start-up (the lifespan) failed, e.g. a store it cannot open.
    return 0 if server.started else 3


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(
            "usage: pushgate {serve,admin,usage} ...\n\n  serve   run the gateway (pushgate serve --help)\n"
            "  admin   tenants, keys, JWT keys, queues (pushgate admin --help)\n"
            "  usage   usage reports with Spark (pushgate usage report --help)"
        )
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "serve":
        return serve(rest)
    if command == "admin":
        from . import admin_cli

        return admin_cli.main(rest)
    if command == "usage":
        # Imported only here: pyspark is the optional `spark` extra.
        try:
            from spark.cli import main as usage_main
        except ImportError as exc:
            print(f"pushgate usage: needs pyspark (pip install 'pushgate[spark]'): {exc}", file=sys.stderr)
            return 2
        return usage_main(rest)
    print(f"pushgate: unknown command {command!r} (expected serve, admin or usage)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

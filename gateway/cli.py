"""The ``pushgate`` command: ``serve`` runs the gateway, ``admin`` manages tenants and keys,
``usage`` runs usage reports."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

from backend_store.errors import ConfigurationError
from backend_store.open_files import raise_open_file_limit

from .settings import Settings

# Settings that are not configuration: the CLI sets them itself, or only code and tests do.
_INTERNAL_SETTINGS = frozenset({"announce_bootstrap", "push"})


def _serve_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run the gateway. Stop it with Ctrl-C or SIGTERM (it drains first); "
        "reset it by deleting its data directory.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
        "--disk-reserve-mib",
        type=int,
        help="room on the store's disk that sends may not use, so consumers can still drain a full"
        " disk (default: 2%% of the disk, 1 MiB to 1 GiB)",
    )
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
    parser.add_argument(
        "--usage-dir",
        type=Path,
        help="write usage files here (default <data>/usage); several gateways may share one (docs/usage.md)",
    )
    parser.add_argument("--gateway-name", help="names this gateway's usage files (default: the host name)")
    parser.add_argument(
        "--access-log", action="store_true", default=None, help="log one line per request (default off)"
    )
    parser.epilog = environment_help(parser)
    return parser


def environment_help(parser: argparse.ArgumentParser) -> str:
    """Every ``PUSHGATE_*`` variable, from the :class:`Settings` fields themselves."""
    flags = {a.dest: a.option_strings[0] for a in parser._actions if a.option_strings}
    lines = ["environment (flags win over the environment, which wins over defaults):"]
    for f in fields(Settings):
        if f.name in _INTERNAL_SETTINGS:
            continue
        if f.name in flags:
            where = f"same as {flags[f.name]}"
        elif f.name == "encryption_keys":
            where = "the key document itself, instead of --encryption-key-file"
        else:
            where = f"no flag; default {f.default}"
        lines.append(f"  {Settings.env_var(f.name):32} {where}")
    return "\n".join(lines)


def _check_dir(path: Path, flag: str) -> None:
    """One clear line for a directory that cannot work (instead of a traceback later)."""
    if path.exists() and not path.is_dir():
        raise ConfigurationError(f"{flag} {path}: not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(f"{flag} {path}: cannot create it ({exc.strerror})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigurationError(f"{flag} {path}: not writable")


def serve(argv: Sequence[str]) -> int:
    args = _serve_parser("pushgate serve").parse_args(argv)
    try:
        settings = Settings.from_sources(vars(args)).with_changes(announce_bootstrap=True)
        settings.keyring()  # a bad key file fails here, with a clear message, not inside uvicorn
        _check_dir(settings.data_dir, "--data")
        if settings.usage_dir is not None and settings.usage_flush_interval_s > 0:
            _check_dir(settings.usage_dir, "--usage-dir")
    except ConfigurationError as exc:
        print(f"pushgate serve: {exc.detail}", file=sys.stderr)
        return 2

    from .app import create_app
    from .collector import tune_for_serving
    from .server import GatewayServer, bind_socket, uvicorn_config

    try:
        # Before anything is written (a new data directory gets a bootstrap key).
        sock = bind_socket(settings)
    except OSError as exc:
        print(
            f"pushgate serve: cannot listen on {settings.host}:{settings.port}: {exc.strerror}",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    raise_open_file_limit("pushgate serve")  # every connection is a descriptor (open_files.py)
    app = create_app(settings)
    server = GatewayServer(uvicorn_config(settings, app), app.state.services, announce=True)
    tune_for_serving()  # the process is a server from here on (see collector.py)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        # Ctrl-C: uvicorn drained and stopped, then re-raised SIGINT; exit as a shell expects.
        return 130
    finally:
        sock.close()
    # uvicorn exits with 3 when start-up (the lifespan) failed, e.g. a store it cannot open.
    return 0 if server.started else 3


def version() -> str:
    try:
        return importlib.metadata.version("pushgate")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-V", "--version"):
        print(f"pushgate {version()}")
        return 0
    if not args or args[0] in ("-h", "--help"):
        print(
            "usage: pushgate {serve,admin,usage,node,manager,dev-cluster} ...\n\n"
            "  serve   run the gateway (pushgate serve --help)\n"
            "  admin   tenants, keys, JWT keys, queues (pushgate admin --help)\n"
            "  usage   usage reports with Spark (pushgate usage report --help)\n"
            "  node    a backend node of a cluster (pushgate node --help)\n"
            "  manager a cluster manager (pushgate manager --help)\n"
            "  dev-cluster  etcd, nodes, managers and a gateway on this machine (pushgate dev-cluster --help)\n\n"
            "  --version  print the version"
        )
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "serve":
        return serve(rest)
    if command == "admin":
        from . import admin_cli

        return admin_cli.main(rest)
    if command == "dev-cluster":
        from . import dev_cluster

        return dev_cluster.main(rest)
    if command in ("node", "manager"):
        from backend_store.cluster import commands

        return commands.node_main(rest) if command == "node" else commands.manager_main(rest)
    if command == "usage":
        # Imported only here: pyspark is the optional `spark` extra.
        try:
            from spark.cli import main as usage_main
        except ImportError as exc:
            print(f"pushgate usage: needs pyspark (pip install 'pushgate[spark]'): {exc}", file=sys.stderr)
            return 2
        return usage_main(rest)
    print(
        f"pushgate: unknown command {command!r} (expected serve, admin, usage, node, manager or dev-cluster)",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())

"""``pushgate node`` and ``pushgate manager``: argument parsing and the process around them.

SIGINT and SIGTERM stop the process cleanly (the node closes its environments and revokes its
lease, so its keys vanish at once instead of after the TTL). SIGHUP (``systemctl reload``)
never stops it: a node with TLS looks at its certificate files (node/node.py), anything else
has nothing to reload.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import uuid
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from ..encryption import ENV_VAR, Keyring
from ..errors import ConfigurationError, PushgateError
from ..loop_watch import LoopWatch
from ..open_files import raise_open_file_limit
from ..private_files import private_dir
from ..started_pool import default_workers, started_pool
from .coordination.etcd_tls import EtcdTls
from .protocol.tls import NodeTls, TlsFiles


def _node_id(data_dir: Path, given: str | None) -> str:
    """The node's id: ``--id``, else the one kept in ``DIR/node-id`` (made on first start)."""
    path = data_dir / "node-id"
    if given:
        return given
    if path.exists():
        return path.read_text().strip()
    node_id = f"node-{uuid.uuid4().hex[:8]}"
    path.write_text(node_id + "\n")
    return node_id


def _await_chain(task: asyncio.Task[Any]) -> str:
    """Where a task waits: its coroutine and every coroutine it awaits, innermost last
    (``Task.get_stack()`` shows only the outermost frame of a suspended task)."""
    lines: list[str] = []
    awaited: Any = task.get_coro()
    while awaited is not None:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is not None:
            lines.append(f"    {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
        elif not hasattr(awaited, "cr_await"):
            lines.append(f"    awaiting {awaited!r}"[:300])
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return "\n".join(lines)


def _dump_tasks() -> None:
    """SIGUSR1: log every task and where it waits, to diagnose a process that went quiet."""
    for task in asyncio.all_tasks():
        logging.getLogger("pushgate.tasks").warning("task %s\n%s", task.get_name(), _await_chain(task))


def _nothing_to_reload() -> None:
    """SIGHUP where nothing reloads: logged, instead of the signal's default (the process ends)."""
    logging.getLogger("pushgate.cluster").info("SIGHUP: nothing to reload")


def _loop_factory(tls_listener: bool) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (``uvicorn[standard]`` brings it on Linux, and
    the gateway already runs on it): a node's work is mostly socket reads and writes, which
    uvloop does in C (a cluster of three nodes sent 21-34% more messages per second with it,
    bench/README.md, session 41). None (asyncio's own loop) elsewhere, and for a node that
    listens with TLS: its listener reads nothing before ``start_tls`` takes the connection
    over (protocol/tls.py, to log why a handshake was refused), and uvloop's ``start_tls``
    on a server's stream never sees the ClientHello (uvloop issue 707)."""
    if tls_listener:
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _run(
    main: Callable[[], Coroutine[Any, Any, None]],
    log_level: str,
    *,
    tls_listener: bool = False,
    server: str | None = None,
) -> int:
    """Run ``main`` on its own loop until it ends or a signal stops it. ``server``: a command
    that serves until stopped (its open-file limit is raised, open_files.py)."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if server is not None:
        raise_open_file_limit(server)

    async def supervised() -> None:
        loop = asyncio.get_running_loop()
        if server is not None:  # its thread count fixed from the start (started_pool.py)
            loop.set_default_executor(started_pool(default_workers(), "pushgate-io"))
        task: asyncio.Task[None] = asyncio.create_task(main())
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        loop.add_signal_handler(signal.SIGUSR1, _dump_tasks)
        loop.add_signal_handler(signal.SIGHUP, _nothing_to_reload)  # a TLS node replaces it
        watch = LoopWatch()  # a held loop is logged with where it was held (loop_watch.py)
        watch.start()
        try:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        finally:
            watch.stop()

    try:
        with asyncio.Runner(loop_factory=_loop_factory(tls_listener)) as runner:
            runner.run(supervised())
    except (ConfigurationError, PushgateError) as exc:
        print(f"pushgate: {exc.detail}", file=sys.stderr)
        return 2
    return 0


def node_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="pushgate node", description="Run a backend node of a Pushgate cluster (docs/cluster.md)."
    )
    parser.add_argument("--data", type=Path, required=True, help="data directory (created if missing)")
    parser.add_argument(
        "--listen", default="127.0.0.1:7100", help="HOST:PORT to serve (default 127.0.0.1:7100)"
    )
    parser.add_argument("--etcd", required=True, help="etcd endpoints, HOST:PORT[,HOST:PORT...]")
    parser.add_argument("--id", help="node id (default: kept in DATA/node-id)")
    parser.add_argument("--advertise", help="HOST:PORT others dial (default: --listen)")
    parser.add_argument("--lease-ttl", type=float, default=2.0, help="etcd lease TTL in seconds (default 2)")
    parser.add_argument(
        "--quorum-window",
        type=float,
        metavar="SECONDS",
        help="a leader that hears from no majority of its replicas for this long resigns"
        " (check-quorum; default: --lease-ttl; 0: never)",
    )
    parser.add_argument(
        "--encryption-key-file",
        type=Path,
        help="JSON key document: encrypt bodies at rest (the same file on every node;"
        f" default: ${ENV_VAR} if set)",
    )
    parser.add_argument(
        "--disk-reserve-mib",
        type=int,
        help="room on each replica's disk that sends may not use, so consumers can still drain a"
        " full disk (default: 2%% of the disk, 1 MiB to 1 GiB; docs/store.md)",
    )
    tls = parser.add_argument_group(
        "mutual TLS on the node protocol (all three or none; docs/cluster.md)",
        "the port then serves TLS only, to peers with a certificate signed by the CA;"
        " leader links to followers present --tls-cert",
    )
    tls.add_argument("--tls-cert", type=Path, metavar="PEM", help="this node's certificate (chain)")
    tls.add_argument("--tls-key", type=Path, metavar="PEM", help="the certificate's private key")
    tls.add_argument("--tls-ca", type=Path, metavar="PEM", help="the cluster's CA certificate(s)")
    parser.add_argument("--prefix", default="/pushgate/", help="etcd key prefix (default /pushgate/)")
    parser.add_argument("--log-level", default="warning", choices=["error", "warning", "info", "debug"])
    _add_etcd_tls(parser)
    args = parser.parse_args(argv)
    if args.disk_reserve_mib is not None and args.disk_reserve_mib < 1:
        print("pushgate node: --disk-reserve-mib must be at least 1", file=sys.stderr)
        return 2
    try:
        etcd_tls = _etcd_tls(args)
        keyring = (
            Keyring.from_file(args.encryption_key_file) if args.encryption_key_file else Keyring.from_env()
        )
        files = TlsFiles.from_options(
            args.tls_cert, args.tls_key, args.tls_ca, names="--tls-cert, --tls-key and --tls-ca"
        )
        node_tls = NodeTls.load(files) if files is not None else None
    except ConfigurationError as exc:
        print(f"pushgate node: {exc.detail}", file=sys.stderr)
        return 2
    private_dir(args.data)
    node_id = _node_id(args.data, args.id)

    from .node.local_ports import run_node

    return _run(
        lambda: run_node(
            node_id,
            args.data,
            args.listen,
            args.etcd,
            advertise=args.advertise,
            ttl_s=args.lease_ttl,
            prefix=args.prefix,
            quorum_window_s=args.quorum_window,
            keyring=keyring,
            tls=node_tls,
            tls_files=files,
            etcd_tls=etcd_tls,
            disk_reserve_bytes=None if args.disk_reserve_mib is None else args.disk_reserve_mib << 20,
        ),
        args.log_level,
        tls_listener=node_tls is not None,
        server="pushgate node",
    )


def manager_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="pushgate manager",
        description="Run a cluster manager (run two: one leads, the other stands by; docs/cluster.md).",
    )
    parser.add_argument("--etcd", required=True, help="etcd endpoints, HOST:PORT[,HOST:PORT...]")
    parser.add_argument("--id", help="manager id (default: random)")
    parser.add_argument("--lease-ttl", type=float, default=2.0, help="etcd lease TTL in seconds (default 2)")
    parser.add_argument("--prefix", default="/pushgate/", help="etcd key prefix (default /pushgate/)")
    parser.add_argument("--log-level", default="warning", choices=["error", "warning", "info", "debug"])
    parser.add_argument(
        "--no-rebalance",
        action="store_true",
        help="never move replicas or leadership to even out the nodes (drains still move them)",
    )
    parser.add_argument(
        "--replace-after",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="replace the replicas of a node gone this long, by a learner that catches up"
        " (default 300; 0: never, drain it by hand)",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        metavar="N",
        help="the shared partitions each pool of queues has (default: one per node, added as"
        " nodes join; raising it adds partitions, lowering it removes none)",
    )
    once = parser.add_mutually_exclusive_group()
    once.add_argument(
        "--drain", metavar="NODE", help="ask the managers to move every replica off NODE, and exit"
    )
    once.add_argument("--undrain", metavar="NODE", help="withdraw a drain request, and exit")
    once.add_argument(
        "--delete-stray",
        metavar="NODE:PARTITION",
        help="let NODE delete its stray replica of PARTITION (one the map does not place there;"
        " GET /v1/cluster lists them), and exit",
    )
    _add_etcd_tls(parser)
    args = parser.parse_args(argv)
    if args.replace_after < 0:
        print("pushgate manager: --replace-after must be 0 (never) or more seconds", file=sys.stderr)
        return 2
    if args.partitions is not None and args.partitions < 1:
        print("pushgate manager: --partitions must be 1 or more", file=sys.stderr)
        return 2
    try:
        etcd_tls = _etcd_tls(args)
    except ConfigurationError as exc:
        print(f"pushgate manager: {exc.detail}", file=sys.stderr)
        return 2

    from .manager.manager import run_manager, set_drain

    if args.delete_stray:
        from .manager.stray_command import delete_stray, parse_target

        async def write_tombstone() -> None:
            node, partition = parse_target(args.delete_stray)
            print(await delete_stray(args.etcd, node, partition, prefix=args.prefix, etcd_tls=etcd_tls))

        return _run(write_tombstone, "warning")

    if args.drain or args.undrain:
        node = args.drain or args.undrain
        return _run(
            lambda: set_drain(args.etcd, node, drain=bool(args.drain), prefix=args.prefix, etcd_tls=etcd_tls),
            "warning",
        )

    return _run(
        lambda: run_manager(
            args.etcd,
            manager_id=args.id,
            ttl_s=args.lease_ttl,
            prefix=args.prefix,
            rebalance=not args.no_rebalance,
            replace_after_s=args.replace_after,
            pool_partitions=args.partitions,
            etcd_tls=etcd_tls,
        ),
        args.log_level,
        server="pushgate manager",
    )


def _add_etcd_tls(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "TLS to etcd (docs/cluster.md)",
        "with --etcd-ca, etcd is dialled over TLS and its certificate checked against the CA;"
        " --etcd-cert and --etcd-key (together) answer an etcd that asks for a client certificate",
    )
    group.add_argument("--etcd-ca", type=Path, metavar="PEM", help="the CA that signed etcd's certificate")
    group.add_argument("--etcd-cert", type=Path, metavar="PEM", help="this process's certificate for etcd")
    group.add_argument("--etcd-key", type=Path, metavar="PEM", help="that certificate's private key")


def _etcd_tls(args: argparse.Namespace) -> EtcdTls | None:
    tls = EtcdTls.from_options(
        args.etcd_ca, args.etcd_cert, args.etcd_key, names="--etcd-ca, --etcd-cert and --etcd-key"
    )
    if tls is not None:
        tls.credentials()  # a missing file is said now, not at the first call
    return tls

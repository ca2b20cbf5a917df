"""``pushgate admin``: tenants, API keys, JWT keys, queue deletion, and backups of a data
directory's store.

Works whether or not a gateway runs on the same directory (LMDB lets both open it); but
``restore``, which needs the gateway stopped.
A running gateway caches key records and limits for a few seconds, so a change made here
takes effect there within that time; with ``--redis`` (or ``PUSHGATE_REDIS_URL``) the
gateways sharing that Redis are told at once (the output then has ``"announced": true``). Each command prints one JSON object on stdout; errors
go to stderr with exit status 1 (2 for a malformed command line).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from backend_store import StoreOptions, open_backend
from backend_store.backend import Backend
from backend_store.errors import ConfigurationError, PushgateError
from backend_store.lmdb_store.backup import backup, restore
from backend_store.types import QueueName, TenantId
from backend_store.url import lmdb_path
from gateway.settings import Settings
from web_console.alerts import KINDS, RuleStore, parse_rule

from .auth.api_keys import ApiKeyStore
from .auth.aws_keys import AwsKeyStore
from .auth.jwt_keys import ALGORITHMS, JwtKeyStore
from .auth.tenants import TenantStore
from .limits.shared import announce
from .limits.store import LimitsStore
from .usage.audit import AUDIT_SUBDIR, AuditAction, AuditLog, cli_actor

Command = Callable[[Backend, argparse.Namespace], Awaitable[dict[str, Any]]]
FileCommand = Callable[[Path, argparse.Namespace], dict[str, Any]]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's signature is NoReturn
        self.print_usage(sys.stderr)
        raise _UsageError(f"{self.prog}: error: {message}")


class _UsageError(Exception):
    """A malformed command line: exit status 2."""


class _CommandError(Exception):
    """A command that cannot run (no data directory): exit status 1."""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="pushgate admin",
        description="Tenants, API keys, JWT keys, queue deletion and store backups on a gateway's data "
        "directory, whether or not the gateway runs (restore: with it stopped). Each command prints one "
        "JSON object.",
        epilog="examples:\n"
        "  pushgate admin --data ./data tenant create acme --origin https://app.acme.com\n"
        '  pushgate admin --data ./data key create --tenant acme --scope "send:orders receive:orders"\n'
        "  pushgate admin --data ./data key revoke KEY_ID\n"
        "  pushgate admin --data ./data backup /backups/pushgate-$(date +%F).mdb\n"
        "Each group has its own help: pushgate admin key create --help",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--data", type=Path, help="the gateway's data directory (default: $PUSHGATE_DATA_DIR)"
    )
    parser.add_argument("--store", help="the store URL, when serve was given one (--store)")
    parser.add_argument(
        "--encryption-key-file",
        type=Path,
        help="the store's encryption keys, as given to serve (default: $PUSHGATE_ENCRYPTION_KEYS)",
    )
    parser.add_argument(
        "--redis",
        help="tell gateways sharing this Redis about changes at once (default: $PUSHGATE_REDIS_URL; "
        "without it they see changes within their cache TTL, 5 s)",
    )
    groups = parser.add_subparsers(dest="group", required=True, parser_class=_Parser)

    tenant = groups.add_parser("tenant", help="tenants").add_subparsers(dest="action", required=True)
    create = tenant.add_parser("create", help="create a tenant")
    create.add_argument("name")
    create.add_argument("--origin", action="append", default=[], help="allowed browser origin (repeatable)")
    create.set_defaults(run=_tenant_create)
    tenant.add_parser("list", help="list tenants").set_defaults(run=_tenant_list)
    origins = tenant.add_parser("set-origins", help="replace a tenant's allowed origins")
    origins.add_argument("name")
    origins.add_argument("--origin", action="append", default=[], help="allowed browser origin (repeatable)")
    origins.set_defaults(run=_tenant_set_origins)

    key = groups.add_parser("key", help="API keys").add_subparsers(dest="action", required=True)
    create = key.add_parser("create", help="create an API key (printed only here)")
    create.add_argument("--tenant", required=True)
    create.add_argument(
        "--scope",
        action="append",
        required=True,
        help="space-separated scopes: admin, metrics, manage:PATTERN (create, change, purge and delete "
        'queues), send:PATTERN, receive:PATTERN; e.g. "manage:orders-* send:orders-* receive:*"',
    )
    create.add_argument(
        "--aws",
        action="store_true",
        help="also create AWS credentials (aws_access_key_id, aws_secret_access_key) for the SQS API",
    )
    create.set_defaults(run=_key_create)
    listing = key.add_parser("list", help="list a tenant's API keys (no secrets)")
    listing.add_argument("--tenant", required=True)
    listing.set_defaults(run=_key_list)
    revoke = key.add_parser("revoke", help="revoke an API key")
    revoke.add_argument("key_id")
    revoke.set_defaults(run=_key_revoke)

    jwt_key = groups.add_parser("jwt-key", help="JWT verification keys").add_subparsers(
        dest="action", required=True
    )
    add = jwt_key.add_parser("add", help="register a JWT verification key")
    add.add_argument("--tenant", required=True)
    add.add_argument("--kid", required=True)
    add.add_argument("--alg", required=True, choices=ALGORITHMS)
    material = add.add_mutually_exclusive_group(required=True)
    material.add_argument("--secret-file", type=Path, help="HS256: file holding the shared secret")
    material.add_argument("--public-key-file", type=Path, help="RS256/ES256/EdDSA: PEM public key file")
    add.set_defaults(run=_jwt_key_add)
    listing = jwt_key.add_parser("list", help="list a tenant's JWT keys (no secrets)")
    listing.add_argument("--tenant", required=True)
    listing.set_defaults(run=_jwt_key_list)
    remove = jwt_key.add_parser("remove", help="remove a JWT key; tokens it signed stop working")
    remove.add_argument("--tenant", required=True)
    remove.add_argument("--kid", required=True)
    remove.set_defaults(run=_jwt_key_remove)

    limits = groups.add_parser("limits", help="rate limits and quotas").add_subparsers(
        dest="action", required=True
    )
    get = limits.add_parser("get", help="a tenant's limits (the GET /v1/limits document)")
    get.add_argument("--tenant", required=True)
    get.set_defaults(run=_limits_get)
    put = limits.add_parser("set", help="change a tenant's limits (merged as PUT /v1/limits does)")
    put.add_argument("--tenant", required=True)
    put.add_argument("document", help='JSON, e.g. \'{"send": "100/second", "per_key": {"send": null}}\'')
    put.set_defaults(run=_limits_set)
    alerts = groups.add_parser("alerts", help="alert rules (docs/console.md)").add_subparsers(
        dest="action", required=True
    )
    add_rule = alerts.add_parser("add", help="add an alert rule")
    add_rule.add_argument("--tenant", required=True)
    add_rule.add_argument("--kind", required=True, choices=KINDS)
    add_rule.add_argument("--threshold", type=float, help="see docs/console.md for each kind's meaning")
    add_rule.add_argument("--queue", help="a queue name or glob (default: every queue of the tenant)")
    add_rule.add_argument("--for", dest="for_s", type=float, help="seconds the condition must hold")
    add_rule.add_argument("--clear", type=float, help="resolve at or below this (default 80%% of threshold)")
    add_rule.add_argument("--window", dest="window_s", type=float, help="dlq_growth: window in seconds")
    add_rule.add_argument("--description")
    add_rule.set_defaults(run=_alerts_add)
    list_rules = alerts.add_parser("list", help="list a tenant's alert rules")
    list_rules.add_argument("--tenant", required=True)
    list_rules.set_defaults(run=_alerts_list)
    remove_rule = alerts.add_parser("remove", help="remove an alert rule")
    remove_rule.add_argument("--tenant", required=True)
    remove_rule.add_argument("rule_id")
    remove_rule.set_defaults(run=_alerts_remove)

    delete = groups.add_parser("delete-queue", help="delete a queue and its messages")
    delete.add_argument("--tenant", required=True)
    delete.add_argument("name")
    delete.set_defaults(run=_delete_queue)

    # On the store's files, not through a Backend (backend_store/lmdb_store/backup.py).
    backup = groups.add_parser(
        "backup", help="copy the embedded store into a new file, while a gateway serves it or not"
    )
    backup.add_argument("file", type=Path, help="the backup file to write (never overwritten)")
    backup.set_defaults(run=_backup)
    restore = groups.add_parser(
        "restore", help="put a backup in place of the store (the gateway stopped; the old store is kept)"
    )
    restore.add_argument("file", type=Path, help="a file pushgate admin backup wrote")
    restore.set_defaults(run=_restore)
    return parser


async def _tenant_create(backend: Backend, args: argparse.Namespace) -> dict[str, Any]:
    tenant = await TenantStore(backend).create(args.name, args.origin)
    return {"tenant": tenant.name, "origins": list(tenant.origins)}


async def _tenant_list(backend: Backend, args: argparse.Namespace) -> dict[str, Any]:
    return {"tenants": [t.to_dict() for t in await TenantStore(backend).list_all()]}


async def _tenant_set_origins(backend: Backend, args: argparse.Namespace) -> dict[str, Any]:
    tenant = await TenantStore(backend).set_origins(args.name, args.origin)
    return {"tenant": tenant.name, "origins": list(tenant.origins)}


async def _key_create(backend: Backend, args: argparse.Namespace) -> dict[str, Any]:
    key, token = await ApiKeyStore(backend).create(args.tenant, args.scope)
    out: dict[str, Any] = {
        "key_id": key.key_id,
        "key": token,
        "tenant": key.tenant,
        "scopes": sorted(key.scopes),
    }
    if getattr(args, "aws", False):
        # The secret is sealed under the store's keyring when one is given (docs/sqs.md).
        access_key_id, secret = await AwsKeyStore(backend, args.keyring).create(key.key_id)
        out["aws_access_key_id"] = access_key_id
        out["aws_secret_access_key"] = secret
    return out


async def _key_list(backend: Backend, args: argparse.Namespace) -> dict[str, Any]:
    await TenantStore(backend).require(args.tenant)
    return {"keys": [k.public_dict() for k in await ApiKeyStore(backend).list_for_tenant(args.tenant)]}


async def _key_revoke(backend: Backend, args: argparse.Namespace) -> dict[str, Any]:
    key = await ApiKeyStore(backend).revoke(args.key_id)
    # The tenant is for the audit log; main() prints only what the command promises.
    return {"revoked": key.key_id, "tenant": key.tenant}


def _read_key_material(args: argparse.Namespace) -> bytes:
    if args.alg == "HS256" and args.secret_file is None:
        raise _UsageError("pushgate admin: error: HS256 needs --secret-file")
    if args.alg != "HS256" and args.public_key_file is None:
        raise _UsageError(f"pushgate admin: error: {args.alg} needs --public-key-file")
    if args.secret_file is not None:
        # A secret file written with echo or an editor ends in a newline that is not part of it.
        return bytes(args.secret_file.read_bytes().rstrip(b"\r\n"))
    return bytes(args.public_key_file.read_bytes())


async def _jwt_key_add(backend: Backend, args: argparse.Namespace) -> dict[str, Any]:
    key = await JwtKeyStore(backend).add(args.tenant, args.kid, args.alg, args.material)
    return {"tenant": key.tenant, "kid": key.kid, "alg": key.alg}


async def _jwt_key_list(backend: Backend, args: argparse.Namespace) -> dict[str, Any]:
    await TenantStore(backend).require(args.tenant)
    return {"keys": [k.public_dict() for k in await JwtKeyStore(backend).list_for_tenant(args.tenant)]}


async def _jwt_key_remove(backend: Backend, args: argparse.Namespace) -> dict[str, Any]:
    await JwtKeyStore(backend).remove(args.tenant, args.kid)
    return {"removed": args.kid, "tenant": args.tenant}


async def _limits_get(backend: Backend, args: argparse.Namespace) -> dict[str, Any]:
    tenant = (await TenantStore(backend).require(args.tenant)).name
    return {"tenant": tenant, "limits": (await LimitsStore(backend).get(tenant)).to_dict()}


async def _limits_set(backend: Backend, args: argparse.Namespace) -> dict[str, Any]:
    tenant = (await TenantStore(backend).require(args.tenant)).name
    try:
        changes = orjson.loads(args.document)
    except orjson.JSONDecodeError:
        raise _UsageError("pushgate admin: error: the limits document must be JSON") from None
    limits = await LimitsStore(backend).update(tenant, changes)
    return {"tenant": tenant, "limits": limits.to_dict()}


async def _alerts_add(backend: Backend, args: argparse.Namespace) -> dict[str, Any]:
    await TenantStore(backend).require(args.tenant)
    fields = ("kind", "threshold", "queue", "for_s", "clear", "window_s", "description")
    body = {name: getattr(args, name) for name in fields if getattr(args, name) is not None}
    rule = parse_rule(args.tenant, body, allow_system=args.tenant == args.operator_tenant)
    await RuleStore(backend).put(rule)
    return rule.to_dict()


async def _alerts_list(backend: Backend, args: argparse.Namespace) -> dict[str, Any]:
    await TenantStore(backend).require(args.tenant)
    return {"rules": [r.to_dict() for r in await RuleStore(backend).list(args.tenant)]}


async def _alerts_remove(backend: Backend, args: argparse.Namespace) -> dict[str, Any]:
    await RuleStore(backend).delete(args.tenant, args.rule_id)
    return {"removed": args.rule_id, "tenant": args.tenant}


async def _delete_queue(backend: Backend, args: argparse.Namespace) -> dict[str, Any]:
    await backend.delete_queue(TenantId(args.tenant), QueueName(args.name))
    return {"deleted": args.name}


def _backup(store: Path, args: argparse.Namespace) -> dict[str, Any]:
    info = backup(store, args.file.resolve())
    return {
        "backup": str(info.path),
        "bytes": info.bytes,
        "format": info.format,
        "seconds": round(info.seconds, 3),
    }


def _restore(store: Path, args: argparse.Namespace) -> dict[str, Any]:
    info = restore(args.file.resolve(), store)
    replaced = None if info.replaced is None else str(info.replaced)
    return {
        "restored": str(args.file.resolve()),
        "store": str(info.store),
        "bytes": info.bytes,
        "replaced": replaced,
    }


# Commands on the embedded store's files (no Backend opened).
_FILE_COMMANDS: set[FileCommand] = {_backup, _restore}


# What each command changes, for the audit log: (action, tenant, target, details) from
# the arguments and the command's result. Read-only commands are not audited.
_AUDITED: dict[
    Command | FileCommand,
    Callable[[argparse.Namespace, dict[str, Any]], tuple[AuditAction, str, str, dict[str, Any]]],
] = {
    _backup: lambda a, r: (AuditAction.STORE_BACKED_UP, "", r["backup"], {"bytes": r["bytes"]}),
    _restore: lambda a, r: (
        AuditAction.STORE_RESTORED,
        "",
        r["store"],
        {"from": r["restored"], "replaced": r["replaced"]},
    ),
    _tenant_create: lambda a, r: (
        AuditAction.TENANT_CREATED,
        r["tenant"],
        r["tenant"],
        {"origins": r["origins"]},
    ),
    _tenant_set_origins: lambda a, r: (
        AuditAction.TENANT_ORIGINS_CHANGED,
        r["tenant"],
        r["tenant"],
        {"origins": r["origins"]},
    ),
    _key_create: lambda a, r: (AuditAction.KEY_CREATED, r["tenant"], r["key_id"], {"scopes": r["scopes"]}),
    _key_revoke: lambda a, r: (AuditAction.KEY_REVOKED, r.get("tenant", ""), r["revoked"], {}),
    _jwt_key_add: lambda a, r: (AuditAction.JWT_KEY_ADDED, r["tenant"], r["kid"], {"alg": r["alg"]}),
    _jwt_key_remove: lambda a, r: (AuditAction.JWT_KEY_REMOVED, r["tenant"], r["removed"], {}),
    _delete_queue: lambda a, r: (AuditAction.QUEUE_DELETED, a.tenant, r["deleted"], {}),
    _limits_set: lambda a, r: (
        AuditAction.LIMITS_CHANGED,
        r["tenant"],
        r["tenant"],
        {"changes": orjson.loads(a.document)},
    ),
}


async def _run(
    store_url: str, options: StoreOptions, command: Command, args: argparse.Namespace
) -> dict[str, Any]:
    backend = open_backend(store_url, options)
    await backend.start()
    try:
        result = await command(backend, args)
    finally:
        await backend.close()
    kind = _ANNOUNCED.get(command)
    redis_url = args.redis or os.environ.get("PUSHGATE_REDIS_URL")
    if kind is not None and redis_url:
        tenant = getattr(args, "tenant", None) if kind == "limits" else None
        result["announced"] = await announce(redis_url, kind, tenant)
    return result


# Commands whose change running gateways must hear of (records their caches hold).
_ANNOUNCED: dict[Command, str] = {
    _limits_set: "limits",
    _key_revoke: "auth",
    _jwt_key_add: "auth",
    _jwt_key_remove: "auth",
    _tenant_set_origins: "auth",
}


def _audit(
    data_dir: Path | None, command: Command | FileCommand, args: argparse.Namespace, result: dict[str, Any]
) -> None:
    """Record a command that changed something in ``<data>/audit`` (only with a data
    directory: a store given by URL alone has no place for it)."""
    describe = _AUDITED.get(command)
    if describe is None or data_dir is None:
        return
    action, tenant, target, details = describe(args, result)
    audit = AuditLog(data_dir / AUDIT_SUBDIR)
    audit.record(audit.entry(cli_actor(), "cli", tenant, action, target, details))


def _store(args: argparse.Namespace) -> tuple[str, StoreOptions, Path | None]:
    """The store ``pushgate serve`` uses with the same flags and environment, and the data
    directory (None when only a store URL was given)."""
    flags = {"data_dir": args.data, "store_url": args.store, "encryption_key_file": args.encryption_key_file}
    if args.data is None and args.store is not None:
        flags["data_dir"] = Path.cwd()  # unused: the store URL says where the store is
    try:
        settings = Settings.from_sources(flags)
    except ConfigurationError as exc:
        raise _UsageError(f"pushgate admin: error: {exc.detail}") from None
    if args.store is None and not settings.data_dir.is_dir() and args.run is not _restore:
        # Opening a store creates it; a typo in --data must not make an empty one. (A restore
        # onto a new machine makes the directory it is given.)
        raise _CommandError(f"no data directory at {settings.data_dir.resolve()}")
    args.operator_tenant = settings.operator_tenant
    args.keyring = settings.keyring()
    # No retention sweeps from a command that lives for a moment.
    data_dir = None if args.data is None and args.store is not None else settings.data_dir
    return settings.resolved_store_url, replace(settings.store_options(), sweep_interval_s=0), data_dir


def _embedded_store(store_url: str) -> Path:
    try:
        return lmdb_path(store_url)
    except ConfigurationError:
        raise _CommandError(
            "backup and restore work on the embedded store (lmdb://); a cluster keeps every"
            " message on several nodes, and its metadata is backed up with etcd (docs/cluster.md,"
            " section 11)"
        ) from None


def main(argv: list[str]) -> int:
    """Run one admin command; ``argv`` is what follows ``pushgate admin``."""
    if argv[:1] == ["admin"]:
        argv = argv[1:]
    try:
        args = build_parser().parse_args(argv)
        store_url, options, data_dir = _store(args)
        if args.run is _jwt_key_add:
            args.material = _read_key_material(args)
        if args.run in _FILE_COMMANDS:
            result = args.run(_embedded_store(store_url), args)
        else:
            result = asyncio.run(_run(store_url, options, args.run, args))
        _audit(data_dir, args.run, args, result)
        if args.run is _key_revoke:
            del result["tenant"]
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    except _UsageError as exc:
        print(exc, file=sys.stderr)
        return 2
    except PushgateError as exc:
        print(f"pushgate admin: error: {exc.detail}", file=sys.stderr)
        return 1
    except (_CommandError, OSError) as exc:
        print(f"pushgate admin: error: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Tenants: records in the backend's metadata store, with the origins browsers may connect from."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson

from backend_store.backend import MetadataStore
from backend_store.errors import InvalidRequest, NotFound
from backend_store.types import TenantId

NAMESPACE = "tenants"
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def is_valid_tenant_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


def validate_tenant_name(name: str) -> TenantId:
    if not is_valid_tenant_name(name):
        raise InvalidRequest(f"invalid tenant name {name!r}: 1-64 characters of [A-Za-z0-9_-]")
    return TenantId(name)


def normalize_origin(origin: str) -> str:
    """``scheme://host[:port]`` in lower case, as browsers send it in the ``Origin`` header."""
    parts = urlsplit(origin.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequest(f"invalid origin {origin!r}: expected http(s)://host[:port]")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username or parts.password:
        raise InvalidRequest(f"invalid origin {origin!r}: an origin has no path, query or user")
    try:
        port = parts.port
    except ValueError as exc:
        raise InvalidRequest(f"invalid origin {origin!r}: bad port") from exc
    default_port = {"http": 80, "https": 443}[parts.scheme]
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    suffix = f":{port}" if port is not None and port != default_port else ""
    return f"{parts.scheme}://{host}{suffix}"


@dataclass(frozen=True, slots=True)
class Tenant:
    name: TenantId
    origins: tuple[str, ...]
    created_at: float

    def to_dict(self) -> dict[str, Any]:
        return {"tenant": self.name, "origins": list(self.origins), "created_at": self.created_at}

    @classmethod
    def from_bytes(cls, raw: bytes) -> Tenant:
        doc = orjson.loads(raw)
        return cls(TenantId(doc["tenant"]), tuple(doc["origins"]), float(doc["created_at"]))


class TenantStore:
    """Create, read and list tenants. ``on_change(tenant)`` runs after every change."""

    def __init__(self, backend: MetadataStore, on_change: Callable[[TenantId], None] | None = None) -> None:
        self._backend = backend
        self._on_change = on_change

    async def create(self, name: str, origins: Iterable[str] = ()) -> Tenant:
        """Create a tenant; InvalidRequest if it exists."""
        tenant = Tenant(
            validate_tenant_name(name), _unique(normalize_origin(o) for o in origins), time.time()
        )
        stored = await self._backend.meta_put(
            NAMESPACE, tenant.name, orjson.dumps(tenant.to_dict()), only_if_absent=True
        )
        if not stored:
            raise InvalidRequest(f"tenant {name!r} exists")
        self._changed(tenant.name)
        return tenant

    async def set_origins(self, name: str, origins: Iterable[str]) -> Tenant:
        """Replace a tenant's allowed origins."""
        current = await self.require(name)
        tenant = Tenant(current.name, _unique(normalize_origin(o) for o in origins), current.created_at)
        await self._backend.meta_put(NAMESPACE, tenant.name, orjson.dumps(tenant.to_dict()))
        self._changed(tenant.name)
        return tenant

    async def get(self, name: str) -> Tenant | None:
        raw = await self._backend.meta_get(NAMESPACE, name)
        return None if raw is None else Tenant.from_bytes(raw)

    async def require(self, name: str) -> Tenant:
        """The tenant, or NotFound."""
        tenant = await self.get(name)
        if tenant is None:
            raise NotFound(f"tenant {name!r} not found")
        return tenant

    async def list_all(self) -> list[Tenant]:
        return [Tenant.from_bytes(raw) for _, raw in await self._backend.meta_list(NAMESPACE)]

    def _changed(self, name: TenantId) -> None:
        if self._on_change is not None:
            self._on_change(name)


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))

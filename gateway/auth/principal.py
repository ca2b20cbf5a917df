"""Who a request acts for: a tenant and the scopes its API key or JWT grants."""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Literal

from backend_store.types import TenantId

Action = Literal["manage", "send", "receive", "admin", "metrics"]
Credential = Literal["api_key", "jwt"]


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller. ``subject`` is the API key id or the JWT ``sub``.

    ``via`` says which kind of credential proved it (None: made by code, e.g. a test);
    only ``api_key`` principals may mint tokens. ``expires_at`` is a JWT's ``exp``.
    ``kid`` (a JWT's signing key) and ``key_id`` (the API key itself, or the one a minted
    JWT came from) name the records it depends on, so an open connection can be checked
    again when they are revoked or removed (:meth:`Authenticator.recheck`).
    """

    tenant: TenantId
    scopes: frozenset[str]
    subject: str
    expires_at: float | None = None
    via: Credential | None = None
    kid: str | None = None
    key_id: str | None = None

    def can(self, action: Action, queue: str | None = None) -> bool:
        """Whether a scope allows ``action`` on ``queue``; ``admin`` allows everything."""
        if "admin" in self.scopes:
            return True
        if action in ("admin", "metrics"):
            return action in self.scopes
        prefix = action + ":"
        for scope in self.scopes:
            if scope.startswith(prefix) and (queue is None or fnmatchcase(queue, scope[len(prefix) :])):
                return True
        return False

"""Console sessions: a signed cookie, a CSRF token per session, and the checks on each request.

The cookie holds ``{tenant, subject, operator, csrf, expires}`` and the names of the
records the credential stands on (``key_id``, ``kid``, ``via``), signed with HMAC
(itsdangerous) under a per-data-directory secret; it never holds the key or JWT that
logged in. Every request checks those records again (``ConsoleDeps.recheck``), so a
revoked key ends its sessions at once, not when the cookie expires. It is ``HttpOnly`` (scripts cannot read it), ``SameSite=Strict`` (other
sites' pages cannot send it), ``Secure`` when the gateway serves TLS, and scoped to
``/console``. Every state-changing request must carry the session's CSRF token in a
form field, compared in constant time; a present ``Origin`` header must be our own.
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import asdict, dataclass
from typing import Any

from itsdangerous import BadSignature, URLSafeTimedSerializer
from starlette.requests import Request
from starlette.responses import Response

from .principal import PrincipalLike

COOKIE = "pushgate_console"
COOKIE_PATH = "/console"
# A session lasts at most this long (and never past the JWT that opened it).
MAX_SESSION_S = 8 * 3600


@dataclass(frozen=True, slots=True)
class Session:
    tenant: str
    subject: str
    operator: bool
    csrf: str
    expires: float
    # The records the login credential depends on (see ConsoleDeps.recheck).
    key_id: str | None = None
    kid: str | None = None
    via: str | None = None

    def csrf_ok(self, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(token.encode(), self.csrf.encode())


class SessionCodec:
    def __init__(self, secret: bytes, *, secure: bool) -> None:
        self._serializer = URLSafeTimedSerializer(secret, salt="pushgate-console-session")
        self.secure = secure

    def new(self, principal: PrincipalLike, operator: bool) -> Session:
        limit = time.time() + MAX_SESSION_S
        token_expires = principal.expires_at
        expires = min(limit, token_expires) if token_expires else limit
        return Session(
            principal.tenant,
            principal.subject,
            operator,
            secrets.token_urlsafe(24),
            expires,
            principal.key_id,
            principal.kid,
            principal.via,
        )

    def read(self, request: Request) -> Session | None:
        raw = request.cookies.get(COOKIE)
        if not raw:
            return None
        try:
            doc: dict[str, Any] = self._serializer.loads(raw, max_age=MAX_SESSION_S)
            session = Session(**doc)
        except (BadSignature, TypeError):
            return None
        return session if session.expires > time.time() else None

    def write(self, response: Response, session: Session) -> None:
        response.set_cookie(
            COOKIE,
            self._serializer.dumps(asdict(session)),
            max_age=max(1, int(session.expires - time.time())),
            path=COOKIE_PATH,
            secure=self.secure,
            httponly=True,
            samesite="strict",
        )

    def clear(self, response: Response) -> None:
        response.delete_cookie(COOKIE, path=COOKIE_PATH, secure=self.secure, httponly=True, samesite="strict")


def same_origin(request: Request) -> bool:
    """A browser's ``Origin`` (when sent) names this host: a cross-site form post is refused."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    host = request.headers.get("host", "")
    return origin.split("://", 1)[-1] == host

"""JWT checks that need no store: reading the header, verifying against one key, and claims.

Verification uses PyJWT with ``algorithms=[the key's algorithm]`` only: that is what
refuses ``alg: none`` and algorithm confusion (an HS256 token "signed" with an RSA
public key as the secret). ``exp``, ``sub`` and ``tenant`` are required.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import jwt
import orjson

from backend_store.errors import Unauthorized
from backend_store.types import TenantId

from .jwt_keys import JwtKey, VerificationKey
from .principal import Principal
from .scopes import known_scopes

REQUIRED_CLAIMS = ("exp", "sub", "tenant")


@dataclass(frozen=True, slots=True)
class JwtHeader:
    """What picks the verification key: the header's ``kid`` and ``alg``, the claimed ``tenant``."""

    kid: str
    alg: object
    tenant: str


def read_header(token: str) -> JwtHeader:
    """Parse a JWT without trusting it; Unauthorized if it is not one or lacks kid or tenant.

    Only picks the key: PyJWT parses the token again, and verifies it, in
    :func:`verify_claims`. Parsing here ourselves halves the cost of a JWT.
    """
    parts = token.split(".")
    try:
        if len(parts) != 3:
            raise ValueError("a JWS has three parts")
        header, unverified = (orjson.loads(_b64url(part)) for part in parts[:2])
        if not isinstance(header, dict) or not isinstance(unverified, dict):
            raise ValueError("header and payload must be JSON objects")
    except ValueError as exc:  # binascii.Error and orjson's errors are ValueErrors
        raise Unauthorized("malformed token: neither an API key nor a JWT") from exc
    kid, tenant = header.get("kid"), unverified.get("tenant")
    if not isinstance(kid, str):
        raise Unauthorized("JWT has no kid header")
    if not isinstance(tenant, str):
        raise Unauthorized("JWT has no tenant claim")
    return JwtHeader(kid, header.get("alg"), tenant)


def _b64url(segment: str) -> bytes:
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


def verify_claims(
    token: str,
    key: JwtKey,
    verifier: VerificationKey,
    *,
    audience: str | None,
    leeway_s: float = 0.0,
    header: JwtHeader | None = None,
) -> dict[str, Any]:
    """Verify signature and time claims with one key; return the claims or raise Unauthorized."""
    header = header or read_header(token)
    if header.alg != key.alg:
        raise Unauthorized(f"JWT algorithm {header.alg!r} does not match key {key.kid!r} ({key.alg})")
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            verifier,
            algorithms=[key.alg],
            audience=audience,
            leeway=leeway_s,
            options={"require": list(REQUIRED_CLAIMS), "enforce_minimum_key_length": True},
        )
    except jwt.ExpiredSignatureError as exc:
        raise Unauthorized("JWT expired") from exc
    except jwt.ImmatureSignatureError as exc:
        raise Unauthorized("JWT not valid yet (nbf or iat in the future)") from exc
    except jwt.MissingRequiredClaimError as exc:
        raise Unauthorized(f"JWT lacks the required {exc.claim!r} claim") from exc
    except jwt.InvalidAudienceError as exc:
        if audience is None:
            raise Unauthorized("JWT has an aud claim, and this gateway expects no audience") from exc
        raise Unauthorized(f"JWT audience does not include {audience!r}") from exc
    except jwt.InvalidSignatureError as exc:
        raise Unauthorized(f"JWT signature does not verify with key {key.kid!r}") from exc
    except jwt.InvalidAlgorithmError as exc:
        raise Unauthorized(f"JWT algorithm is not allowed for key {key.kid!r}") from exc
    except jwt.InvalidTokenError as exc:
        raise Unauthorized(f"invalid JWT: {exc}") from exc
    if claims["tenant"] != key.tenant:
        raise Unauthorized("JWT tenant does not match its key's tenant")
    if not isinstance(claims["sub"], str):
        raise Unauthorized("JWT sub must be a string")
    scope = claims.get("scope", "")
    if not (isinstance(scope, str) or (isinstance(scope, list) and all(isinstance(s, str) for s in scope))):
        raise Unauthorized("JWT scope must be a space-separated string")
    return claims


def principal_from_claims(claims: dict[str, Any]) -> Principal:
    """The principal of verified claims; scopes this gateway does not know are dropped."""
    return Principal(
        TenantId(claims["tenant"]),
        known_scopes(claims.get("scope", "")),
        claims["sub"],
        float(claims["exp"]),
        via="jwt",
    )

"""AWS Signature Version 4, verified: the ``Authorization`` header of an SQS request.

Sans-I/O: :func:`parse_authorization` reads the header, :func:`verify` recomputes the
signature from the request and the key's secret (looked up by the caller between the two)
and raises AWS's error when they differ or the request's date is more than
:data:`MAX_SKEW_S` from now. The comparison is constant-time; no secret is ever logged or
put in an error message.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote

from .errors import SqsError

ALGORITHM = "AWS4-HMAC-SHA256"
# AWS refuses a request signed more than 15 minutes from its clock.
MAX_SKEW_S = 15 * 60


@dataclass(frozen=True, slots=True)
class Authorization:
    """The parts of a SigV4 ``Authorization`` header."""

    access_key_id: str
    date: str  # YYYYMMDD of the credential scope
    region: str
    service: str
    signed_headers: tuple[str, ...]
    signature: str

    @property
    def scope(self) -> str:
        return f"{self.date}/{self.region}/{self.service}/aws4_request"


def parse_authorization(header: str | None) -> Authorization:
    """The parts of the header (AWS's MissingAuthenticationToken when there is none)."""
    if not header:
        raise SqsError("MissingAuthenticationToken", "Request is missing Authentication Token")
    algorithm, _, rest = header.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise SqsError("InvalidClientTokenId", "Only AWS4-HMAC-SHA256 signatures are accepted.")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, _, value = part.strip().partition("=")
        fields[name] = value
    credential = fields.get("Credential", "").split("/")
    if len(credential) != 5 or credential[4] != "aws4_request" or "SignedHeaders" not in fields:
        raise SqsError("SignatureDoesNotMatch", "The Authorization header is not a valid SigV4 header.")
    return Authorization(
        access_key_id=credential[0],
        date=credential[1],
        region=credential[2],
        service=credential[3],
        signed_headers=tuple(fields["SignedHeaders"].split(";")),
        signature=fields.get("Signature", ""),
    )


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()


def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    """The derived key AWS signs with for one day, region and service."""
    return _hmac(
        _hmac(_hmac(_hmac(("AWS4" + secret).encode("utf-8"), date), region), service), "aws4_request"
    )


def canonical_query(query: Sequence[tuple[str, str]]) -> str:
    """The query string as SigV4 canonicalises it: each part encoded, sorted."""
    encoded = sorted((quote(k, safe="-_.~"), quote(v, safe="-_.~")) for k, v in query)
    return "&".join(f"{k}={v}" for k, v in encoded)


def canonical_request(
    method: str,
    path: str,
    query: Sequence[tuple[str, str]],
    headers: Mapping[str, str],
    signed_headers: Sequence[str],
    body: bytes,
) -> str:
    """The canonical request of SigV4's step 1 (``headers`` keyed in lower case)."""
    lines = [f"{name}:{' '.join(headers.get(name, '').split())}\n" for name in signed_headers]
    return "\n".join(
        [
            method.upper(),
            quote(path or "/", safe="/-_.~"),
            canonical_query(query),
            "".join(lines),
            ";".join(signed_headers),
            hashlib.sha256(body).hexdigest(),
        ]
    )


def verify(
    auth: Authorization,
    secret: str,
    method: str,
    path: str,
    query: Sequence[tuple[str, str]],
    headers: Mapping[str, str],
    body: bytes,
    now: float,
) -> None:
    """Raise AWS's error unless the request is signed by ``secret`` within the allowed skew."""
    amz_date = headers.get("x-amz-date", "")
    try:
        signed_at = datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise SqsError("SignatureDoesNotMatch", "The request has no valid X-Amz-Date.") from None
    if abs(now - signed_at) > MAX_SKEW_S:
        raise SqsError(
            "SignatureDoesNotMatch", f"Signature expired: {amz_date} is more than 15 minutes from now."
        )
    if not amz_date.startswith(auth.date) or "host" not in auth.signed_headers:
        raise SqsError("SignatureDoesNotMatch", "The credential scope or the signed headers are not valid.")
    request = canonical_request(method, path, query, headers, auth.signed_headers, body)
    to_sign = "\n".join(
        [ALGORITHM, amz_date, auth.scope, hashlib.sha256(request.encode("utf-8")).hexdigest()]
    )
    expected = hmac.new(
        signing_key(secret, auth.date, auth.region, auth.service), to_sign.encode("utf-8"), hashlib.sha256
    ).hexdigest()
    if not hmac.compare_digest(expected, auth.signature):
        raise SqsError(
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided.",
        )

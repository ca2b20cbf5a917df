"""AWS Signature Version 4, verified: the ``Authorization`` header of an SQS request.

Sans-I/O: :func:`parse_authorization` reads the header, :func:`verify` recomputes the
signature from the request and the key's secret (looked up by the caller between the two)
and raises AWS's error when they differ or the request's date is more than
:data:`MAX_SKEW_S` from now. The comparison is constant-time; no secret is ever logged or
put in an error message.

Everything the signature covers is checked, not only the signature (docs/sqs.md,
"Credentials"): the credential scope's date is ``X-Amz-Date``'s date exactly, its service
is ``sqs`` and its region the gateway's when one is configured; ``host`` and ``x-amz-date``
(and on the JSON protocol ``x-amz-target`` and ``content-type``, which choose the action and
how the body is read) are among the signed headers, so none of them can be changed under a
valid signature. A malformed header is AWS's ``IncompleteSignature``; a scope or signature
that does not hold, ``SignatureDoesNotMatch``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote

from .errors import SqsError

ALGORITHM = "AWS4-HMAC-SHA256"
# AWS refuses a request signed more than 15 minutes from its clock.
MAX_SKEW_S = 15 * 60
SERVICE = "sqs"
# Headers every request must sign; the JSON protocol also signs what picks its action and parser.
REQUIRED_SIGNED = ("host", "x-amz-date")
REQUIRED_SIGNED_JSON = (*REQUIRED_SIGNED, "x-amz-target", "content-type")
_DATE = re.compile(r"[0-9]{8}")
_SIGNATURE = re.compile(r"[0-9a-f]{64}")


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
    for name in ("Credential", "SignedHeaders", "Signature"):
        if not fields.get(name):
            raise SqsError("IncompleteSignature", f"Authorization header requires '{name}' parameter.")
    credential = fields["Credential"].split("/")
    if len(credential) != 5 or credential[4] != "aws4_request" or not credential[0]:
        raise SqsError(
            "IncompleteSignature",
            "Credential must have exactly 5 slash-delimited elements, e.g. keyid/date/region/service/aws4_request.",
        )
    return Authorization(
        access_key_id=credential[0],
        date=credential[1],
        region=credential[2],
        service=credential[3],
        signed_headers=tuple(fields["SignedHeaders"].split(";")),
        signature=fields["Signature"],
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
    *,
    region: str | None = None,
    service: str = SERVICE,
    required_headers: Sequence[str] = REQUIRED_SIGNED,
) -> None:
    """Raise AWS's error unless the request is signed by ``secret`` within the allowed skew.

    ``region``: the one region the credential scope may name (None: any); ``service``: the
    one it must name; ``required_headers``: the headers that must be among the signed ones."""
    amz_date = headers.get("x-amz-date", "")
    try:
        signed_at = datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise SqsError(
            "IncompleteSignature", "Authorization header requires existence of a valid 'X-Amz-Date' header."
        ) from None
    if abs(now - signed_at) > MAX_SKEW_S:
        raise SqsError(
            "SignatureDoesNotMatch", f"Signature expired: {amz_date} is more than 15 minutes from now."
        )
    unsigned = [name for name in required_headers if name not in auth.signed_headers]
    if unsigned:
        raise SqsError(
            "IncompleteSignature", f"'{unsigned[0]}' must be a 'SignedHeader' in the AWS Authorization."
        )
    if not _DATE.fullmatch(auth.date) or auth.date != amz_date[:8]:
        raise SqsError(
            "SignatureDoesNotMatch",
            "Date in Credential scope does not match YYYYMMDD from ISO-8601 version of date from HTTP.",
        )
    if auth.service != service:
        raise SqsError(
            "SignatureDoesNotMatch", f"Credential should be scoped to correct service: '{service}'."
        )
    if not auth.region or (region is not None and auth.region != region):
        raise SqsError("SignatureDoesNotMatch", "Credential should be scoped to a valid region.")
    request = canonical_request(method, path, query, headers, auth.signed_headers, body)
    to_sign = "\n".join(
        [ALGORITHM, amz_date, auth.scope, hashlib.sha256(request.encode("utf-8")).hexdigest()]
    )
    expected = hmac.new(
        signing_key(secret, auth.date, auth.region, auth.service), to_sign.encode("utf-8"), hashlib.sha256
    ).hexdigest()
    # A signature is 64 hex digits; anything else cannot match (and compare_digest takes
    # only ASCII strings: a non-ASCII one was a TypeError, a 500).
    if not _SIGNATURE.fullmatch(auth.signature) or not hmac.compare_digest(expected, auth.signature):
        raise SqsError(
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided.",
        )

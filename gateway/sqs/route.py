"""``POST /`` for the SQS API: authenticate by SigV4, parse, run the action, answer as AWS.

Two protocols share the route and the actions: the AWS JSON 1.0 protocol (an
``X-Amz-Target: AmazonSQS.<Action>`` header, JSON in and out; :mod:`gateway.sqs.protocol`)
and the query protocol (``Action=...`` form fields in, XML out;
:mod:`gateway.sqs.query_protocol`). The protocol is told from the headers first, so that
even an authentication failure is answered in the client's own protocol.

No SQS request acts without a verified signature: an unsigned request, an unknown access
key id, a revoked key, a wrong signature or an old date is refused (403) before the action
is even looked at (everything the signature covers is checked: ``sigv4.py``), and no action
sees parameters that do not fit its declared shape (``shapes.py``). Errors are AWS's
(``gateway/sqs/errors.py``); a Pushgate error raised by a backend call is mapped there, in
one place.
"""

from __future__ import annotations

import time
import uuid
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from backend_store.errors import PushgateError, Unauthorized

from ..auth.principal import Principal
from ..body import read_body
from ..routes.endpoint import route
from ..services import GatewayServices
from . import query_protocol
from .actions import SqsActions
from .errors import SqsError
from .protocol import SqsRequest, parse_request, response
from .shapes import check_params
from .sigv4 import REQUIRED_SIGNED, REQUIRED_SIGNED_JSON, Authorization, parse_authorization, verify


class SqsRoute:
    """The SQS API's one route on the gateway's own port."""

    def __init__(self, services: GatewayServices) -> None:
        self.services = services
        self.actions = SqsActions(services)

    def routes(self) -> list[BaseRoute]:
        return [route("/", self.handle, "POST", self.services.metrics)]

    async def handle(self, request: Request) -> Response:
        headers = {k.lower(): v for k, v in request.headers.items()}
        query = query_protocol.is_query_request(headers)
        request_id = str(uuid.uuid4())
        try:
            body = await read_body(request, self.services.settings.max_request_bytes)
            principal = await self._authenticate(request, headers, body, query)
            sqs_request = self._parse(query, headers, body)
            check_params(sqs_request.action, sqs_request.params)
            base = str(request.base_url)
            result = await self.actions.table[sqs_request.action](principal, sqs_request.params, base)
            if query:
                status, out_headers, out = query_protocol.response(sqs_request.action, result, request_id)
            else:
                status, out_headers, out = response(result)
        except PushgateError as exc:
            status, out_headers, out = self._error(query, SqsError.from_pushgate(exc), request_id)
        except SqsError as exc:
            status, out_headers, out = self._error(query, exc, request_id)
        return Response(out, status_code=status, headers=out_headers)

    @staticmethod
    def _parse(query: bool, headers: dict[str, str], body: bytes) -> SqsRequest:
        if not query:
            return parse_request(headers, body)
        try:
            fields = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
        except UnicodeDecodeError:
            raise SqsError("InvalidParameterValue", "The request body is not UTF-8 form data.") from None
        return query_protocol.parse_query_request(fields)

    @staticmethod
    def _error(query: bool, error: SqsError, request_id: str) -> tuple[int, dict[str, str], bytes]:
        if query:
            return query_protocol.error_response(error, request_id)
        return error.response()

    async def _authenticate(
        self, request: Request, headers: dict[str, str], body: bytes, query_request: bool
    ) -> Principal:
        auth = parse_authorization(headers.get("authorization"))
        try:
            return await self._verify(request, headers, body, auth, query_request)
        except SqsError as exc:
            self.services.authenticator.failures.note(
                auth.access_key_id, f"SQS {exc.aws.type}: {exc.message}"
            )
            raise

    async def _verify(
        self, request: Request, headers: dict[str, str], body: bytes, auth: Authorization, query_request: bool
    ) -> Principal:
        try:
            found = await self.services.authenticator.authenticate_aws(auth.access_key_id)
        except Unauthorized:
            found = None  # a revoked key: as AWS answers an unknown one
        if found is None:
            raise SqsError("InvalidClientTokenId", "The security token included in the request is invalid.")
        principal, secret = found
        query = [(k, v) for k, v in request.query_params.multi_items()]
        verify(
            auth,
            secret,
            request.method,
            request.url.path,
            query,
            headers,
            body,
            time.time(),
            region=self.services.settings.sqs_region,
            required_headers=REQUIRED_SIGNED if query_request else REQUIRED_SIGNED_JSON,
        )
        return principal

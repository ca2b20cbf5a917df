"""docs/api.md's error table and the HTTP edges: problem documents, 401/404/405/413/415, malformed JSON."""

from __future__ import annotations

import logging
import socket

import httpx
import pytest

from tests.conftest import scaled

from .conftest import Api, RunningGateway, problem_code


def test_missing_token_is_401_with_www_authenticate(anon: Api, qname: str) -> None:
    for r in (
        anon.client.get("/v1/queues"),
        anon.put_queue(qname),
        anon.send(qname),
        anon.client.post("/v1/tokens", json={}),
    ):
        assert problem_code(r, 401) == "unauthorized"
        assert r.headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "header",
    ["Bearer", "Bearer  x", "Basic dXNlcjpwYXNz", "Bearer pgk_0000000000000000_" + "A" * 43, "Bearer x.y.z"],
)
def test_bad_tokens_are_401(gateway: RunningGateway, header: str) -> None:
    r = httpx.get(f"{gateway.url}/v1/queues", headers={"Authorization": header})
    assert problem_code(r, 401) == "unauthorized"


def test_revoked_key_is_401(gateway: RunningGateway) -> None:
    token = gateway.make_key("send:*")
    headers = {"Authorization": f"Bearer {token}"}
    assert httpx.get(f"{gateway.url}/v1/queues", headers=headers).status_code == 200
    key_id = token.split("_")[1]
    gateway.call(gateway.services.authenticator.api_keys.revoke(key_id))
    assert problem_code(httpx.get(f"{gateway.url}/v1/queues", headers=headers), 401) == "unauthorized"


def test_failed_authentications_are_logged_once_a_minute_per_key_id(
    gateway: RunningGateway, caplog: pytest.LogCaptureFixture
) -> None:
    token = gateway.make_key("send:*")
    key_id = token.split("_")[1]
    wrong = {"Authorization": f"Bearer pgk_{key_id}_{'A' * 43}"}
    with caplog.at_level(logging.WARNING, logger="pushgate.auth"):
        for _ in range(10):
            assert problem_code(httpx.get(f"{gateway.url}/v1/queues", headers=wrong), 401) == "unauthorized"
    lines = [r.getMessage() for r in caplog.records if r.name == "pushgate.auth"]
    assert len(lines) == 1 and key_id in lines[0], lines
    # Never the secret: all of it after the key id (a base64url secret may hold "_": its
    # first piece alone, one character or two, was found in "invalid API key" once).
    assert token.split("_", 2)[2] not in lines[0]


def test_unknown_route_is_404_problem(admin: Api, anon: Api) -> None:
    for r in (
        admin.client.get("/v2/nothing"),
        anon.client.get("/nothing"),
        admin.client.post("/v1/queues/a/b/c"),
    ):
        assert problem_code(r, 404) == "not_found"


def test_wrong_method_is_405_problem_with_allow(admin: Api, qname: str) -> None:
    r = admin.client.get(f"/v1/queues/{qname}/receive")
    assert problem_code(r, 405) == "method_not_allowed"
    assert r.headers["allow"] == "POST"
    assert problem_code(admin.client.post("/v1/queues"), 405) == "method_not_allowed"
    # Allow lists every method served on the path, not only the first route's.
    r = admin.client.post(f"/v1/queues/{qname}")
    assert problem_code(r, 405) == "method_not_allowed"
    assert r.headers["allow"] == "DELETE, GET, HEAD, PATCH, PUT"
    assert problem_code(admin.client.post("/healthz"), 405) == "method_not_allowed"


def test_wrong_content_type_is_415(admin: Api, qname: str) -> None:
    admin.put_queue(qname)
    url = f"/v1/queues/{qname}/messages"
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        r = admin.client.post(url, content=b'{"body": "a"}', headers={"Content-Type": content_type})
        assert problem_code(r, 415) == "unsupported_media_type"
    r = admin.client.post(
        url, content=b'{"body": "a"}', headers={"Content-Type": "application/json; charset=utf-8"}
    )
    assert r.status_code == 201
    no_type = admin.client.post(url, content=b'{"body": "a"}')
    assert problem_code(no_type, 415) == "unsupported_media_type"


@pytest.mark.parametrize("raw", [b"{", b'{"body": "a",}', b"\xff\xfe", b"nul", b'{"body": "a"} trailing'])
def test_malformed_json_is_400(admin: Api, qname: str, raw: bytes) -> None:
    admin.put_queue(qname)
    r = admin.client.post(
        f"/v1/queues/{qname}/messages", content=raw, headers={"Content-Type": "application/json"}
    )
    assert problem_code(r, 400) == "invalid_request"


def test_empty_send_body_is_400(admin: Api, qname: str) -> None:
    admin.put_queue(qname)
    r = admin.client.post(
        f"/v1/queues/{qname}/messages", content=b"", headers={"Content-Type": "application/json"}
    )
    assert problem_code(r, 400) == "invalid_request"


def test_oversized_body_is_413_by_content_length(gateway: RunningGateway, admin: Api, qname: str) -> None:
    admin.put_queue(qname)
    big = b'{"body": "' + b"x" * gateway.settings.max_request_bytes + b'"}'
    r = admin.client.post(
        f"/v1/queues/{qname}/messages", content=big, headers={"Content-Type": "application/json"}
    )
    assert problem_code(r, 413) == "request_too_large"


def test_oversized_chunked_body_is_413_before_it_ends(
    gateway: RunningGateway, admin: Api, qname: str
) -> None:
    # No Content-Length: the gateway has to count as it streams. The client sends a little
    # past the cap and then neither ends the body nor closes: the 413 must come anyway (a
    # gateway that checked only at the end would wait for the rest forever).
    limit = gateway.settings.max_request_bytes
    assert admin.put_queue(qname).status_code == 201
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=scaled(10)) as sock:
        sock.sendall(
            (
                f"POST /v1/queues/{qname}/messages HTTP/1.1\r\nHost: test\r\n"
                f"Authorization: Bearer {gateway.admin_key}\r\nContent-Type: application/json\r\n"
                "Transfer-Encoding: chunked\r\n\r\n"
            ).encode()
        )
        chunk = b"x" * 65536
        sent = 0
        while sent <= limit:
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent += len(chunk)
        head = b""
        while b"\r\n\r\n" not in head:
            data = sock.recv(65536)  # times out (fails) if the gateway waits for the body's end
            assert data, "the gateway closed without answering"
            head += data
    status_line = head.split(b"\r\n", 1)[0]
    assert status_line.startswith(b"HTTP/1.1 413"), head[:300]
    assert sent < limit + 2 * len(chunk)


def test_problem_documents_have_the_rfc9457_shape(admin: Api, qname: str) -> None:
    r = admin.client.get(f"/v1/queues/{qname}")
    doc = r.json()
    assert doc["type"] == "https://pushgate.dev/problems/queue_not_found"
    assert doc["title"] == "Queue not found" and doc["status"] == 404 and doc["detail"]


def test_non_object_bodies_are_400(admin: Api, qname: str) -> None:
    admin.put_queue(qname)
    for path in ("receive", "ack", "nack", "visibility"):
        r = admin.client.post(f"/v1/queues/{qname}/{path}", json=[1])
        assert problem_code(r, 400) == "invalid_request", path

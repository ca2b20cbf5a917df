"""Narrow keys stay narrow on /v1 (issue 47): changing a queue needs ``manage:``, and a
dead-letter target must be a queue the caller may ``manage:`` or ``send:`` to."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

import httpx
import pytest

from .conftest import Api, RunningGateway, api_for, problem_code


@pytest.fixture
def key(gateway: RunningGateway) -> Iterator[Callable[[str], Api]]:
    """A client holding a new API key of tenant ``default`` with the given scopes."""
    with ExitStack() as clients:
        yield lambda scopes: clients.enter_context(contextmanager(api_for)(gateway, gateway.make_key(scopes)))


def _mint(gateway: RunningGateway, scopes: str) -> str:
    """A browser's token: minted from an API key holding ``scopes``."""
    minted = httpx.post(
        f"{gateway.url}/v1/tokens",
        json={"scope": scopes, "ttl_s": 600},
        headers={"Authorization": f"Bearer {gateway.make_key(scopes)}"},
    )
    assert minted.status_code == 201, minted.text
    token: str = minted.json()["token"]
    return token


def test_a_send_key_cannot_route_its_queue_into_another(
    key: Callable[[str], Api], admin: Api, qname: str
) -> None:
    q1, q2 = f"{qname}-1", f"{qname}-2"
    admin.put_queue(q1)
    admin.put_queue(q2)
    sender = key(f"send:{q1}")
    assert problem_code(sender.send(q2), 403) == "forbidden"
    # The probe: a dead-letter queue it may not send to, one receive and the message is moved there.
    attack = {"dead_letter_queue": q2, "max_receives": 1, "visibility_timeout_s": 0}
    assert problem_code(sender.client.patch(f"/v1/queues/{q1}", json=attack), 403) == "forbidden"
    # Nothing changed: the queue has no dead-letter queue.
    assert admin.client.get(f"/v1/queues/{q1}").json()["attributes"]["dead_letter_queue"] is None


def test_a_browsers_receive_token_cannot_reconfigure_its_queue(
    gateway: RunningGateway, admin: Api, qname: str
) -> None:
    inbox, other = f"{qname}-inbox", f"{qname}-other"
    admin.put_queue(inbox)
    admin.put_queue(other)
    for browser in api_for(gateway, _mint(gateway, f"receive:{inbox}")):
        for change in (
            {"retention_s": 60},
            {"visibility_timeout_s": 0},
            {"dead_letter_queue": other, "max_receives": 1},
        ):
            assert problem_code(browser.client.patch(f"/v1/queues/{inbox}", json=change), 403) == "forbidden"
        assert problem_code(browser.put_queue(inbox, retention_s=60), 403) == "forbidden"
        assert problem_code(browser.client.post(f"/v1/queues/{inbox}/purge"), 403) == "forbidden"
        assert problem_code(browser.client.delete(f"/v1/queues/{inbox}"), 403) == "forbidden"
        # Defining it as it is changes nothing: any scope on the queue may (start-up code does).
        assert browser.put_queue(inbox).status_code == 200
    assert admin.client.get(f"/v1/queues/{inbox}").json()["attributes"]["retention_s"] == 345600


def test_manage_creates_changes_purges_and_deletes_only_what_it_names(
    key: Callable[[str], Api], admin: Api, qname: str
) -> None:
    manager = key(f"manage:{qname}-*")
    mine, theirs = f"{qname}-a", f"other-{qname}"
    assert manager.put_queue(mine, delay_s=1).status_code == 201
    assert manager.put_queue(mine, delay_s=1).status_code == 200
    assert problem_code(manager.put_queue(mine, delay_s=2), 409) == "queue_exists"
    assert (
        manager.client.patch(f"/v1/queues/{mine}", json={"delay_s": 2}).json()["attributes"]["delay_s"] == 2
    )
    assert problem_code(manager.put_queue(theirs), 403) == "forbidden"
    admin.put_queue(theirs)
    assert problem_code(manager.client.patch(f"/v1/queues/{theirs}", json={"delay_s": 1}), 403) == "forbidden"
    # manage: alone neither sends nor receives.
    assert problem_code(manager.send(mine), 403) == "forbidden"
    assert problem_code(manager.receive(mine), 403) == "forbidden"
    admin.send(mine, "x")
    assert manager.client.post(f"/v1/queues/{mine}/purge").json() == {"purged": 1}
    assert manager.client.get(f"/v1/queues/{mine}").status_code == 200  # manage: reads it too
    assert mine in {q["name"] for q in manager.client.get("/v1/queues").json()["queues"]}
    assert manager.client.delete(f"/v1/queues/{mine}").status_code == 204
    assert problem_code(manager.client.delete(f"/v1/queues/{theirs}"), 403) == "forbidden"


def test_a_dead_letter_target_needs_manage_or_send_on_it(
    key: Callable[[str], Api], admin: Api, qname: str
) -> None:
    source, dlq_sent, dlq_managed, dlq_read = (f"{qname}-{s}" for s in ("src", "dlq1", "dlq2", "dlq3"))
    for name in (dlq_sent, dlq_managed, dlq_read):
        admin.put_queue(name)
    manager = key(f"manage:{source} send:{dlq_sent} manage:{dlq_managed} receive:{dlq_read}")
    refused = manager.put_queue(source, dead_letter_queue=dlq_read, max_receives=3)
    assert problem_code(refused, 403) == "forbidden"
    assert dlq_read in refused.json()["detail"]
    assert problem_code(admin.client.get(f"/v1/queues/{source}"), 404) == "queue_not_found"  # not created
    assert manager.put_queue(source, dead_letter_queue=dlq_sent, max_receives=3).status_code == 201
    patch = {"dead_letter_queue": dlq_read, "max_receives": 3}
    assert problem_code(manager.client.patch(f"/v1/queues/{source}", json=patch), 403) == "forbidden"
    patch["dead_letter_queue"] = dlq_managed
    assert manager.client.patch(f"/v1/queues/{source}", json=patch).status_code == 200
    # A key without manage: may still define the queue as it is, dead-letter queue and all.
    sender = key(f"send:{source}")
    assert sender.put_queue(source, dead_letter_queue=dlq_managed, max_receives=3).status_code == 200

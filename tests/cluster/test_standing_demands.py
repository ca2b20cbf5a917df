"""The gateway's standing-receive bookkeeping (``backend_store/cluster/client/standing.py``), no I/O:
which registration a delivery answers, when a dispatcher must be woken once more, and how
long a withdrawn registration still takes its late deliveries."""

from __future__ import annotations

from backend_store.cluster.client.standing import StandingDemands
from backend_store.cluster.protocol.wire import Delivery
from backend_store.types import QueueName, TenantId

T, Q = TenantId("t"), QueueName("jobs")


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_delivery_is_matched_to_its_registration_even_after_a_withdrawal() -> None:
    clock = Clock()
    demands = StandingDemands(late_grace_s=10, clock=clock)
    first, second = (lambda m: None), (lambda m: None)
    old = demands.register(T, Q, 5, None, first, [])
    new = demands.register(T, Q, 5, None, second, [])  # replaces the first
    assert demands.current == 1
    demands.withdraw(T, Q, first)  # not the current one's callback: nothing happens
    assert demands.current == 1
    assert demands.delivered(Delivery(old.id, 3, T, Q, ())) is old  # late, still answered
    assert demands.delivered(Delivery(new.id, 3, T, Q, ())) is new
    assert demands.delivered(Delivery(new.id, 3, T, QueueName("other"), ())) is None
    demands.withdraw(T, Q, second)
    assert demands.current == 0
    clock.now += 11
    demands.register(T, QueueName("other"), 1, None, first, [])  # prunes what is past the grace
    assert demands.delivered(Delivery(old.id, 3, T, Q, ())) is None
    assert demands.delivered(Delivery(new.id, 3, T, Q, ())) is None


def test_a_short_delivery_wakes_again_only_for_what_it_does_not_cover() -> None:
    demands = StandingDemands(clock=Clock())
    deliver = lambda m: None  # noqa: E731
    registration = demands.register(T, Q, 5, None, deliver, [])
    # Its own partition's wake-ups are covered by its answer; a full answer looks again anyway.
    demands.saw_notify(1, T, Q)
    assert not demands.look_again(registration, 1, 2)
    assert not demands.look_again(registration, 2, 5)
    # Another partition said "more is there" since the registration: that is not covered.
    assert demands.look_again(registration, 2, 2)
    # Another queue's wake-ups are not this registration's business.
    other = demands.register(T, QueueName("other"), 5, None, deliver, [])
    demands.saw_notify(4, T, Q)
    assert not demands.look_again(other, 1, 0)
    # After the withdrawal, a short late delivery always wakes the dispatcher once more.
    demands.withdraw(T, QueueName("other"), deliver)
    assert demands.look_again(other, 1, 0)
    assert not demands.look_again(other, 1, 5)

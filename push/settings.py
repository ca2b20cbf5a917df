"""Knobs of the delivery engine and its transports, with the defaults docs/api.md implies."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PushSettings:
    """Bounds and timings for subscriptions, connections and dispatchers.

    Byte bounds are counted on encoded frames, so memory per connection is bounded by
    ``send_buffer_bytes`` plus one receive frame of ``max_frame_bytes``.
    """

    default_prefetch: int = 10
    max_prefetch: int = 1000
    max_batch: int = 100
    # One backend receive takes at most this many messages, whatever the credit.
    max_receive: int = 100
    # Unsent frames a connection may buffer; twice this behind a blocked socket closes it
    # at once (4008), so memory per connection stays bounded.
    send_buffer_bytes: int = 4 * 1024 * 1024
    # Slow consumers (see docs/push.md), closed with 4008 and their messages released:
    # a socket that has not taken a frame handed to it for this long ...
    write_timeout_s: float = 5.0
    # ... or a subscription whose oldest unacked message timed out this long ago with no
    # word from the client since it was sent (not reading). None: never; a timed-out
    # message then gives its credit back whether or not the client spoke (as in SQS).
    stall_grace_s: float | None = 1.0
    # How often the watchdog looks for both, and for expired credentials.
    watchdog_interval_s: float = 0.5
    # How often open connections' credentials are checked again against the store, so a
    # revoked API key or a removed JWT key ends them (4001) this long after at most.
    recheck_interval_s: float = 2.0
    max_frame_bytes: int = 1024 * 1024
    auth_timeout_s: float = 10.0
    # SSE comment pings; docs/api.md asks for one at least every 15 s.
    ping_interval_s: float = 15.0
    sse_retry_ms: int = 2000
    # How long a disconnected SSE stream's unacked messages wait for a reconnect with
    # Last-Event-ID before they are released anyway.
    sse_resume_grace_s: float = 5.0
    # Idle dispatchers and long-polls sleep on wake-ups; this caps the sleep as a safety net.
    safety_poll_s: float = 5.0
    # The shortest idle sleep, so a clock skew never turns into a busy loop.
    min_poll_s: float = 0.002
    max_subscriptions_per_connection: int = 100
    # Sends/acks/nacks of one WebSocket awaiting the store before it stops reading more.
    max_pending_requests: int = 1000
    # "Keeps on" (docs/throttling.md): a WebSocket whose requests are refused by a rate
    # limit this many times in a row, each answered with an error frame carrying
    # retry_after_s, is closed with 4008. An allowed request resets the count.
    rate_limited_frames: int = 5
    subprotocol: str = "pushgate.v1"

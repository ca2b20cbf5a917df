"""Limits of the public API, each named once.

The store enforces them; the HTTP routes, the WebSocket and SSE protocols, the queue
attribute bounds and the OpenAPI document all read them from here, so a limit cannot
differ between transports. Values follow Amazon SQS where docs/api.md is silent.
"""

from __future__ import annotations

# Visibility timeouts, visibility extensions and nack delays (12 hours, as SQS).
MAX_VISIBILITY_S = 43200
# A message's delivery delay and a queue's default delay (15 minutes, as SQS).
MAX_DELAY_S = 900
# Messages per send and per receive call, over HTTP and WebSocket.
MAX_BATCH = 100
# Receipts per ack or nack call, over HTTP and WebSocket.
MAX_RECEIPTS = 1000
# Characters of one receipt (they are ~40; longer is never one of ours).
MAX_RECEIPT_CHARS = 1024
# Long-poll wait of one receive (20 s, as SQS).
MAX_WAIT_S = 20
# Characters of a dedupe id, group id, Idempotency-Key or request id.
MAX_ID_CHARS = 128
# Message attributes: how many, and characters of each name and value.
MAX_ATTRIBUTES = 32
MAX_ATTRIBUTE_CHARS = 1024
# Messages one store receive may take (push dispatchers ask for their subscribers' credit).
MAX_RECEIVE_PER_CALL = 1000

"""Push delivery: subscriptions with credits, per-queue dispatchers and the WS/SSE transports.

Imports ``backend_store`` only; the gateway injects authentication (see
:mod:`push.principal`) and mounts :class:`WebSocketHandler` and :class:`SseHandler`.
"""

from .ack_tracking import AckTrackingBackend
from .close_codes import CloseCode, should_reconnect
from .engine import Connection, PushEngine
from .principal import Authenticate, CheckOrigin, PrincipalLike
from .settings import PushSettings
from .sse_handler import SseHandler
from .wakeup import WakeupHub
from .ws_handler import WebSocketHandler

__all__ = [
    "AckTrackingBackend",
    "Authenticate",
    "CheckOrigin",
    "CloseCode",
    "Connection",
    "PrincipalLike",
    "PushEngine",
    "PushSettings",
    "SseHandler",
    "WakeupHub",
    "WebSocketHandler",
    "should_reconnect",
]

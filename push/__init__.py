"""Push delivery: subscriptions with credits, per-queue dispatchers, long-polls and the
WS/SSE transports.

Imports ``backend_store`` only; the gateway injects authentication (see
:mod:`push.principal`) and mounts :class:`WebSocketHandler` and :class:`SseHandler`.
"""

from .close_codes import CloseCode, should_reconnect
from .engine import PushEngine
from .principal import Authenticate, CheckOrigin, PrincipalLike, Recheck
from .settings import PushSettings
from .sse_handler import SseHandler
from .subscription import Connection
from .wakeup import WakeupHub
from .ws_handler import WebSocketHandler

__all__ = [
    "Authenticate",
    "CheckOrigin",
    "CloseCode",
    "Connection",
    "PrincipalLike",
    "PushEngine",
    "PushSettings",
    "Recheck",
    "SseHandler",
    "WakeupHub",
    "WebSocketHandler",
    "should_reconnect",
]

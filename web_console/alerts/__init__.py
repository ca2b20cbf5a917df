"""Alerts: rules with thresholds per queue or tenant, evaluated on every monitor sample.

The evaluation knows no HTTP: the gateway's admin API, ``pushgate admin alerts`` and
the console all go through :class:`AlertEngine` and :class:`RuleStore`.
"""

from .engine import Alert, AlertEngine, AlertEvent
from .rules import KINDS, QUEUE_KINDS, SYSTEM_KINDS, THRESHOLD_MEANING, AlertRule, parse_rule
from .shared import SharedAlerts
from .store import RuleStore
from .webhook import WebhookNotifier

__all__ = [
    "KINDS",
    "QUEUE_KINDS",
    "SYSTEM_KINDS",
    "THRESHOLD_MEANING",
    "Alert",
    "AlertEngine",
    "AlertEvent",
    "AlertRule",
    "RuleStore",
    "SharedAlerts",
    "WebhookNotifier",
    "parse_rule",
]

"""Gateway settings: one frozen object built from CLI flags and ``PUSHGATE_*`` environment.

Flags win over the environment, the environment over defaults. Nothing here is global:
:func:`gateway.app.create_app` takes a :class:`Settings` and everything else gets what it
needs from the app's services object.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from backend_store.encryption import ENV_VAR as ENCRYPTION_KEYS_ENV
from backend_store.encryption import Keyring
from backend_store.errors import ConfigurationError
from backend_store.options import StoreOptions
from backend_store.tls_reload import RELOAD_EVERY_S
from push.settings import PushSettings
from throttling import InvalidLimit, Strategy, parse_shared_state_url
from throttling.limiter import STRATEGIES

ENV_PREFIX = "PUSHGATE_"
STORE_SUBDIR = "store"


def default_store_url(data_dir: Path) -> str:
    """The embedded store of a data directory; ``pushgate admin --data DIR`` opens the same one."""
    return f"lmdb://{(data_dir / STORE_SUBDIR).resolve()}"


@dataclass(frozen=True, slots=True)
class Settings:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 8080
    # None: the embedded store inside data_dir (see default_store_url).
    store_url: str | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # How often the certificate files are looked at for a renewal, loaded without a restart
    # (backend_store/tls_reload.py; SIGHUP looks at once).
    tls_reload_interval_s: float = RELOAD_EVERY_S
    encryption_key_file: Path | None = None
    # The key document itself, from PUSHGATE_ENCRYPTION_KEYS; kept out of repr so it is never logged.
    encryption_keys: str | None = field(default=None, repr=False)
    # Whole request bodies past this are refused with 413 before they are read whole.
    # A batch of 100 messages or one 1 MiB message in base64 fits.
    max_request_bytes: int = 4 * 1024 * 1024
    # Room on the embedded store's disk that sends may not use, so consumers can still drain
    # a full disk (docs/store.md, "Full disk or map"); None: 2% of the disk, 1 MiB to 1 GiB.
    disk_reserve_mib: int | None = None
    # Queue metadata is cached this long at most (another gateway or `pushgate admin` may change it).
    queue_cache_ttl_s: float = 5.0
    log_level: str = "warning"
    # In-flight requests get this long to finish on shutdown.
    graceful_timeout_s: int = 10
    # The `aud` a JWT must carry; None: tokens must carry no `aud` (see docs/auth.md).
    jwt_audience: str | None = None
    # The region SQS requests must be signed for (their credential scope's); None: any region,
    # as Pushgate has none of its own (docs/sqs.md, "Credentials").
    sqs_region: str | None = None
    # Operations (docs/metrics.md, docs/console.md). An extra listener for /metrics without
    # a token, for a private network ("HOST:PORT"); None: only the main port, with a token.
    metrics_listen: str | None = None
    # Queues with series of their own in /metrics; the rest are summed under "_other".
    metrics_queue_series: int = 100
    # The monitor samples every queue's stats this often (and soon after sends); alerts are
    # evaluated on each sample.
    monitor_interval_s: float = 5.0
    # Alert transitions are POSTed here as JSON (retried with backoff); None: no webhook.
    alert_webhook_url: str | None = None
    # Admins of this tenant are the operators: system alert rules (map use, cluster nodes)
    # and the console's nodes page are theirs.
    operator_tenant: str = "default"
    # Print the bootstrap admin key on start-up (the CLI does; tests read it from the app state).
    announce_bootstrap: bool = False
    # WebSocket keepalive: a ping this often; a peer that does not answer within the timeout
    # is dead and closed with 1011 (see docs/push.md).
    ws_ping_interval_s: float = 20.0
    ws_ping_timeout_s: float = 20.0
    # Usage records are flushed to the usage directory this often (and at each UTC hour); 0
    # turns usage recording off (see docs/usage.md).
    usage_flush_interval_s: float = 10.0
    # Where usage files go; None: <data>/usage. Several gateways may share one (an NFS mount):
    # every file is named by its gateway.
    usage_dir: Path | None = None
    # Names this gateway's usage files (a random suffix is added per start); default: the host name.
    gateway_name: str | None = None
    # The delivery engine's knobs (credits, slow consumers, rechecks); code and tests only.
    push: PushSettings = field(default_factory=PushSettings)
    # Shared state between gateways (rate-limit counters, wake-ups, cache invalidations,
    # the dedupe front): None or memory:// keeps it in this process; redis://host:port shares it.
    redis_url: str | None = None
    # When Redis is unreachable: "open" serves without rate limits, "closed" answers 503.
    redis_fail: str = "open"
    # "sliding-window-counter" (default) or "moving-window"; see docs/throttling.md.
    rate_limit_strategy: str = "sliding-window-counter"
    # Tenants' limits documents are cached this long (changes through Redis apply at once).
    limits_cache_ttl_s: float = 5.0
    # One log line per request (uvicorn's access log, logger "uvicorn.access"); off: it costs
    # more than the rest of a small request.
    access_log: bool = False

    @property
    def resolved_store_url(self) -> str:
        return self.store_url or default_store_url(self.data_dir)

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def strategy(self) -> Strategy:
        return "moving-window" if self.rate_limit_strategy == "moving-window" else "sliding-window-counter"

    def keyring(self) -> Keyring | None:
        """The encryption keyring: the key file if given, else the environment's key document."""
        if self.encryption_key_file is not None:
            return Keyring.from_file(self.encryption_key_file)
        if self.encryption_keys:
            return Keyring.from_json(self.encryption_keys)
        return None

    def store_options(self) -> StoreOptions:
        reserve = None if self.disk_reserve_mib is None else self.disk_reserve_mib * 1024 * 1024
        return StoreOptions(keyring=self.keyring(), disk_reserve_bytes=reserve)

    @staticmethod
    def env_var(name: str) -> str:
        """The environment variable of a field (``PUSHGATE_<FIELD>``)."""
        return ENCRYPTION_KEYS_ENV if name == "encryption_keys" else ENV_PREFIX + name.upper()

    def check(self) -> Settings:
        """Raise :class:`ConfigurationError` for settings that cannot work together."""
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigurationError("--tls-cert and --tls-key go together")
        if not 0 <= self.port <= 65535:
            raise ConfigurationError("port must be 0-65535")
        if self.metrics_queue_series < 0:
            raise ConfigurationError("metrics_queue_series must be 0 or more")
        if self.monitor_interval_s <= 0:
            raise ConfigurationError("monitor_interval_s must be positive")
        if self.usage_flush_interval_s < 0:
            raise ConfigurationError("usage_flush_interval_s must be 0 (off) or positive")
        if self.disk_reserve_mib is not None and self.disk_reserve_mib < 1:
            raise ConfigurationError("disk_reserve_mib must be at least 1")
        if self.max_request_bytes < 1024:
            raise ConfigurationError("max_request_bytes must be at least 1024")
        if self.redis_fail not in ("open", "closed"):
            raise ConfigurationError("redis_fail must be open or closed")
        if self.rate_limit_strategy not in STRATEGIES:
            raise ConfigurationError(f"rate_limit_strategy must be one of {', '.join(STRATEGIES)}")
        try:
            parse_shared_state_url(self.redis_url)
        except InvalidLimit as exc:
            raise ConfigurationError(exc.detail) from None
        return self

    @classmethod
    def from_sources(cls, flags: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> Settings:
        """Build settings from flags (None means not given) over ``PUSHGATE_<FIELD>`` environment variables."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw: Any = flags.get(f.name)
            if raw is None:
                raw = env.get(cls.env_var(f.name))
            if raw is None:
                continue
            values[f.name] = _convert(f.name, f.type, raw)
        if "data_dir" not in values:
            raise ConfigurationError("a data directory is required (--data or PUSHGATE_DATA_DIR)")
        return cls(**values).check()

    def with_changes(self, **changes: Any) -> Settings:
        return replace(self, **changes).check()


def _convert(name: str, annotation: Any, raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw
    kind = str(annotation)
    try:
        if "Path" in kind:
            return Path(raw)
        if kind.startswith("int"):
            return int(raw)
        if kind.startswith("float"):
            return float(raw)
        if kind.startswith("bool"):
            return raw.strip().lower() in ("1", "true", "yes", "on")
    except ValueError:
        raise ConfigurationError(f"bad value for {name}: {raw!r}") from None
    return raw

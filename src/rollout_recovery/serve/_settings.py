"""What one ``rollout-recovery serve`` process serves, and where."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from .._unix_http import unix_server_url
from ..errors import InvalidArgumentError

__all__ = [
    "DEFAULT_KEEP_ALIVE_TIMEOUT_S",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_INFLIGHT_BODY_BYTES",
    "DEFAULT_MAX_MODEL_LEN",
    "DEFAULT_MODEL_NAME",
    "DEFAULT_READ_TIMEOUT_S",
    "DEFAULT_WRITE_TIMEOUT_S",
    "ServeSettings",
]

DEFAULT_MODEL_NAME = "rollout-recovery-numpy"
DEFAULT_MAX_MODEL_LEN = 512
# A weight push of the numpy policy is a few kilobytes; 64 MiB leaves room for a larger policy
# while a runaway client cannot make the server buffer gigabytes.
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
# The cap is per request; this bounds them all together (read, decoded, answered): two
# bodies at the cap at once, where twelve took a server from 57 MB to 778 MB.
DEFAULT_MAX_INFLIGHT_BODY_BYTES = 2 * DEFAULT_MAX_BODY_BYTES
# One thread per connection: a job holds a few per server (its per-server concurrency,
# 16 by default, plus probes and weight pushes); 300 idle ones made 303 threads.
DEFAULT_MAX_CONNECTIONS = 128
# An idle keep-alive connection is closed after this long: longer than a client's own
# keep-alive expiry (httpx: 5 s), so a client seldom reuses a connection being closed.
DEFAULT_KEEP_ALIVE_TIMEOUT_S = 10.0
# A request (its line, headers and body, from its first byte) must arrive within this,
# however slowly it drips; an answer must be taken within this.
DEFAULT_READ_TIMEOUT_S = 30.0
DEFAULT_WRITE_TIMEOUT_S = 30.0


def _seconds(name: str, value: object, *, positive: bool) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or (positive and value == 0)
    ):
        bound = "> 0" if positive else ">= 0"
        raise InvalidArgumentError(f"{name} must be a finite number {bound}, got {value!r}")


_VISIBLE = re.compile(r"[\x21-\x7e]+")


def _non_negative_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(f"{name} must be a non-negative int, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeSettings:
    """A server's configuration; every field is validated when the settings are built.

    ``port`` 0 picks a free port. ``uds``: listen on this Unix socket instead of
    ``host:port`` (an absolute path ending in ``.sock``; the job's launched servers do, in a
    directory only its user can enter, so no other user can bind their address first or
    reach them). ``seed`` seeds the initial weights (those of
    ``NumpyGRPOTrainer(seed=seed)``, version 0) and the generator of requests that carry no
    ``seed``. ``call_latency_s`` is waited by every generation request between taking its
    weight snapshot and sampling, as a real server's prefill time would be.
    ``token_latency_s`` is waited before each generated token (a decode step): with it a
    call is generated token by token, so ``/pause?mode=keep`` can stop it between two
    tokens and weights loaded meanwhile generate the rest (0: every token at once).

    Transport limits: ``max_body_bytes`` per request (each route takes at most what its
    requests can use, within it: ``_limits``); ``max_inflight_body_bytes`` for
    every body being read or handled at once (a request that would pass it is refused with
    a 503 before its body is read); ``max_connections`` open at once (more are answered
    503 and closed); ``keep_alive_timeout_s`` of idleness before a connection is closed;
    ``read_timeout_s`` for a whole request from its first byte; ``write_timeout_s`` for a
    whole answer.

    ``api_key``: when set, every request must carry ``Authorization: Bearer <api_key>``
    (the key is never shown in the settings' repr). ``allowed_hosts``: names besides the
    loopback ones that a request's ``Host`` may name (``"*"``: any), for a server bound to
    another address.
    """

    host: str = "127.0.0.1"
    port: int = 0
    model_name: str = DEFAULT_MODEL_NAME
    seed: int = 0
    call_latency_s: float = 0.0
    token_latency_s: float = 0.0
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_inflight_body_bytes: int = DEFAULT_MAX_INFLIGHT_BODY_BYTES
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    keep_alive_timeout_s: float = DEFAULT_KEEP_ALIVE_TIMEOUT_S
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S
    access_log: bool = False
    api_key: str | None = field(default=None, repr=False)
    allowed_hosts: tuple[str, ...] = ()
    uds: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise InvalidArgumentError(f"host must be a non-empty str, got {self.host!r}")
        _non_negative_int("port", self.port)
        if self.port > 65535:
            raise InvalidArgumentError(f"port must be at most 65535, got {self.port!r}")
        if not isinstance(self.model_name, str) or not self.model_name:
            raise InvalidArgumentError(
                f"model_name must be a non-empty str, got {self.model_name!r}"
            )
        _non_negative_int("seed", self.seed)
        _seconds("call_latency_s", self.call_latency_s, positive=False)
        _seconds("token_latency_s", self.token_latency_s, positive=False)
        for name in ("keep_alive_timeout_s", "read_timeout_s", "write_timeout_s"):
            _seconds(name, getattr(self, name), positive=True)
        _non_negative_int("max_model_len", self.max_model_len)
        if self.max_model_len < 2:
            raise InvalidArgumentError(
                f"max_model_len must be at least 2, got {self.max_model_len!r}"
            )
        _non_negative_int("max_body_bytes", self.max_body_bytes)
        _non_negative_int("max_inflight_body_bytes", self.max_inflight_body_bytes)
        if self.max_inflight_body_bytes < self.max_body_bytes:
            raise InvalidArgumentError(
                f"max_inflight_body_bytes ({self.max_inflight_body_bytes}) must be at least "
                f"max_body_bytes ({self.max_body_bytes}), or a body at the cap is never read"
            )
        _non_negative_int("max_connections", self.max_connections)
        if self.max_connections < 1:
            raise InvalidArgumentError(
                f"max_connections must be at least 1, got {self.max_connections!r}"
            )
        # The key travels in a header: visible ASCII, no spaces. It is never quoted back.
        key = self.api_key
        if key is not None and (not isinstance(key, str) or not _VISIBLE.fullmatch(key)):
            raise InvalidArgumentError(
                "api_key must be a non-empty string of visible ASCII characters without spaces"
            )
        if self.uds is not None:
            if not isinstance(self.uds, str):
                raise InvalidArgumentError(f"uds must be a path, got {self.uds!r}")
            unix_server_url(self.uds)  # refuses what cannot name a server's socket
        hosts = self.allowed_hosts
        if not isinstance(hosts, tuple) or not all(
            isinstance(host, str) and _VISIBLE.fullmatch(host) and "/" not in host for host in hosts
        ):
            raise InvalidArgumentError(
                f"allowed_hosts must be a tuple of host names (or '*'), got {hosts!r}"
            )

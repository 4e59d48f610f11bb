"""What one ``rollout-recovery serve`` process serves, and where."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..errors import InvalidArgumentError

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_MODEL_LEN",
    "DEFAULT_MODEL_NAME",
    "ServeSettings",
]

DEFAULT_MODEL_NAME = "rollout-recovery-numpy"
DEFAULT_MAX_MODEL_LEN = 512
# A weight push of the numpy policy is a few kilobytes; 64 MiB leaves room for a larger policy
# while a runaway client cannot make the server buffer gigabytes.
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024


_VISIBLE = re.compile(r"[\x21-\x7e]+")


def _non_negative_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(f"{name} must be a non-negative int, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeSettings:
    """A server's configuration; every field is validated when the settings are built.

    ``port`` 0 picks a free port. ``seed`` seeds the initial weights (those of
    ``NumpyGRPOTrainer(seed=seed)``, version 0) and the generator of requests that carry no
    ``seed``. ``call_latency_s`` is waited by every generation request between taking its
    weight snapshot and sampling, as a real server's decode time would be.

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
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    access_log: bool = False
    api_key: str | None = field(default=None, repr=False)
    allowed_hosts: tuple[str, ...] = ()

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
        latency = self.call_latency_s
        if (
            isinstance(latency, bool)
            or not isinstance(latency, int | float)
            or not math.isfinite(latency)
            or latency < 0
        ):
            raise InvalidArgumentError(
                f"call_latency_s must be a finite number >= 0, got {latency!r}"
            )
        _non_negative_int("max_model_len", self.max_model_len)
        if self.max_model_len < 2:
            raise InvalidArgumentError(
                f"max_model_len must be at least 2, got {self.max_model_len!r}"
            )
        _non_negative_int("max_body_bytes", self.max_body_bytes)
        # The key travels in a header: visible ASCII, no spaces. It is never quoted back.
        key = self.api_key
        if key is not None and (not isinstance(key, str) or not _VISIBLE.fullmatch(key)):
            raise InvalidArgumentError(
                "api_key must be a non-empty string of visible ASCII characters without spaces"
            )
        hosts = self.allowed_hosts
        if not isinstance(hosts, tuple) or not all(
            isinstance(host, str) and _VISIBLE.fullmatch(host) and "/" not in host for host in hosts
        ):
            raise InvalidArgumentError(
                f"allowed_hosts must be a tuple of host names (or '*'), got {hosts!r}"
            )

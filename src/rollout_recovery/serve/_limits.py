"""What one request's body may cost: its bytes, and the JSON values they decode into.

A body's bytes are not what it costs once decoded. msgspec turns ``[]`` (2 bytes) into an
empty list (56 bytes and a pointer) and ``{"":0}`` into a dict: measured, up to 28 times
the body's length, so two 32 MiB bodies, half the old in-flight budget, took a server
from 59 MB to 0.9-1.7 GB. Each route therefore takes only what it can use:

- bytes: a generation request holds one prompt of at most ``max_model_len`` token ids; a
  weight push the policy's parameters; every other route a small object. Each gets that
  plus room for the fields vLLM's clients add (``max_body_bytes`` caps them all);
- values: the body's JSON values are counted before it is decoded (every value but the
  first follows a ``,`` or opens with ``[`` or ``{``, so ``,``, ``[`` and ``{`` bound them;
  a string that holds them only counts too many) and a body with more than the route
  can use is refused, so what decoding builds is bounded by the count, not by the bytes.

Together: a request costs at most about 4 bytes per body byte (a string of wide
characters) plus about 200 per value once decoded, whatever shape it has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from http import HTTPStatus

from ..policy import PolicySnapshot
from ._api_error import ApiError
from ._settings import ServeSettings

__all__ = ["BodyLimit", "body_limit", "json_values_at_most"]

# Room for what a route's fields do not account for (sampling fields vLLM's clients
# send, whitespace, a model name, a request id): bytes, and values.
_BASE_BYTES = 64 * 2**10
_BASE_VALUES = 256
# A token id is at most 10 digits and a separator; room for whitespace.
_BYTES_PER_TOKEN = 32
# A float as JSON is at most 24 characters, with its separator and nesting.
_BYTES_PER_PARAM = 64
_GENERATION_ROUTES = frozenset({"/v1/completions", "/inference/v1/generate"})
_WEIGHT_ROUTE = "/update_weights"
_PARAMS = sum(math.prod(shape) for shape in PolicySnapshot.param_shapes.values())


@dataclass(frozen=True, slots=True)
class BodyLimit:
    """At most ``max_bytes`` bytes, holding at most ``max_values`` JSON values."""

    max_bytes: int
    max_values: int

    def check_values(self, body: bytes, path: str) -> None:
        """Refuse (413) a body that may hold more JSON values than the route can use,
        before it is decoded."""
        count = json_values_at_most(body)
        if count > self.max_values:
            raise ApiError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"request body may hold {count} JSON values; {path} takes at most "
                f"{self.max_values}",
            )


def json_values_at_most(body: bytes) -> int:
    """An upper bound on the JSON values in ``body``, counted without decoding it."""
    if not body:
        return 0
    return 1 + body.count(b",") + body.count(b"[") + body.count(b"{")


def body_limit(settings: ServeSettings, path: str) -> BodyLimit:
    """What a body of ``path`` may be: what the route can use, within ``max_body_bytes``."""
    if path in _GENERATION_ROUTES:
        tokens = settings.max_model_len
        limit = BodyLimit(_BASE_BYTES + _BYTES_PER_TOKEN * tokens, _BASE_VALUES + tokens)
    elif path == _WEIGHT_ROUTE:
        limit = BodyLimit(_BASE_BYTES + _BYTES_PER_PARAM * _PARAMS, _BASE_VALUES + _PARAMS)
    else:
        limit = BodyLimit(_BASE_BYTES, _BASE_VALUES)
    return BodyLimit(min(limit.max_bytes, settings.max_body_bytes), limit.max_values)

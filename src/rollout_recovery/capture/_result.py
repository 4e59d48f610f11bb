"""What ``verify_and_linearize`` returns: a linearized rollout or a rejection with a reason.

Rejection codes (the reason families of upstream's finalizer, §2.8); ``Rejection.reason``
renders ``code`` or ``code:detail``, and ``rebuild_failed:<rebuild_code>: <detail>``:

==============================  =============================================================
code                            meaning
==============================  =============================================================
``missing_receipt``             the receipt is ``None`` (explicit capture failure)
``invalid_receipt``             the receipt breaks the schema or the receipt state rules
``identity_mismatch``           receipt, manifest key or staged row names another rollout
``capture_poisoned``            the receipt is poisoned; detail = its ``failure_reason``
``empty_manifest``              an unpoisoned receipt lists no calls
``duplicate_staging_key``       two manifest entries share a staging key
``duplicate_manifest_call_id``  two manifest entries share a model call id
``call_id_mismatch``            a manifest entry's key names another call than the entry
``missing_staging_row``         a manifest key has no staged row (or the row count differs)
``staging_key_mismatch``        the row given for a key describes another key (misordered)
``invalid_staging_row``         a staged row is malformed (header, array shape or dtype, ids)
``length_mismatch``             a row's arrays are not ``delta_len`` long
``invalid_token_mask``          mask values not 0/1, or not carry-then-generation with >= 1
``non_finite_logprob``          a logprob is NaN or infinite
``misaligned_delta``            a carried (mask 0) position has a non-zero logprob
``corrupt_extras``              a row's extras do not hash to its ``extras_digest``
``<field>_mismatch``            row header and manifest disagree on ``<field>`` (see below)
``digest_mismatch``             the row's contents do not hash to the manifest's digest
``rebuild_failed``              the lineage graph or terminal chain is broken (sub-codes below)
==============================  =============================================================

``<field>`` is one of ``parent_call_id``, ``prev_len``, ``delta_len``, ``weight_version``,
``extras_digest``, ``chain_hash``, ``cumulative_hash``, ``digest``.
``rebuild_failed`` sub-codes: ``missing_terminal`` (the declared terminal is not in the
manifest), ``missing_parent``, ``manifest_order`` (a parent listed after its child; this also
rules out cycles), ``parent_length_mismatch``, ``chain_hash_mismatch``,
``cumulative_hash_mismatch``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from ..errors import InvalidArgumentError
from ._spans import TokenVersionSpan

__all__ = [
    "FIELD_MISMATCH_FIELDS",
    "REBUILD_CODES",
    "REJECTION_CODES",
    "LinearizedRollout",
    "LinkSpan",
    "Rejection",
    "WeightVersionSpan",
]

# ``mode`` and ``cum_len`` are not compared: both records pass the same cross-field rules,
# so equal parent, prev_len and delta_len already force them equal.
FIELD_MISMATCH_FIELDS: tuple[str, ...] = (
    "parent_call_id",
    "prev_len",
    "delta_len",
    "weight_version",
    "extras_digest",
    "chain_hash",
    "cumulative_hash",
    "digest",
)

REJECTION_CODES: frozenset[str] = frozenset(
    {
        "missing_receipt",
        "invalid_receipt",
        "identity_mismatch",
        "capture_poisoned",
        "empty_manifest",
        "duplicate_staging_key",
        "duplicate_manifest_call_id",
        "call_id_mismatch",
        "missing_staging_row",
        "staging_key_mismatch",
        "invalid_staging_row",
        "length_mismatch",
        "invalid_token_mask",
        "non_finite_logprob",
        "misaligned_delta",
        "corrupt_extras",
        "rebuild_failed",
    }
    | {f"{name}_mismatch" for name in FIELD_MISMATCH_FIELDS}
)

REBUILD_CODES: frozenset[str] = frozenset(
    {
        "missing_terminal",
        "missing_parent",
        "manifest_order",
        "parent_length_mismatch",
        "chain_hash_mismatch",
        "cumulative_hash_mismatch",
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejection:
    """A rollout that must not train; it becomes a masked placeholder downstream."""

    code: str
    detail: str = ""
    rebuild_code: str | None = None

    def __post_init__(self) -> None:
        # A typo in a code would silently escape every dashboard bucket; fail loudly instead.
        if self.code not in REJECTION_CODES:
            raise InvalidArgumentError(f"unknown rejection code {self.code!r}")
        if (self.code == "rebuild_failed") != (self.rebuild_code is not None):
            raise InvalidArgumentError("rebuild_code is set exactly when code is 'rebuild_failed'")
        if self.rebuild_code is not None and self.rebuild_code not in REBUILD_CODES:
            raise InvalidArgumentError(f"unknown rebuild code {self.rebuild_code!r}")

    @property
    def reason(self) -> str:
        """The upstream-style reason string, e.g. ``missing_staging_row:r/c``."""
        if self.rebuild_code is not None:
            return f"{self.code}:{self.rebuild_code}: {self.detail}"
        return f"{self.code}:{self.detail}" if self.detail else self.code


class LinkSpan(NamedTuple):
    """One call of a linearized row's terminal chain, root first: ``carry_len`` prompt
    tokens, then ``generated_len`` generated ones (what reward finalization walks)."""

    model_call_id: str
    carry_len: int
    generated_len: int


class WeightVersionSpan(NamedTuple):
    """The half-open range ``[start, end)`` of the row covered by one call's delta."""

    model_call_id: str
    start: int
    end: int
    weight_version: int


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class LinearizedRollout:
    """A verified rollout: its terminal chain concatenated from root to terminal.

    ``token_mask`` is 1.0 where the policy generated the token and 0.0 for carried prompt
    tokens (whose ``logprobs`` are 0.0). ``prompt_len`` is the root's carried length.
    ``staging_keys`` lists every manifest key, dead branches included, for cleanup;
    ``min_weight_version``/``max_weight_version`` are taken over every manifest call too
    (upstream's mixed-version policy counts dead branches) and over every token's version
    (an interrupted call's first tokens are older than its staged version), while
    ``weight_version_spans`` and ``token_version_spans`` cover only the chain.
    """

    rollout_id: str
    terminal_model_call_id: str
    token_ids: npt.NDArray[np.int32]
    token_mask: npt.NDArray[np.float32]
    logprobs: npt.NDArray[np.float32]
    prompt_len: int
    call_ids: tuple[str, ...]
    link_spans: tuple[LinkSpan, ...]
    weight_version_spans: tuple[WeightVersionSpan, ...]
    staging_keys: tuple[str, ...]
    min_weight_version: int
    max_weight_version: int
    #: Which weight version generated each generated token (row positions; carried
    #: tokens in none): one span per call, or several for a call that new weights
    #: interrupted (its ``weight_version_spans`` extra).
    token_version_spans: tuple[TokenVersionSpan, ...] = ()

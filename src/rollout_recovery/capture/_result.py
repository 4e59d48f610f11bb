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
from enum import StrEnum
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from ..errors import InvalidArgumentError
from ._spans import TokenVersionSpan

__all__ = [
    "FIELD_MISMATCH_FIELDS",
    "LinearizedRollout",
    "LinkSpan",
    "RebuildCode",
    "Rejection",
    "RejectionCode",
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

class RejectionCode(StrEnum):
    """Why a rollout must not train (the table above); the values are the reason strings
    the journal and the metrics record."""

    MISSING_RECEIPT = "missing_receipt"
    INVALID_RECEIPT = "invalid_receipt"
    IDENTITY_MISMATCH = "identity_mismatch"
    CAPTURE_POISONED = "capture_poisoned"
    EMPTY_MANIFEST = "empty_manifest"
    DUPLICATE_STAGING_KEY = "duplicate_staging_key"
    DUPLICATE_MANIFEST_CALL_ID = "duplicate_manifest_call_id"
    CALL_ID_MISMATCH = "call_id_mismatch"
    MISSING_STAGING_ROW = "missing_staging_row"
    STAGING_KEY_MISMATCH = "staging_key_mismatch"
    INVALID_STAGING_ROW = "invalid_staging_row"
    LENGTH_MISMATCH = "length_mismatch"
    INVALID_TOKEN_MASK = "invalid_token_mask"
    NON_FINITE_LOGPROB = "non_finite_logprob"
    MISALIGNED_DELTA = "misaligned_delta"
    CORRUPT_EXTRAS = "corrupt_extras"
    REBUILD_FAILED = "rebuild_failed"
    # ``<field>_mismatch`` for each of FIELD_MISMATCH_FIELDS (a test keeps them in step).
    PARENT_CALL_ID_MISMATCH = "parent_call_id_mismatch"
    PREV_LEN_MISMATCH = "prev_len_mismatch"
    DELTA_LEN_MISMATCH = "delta_len_mismatch"
    WEIGHT_VERSION_MISMATCH = "weight_version_mismatch"
    EXTRAS_DIGEST_MISMATCH = "extras_digest_mismatch"
    CHAIN_HASH_MISMATCH = "chain_hash_mismatch"
    CUMULATIVE_HASH_MISMATCH = "cumulative_hash_mismatch"
    DIGEST_MISMATCH = "digest_mismatch"

    @classmethod
    def field_mismatch(cls, field: str) -> RejectionCode:
        """The code of a row header and manifest disagreeing on ``field``."""
        return cls(f"{field}_mismatch")


class RebuildCode(StrEnum):
    """How the lineage graph or terminal chain is broken (``rebuild_failed``)."""

    MISSING_TERMINAL = "missing_terminal"
    MISSING_PARENT = "missing_parent"
    MANIFEST_ORDER = "manifest_order"
    PARENT_LENGTH_MISMATCH = "parent_length_mismatch"
    CHAIN_HASH_MISMATCH = "chain_hash_mismatch"
    CUMULATIVE_HASH_MISMATCH = "cumulative_hash_mismatch"


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejection:
    """A rollout that must not train; it becomes a masked placeholder downstream."""

    code: RejectionCode
    detail: str = ""
    rebuild_code: RebuildCode | None = None

    def __post_init__(self) -> None:
        if (self.code is RejectionCode.REBUILD_FAILED) != (self.rebuild_code is not None):
            raise InvalidArgumentError("rebuild_code is set exactly when code is 'rebuild_failed'")

    @property
    def reason(self) -> str:
        """The upstream-style reason string, e.g. ``missing_staging_row:r/c``."""
        if self.rebuild_code is not None:
            return f"{self.code}:{self.rebuild_code}: {self.detail}"
        return f"{self.code}:{self.detail}" if self.detail else str(self.code)


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

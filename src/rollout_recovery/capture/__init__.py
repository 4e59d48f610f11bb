"""The token-capture contract: staging keys, call records, digests, receipts, verification.

Generation side: :class:`CaptureWriter` stages each model call's token delta under
``{rollout_id}/{model_call_id}`` in the data plane's staging partition *before* it returns
the call's :class:`CallRecord`; at rollout end :func:`assemble_receipt` turns the records
into the token-free receipt dict the ledger seals. Finalizer side:
:func:`verify_and_linearize` (or :func:`fetch_and_verify`) re-checks every staged row
against the receipt and returns a :class:`LinearizedRollout` or a :class:`Rejection`.
"""

from ._digest import (
    DIGEST_VERSION,
    EMPTY_EXTRAS_DIGEST,
    EXTRAS_DIGEST_VERSION,
    SCHEMA_VERSION,
    compute_call_digest,
    compute_chain_hash,
    encode_token_ids,
    hash_token_ids,
)
from ._keys import (
    IDENTIFIER_PATTERN,
    STAGING_KEY_PATTERN,
    is_identifier,
    new_model_call_id,
    parse_staging_key,
    staging_key,
)
from ._receipt import (
    MISSING_TERMINAL_ROW,
    NON_POISONING_FAILURES,
    REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES,
    UNDECLARED_TERMINAL,
    CaptureFailure,
    Receipt,
    TerminalSelection,
    assemble_receipt,
)
from ._records import CallRecord, CaptureMode, StagedCallHeader
from ._result import (
    FIELD_MISMATCH_FIELDS,
    REBUILD_CODES,
    REJECTION_CODES,
    LinearizedRollout,
    LinkSpan,
    Rejection,
    WeightVersionSpan,
)
from ._verify import fetch_and_verify, verify_and_linearize
from ._writer import STAGING_PARTITION, CaptureWriter

__all__ = [
    "DIGEST_VERSION",
    "EMPTY_EXTRAS_DIGEST",
    "EXTRAS_DIGEST_VERSION",
    "FIELD_MISMATCH_FIELDS",
    "IDENTIFIER_PATTERN",
    "MISSING_TERMINAL_ROW",
    "NON_POISONING_FAILURES",
    "REBUILD_CODES",
    "REJECTION_CODES",
    "REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES",
    "SCHEMA_VERSION",
    "STAGING_KEY_PATTERN",
    "STAGING_PARTITION",
    "UNDECLARED_TERMINAL",
    "CallRecord",
    "CaptureFailure",
    "CaptureMode",
    "CaptureWriter",
    "LinearizedRollout",
    "LinkSpan",
    "Receipt",
    "Rejection",
    "StagedCallHeader",
    "TerminalSelection",
    "WeightVersionSpan",
    "assemble_receipt",
    "compute_call_digest",
    "compute_chain_hash",
    "encode_token_ids",
    "fetch_and_verify",
    "hash_token_ids",
    "is_identifier",
    "new_model_call_id",
    "parse_staging_key",
    "staging_key",
    "verify_and_linearize",
]

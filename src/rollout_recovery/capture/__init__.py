"""The token-capture contract: staging keys, call records, receipts, verification.

Generation side: :class:`CaptureWriter` stages each model call's token delta under
``{rollout_id}/{model_call_id}`` (:func:`staging_key`) in the data plane's staging
partition (``CaptureWriter.staging_partition``) *before* it returns the call's
call record; at rollout end :func:`assemble_receipt` (or an attempt's
:meth:`CaptureWriter.attempt` capture) turns the records into the token-free
:class:`Receipt` dict the ledger seals. Finalizer side: :func:`verify_receipts`
re-checks every staged row of a group's receipts against them and returns, per receipt, a
:class:`LinearizedRollout` or a :class:`Rejection` (one of :data:`REJECTION_CODES`).
:func:`read_staged_prefix` reads an unsealed attempt's staged calls back as a verified
:class:`StagedPrefix`, which a later attempt of the same sibling continues. Digests, key
patterns and record codecs are private.
"""

from ._prefix import StagedCall, StagedPrefix, read_staged_prefix
from ._receipt import Receipt, assemble_receipt
from ._result import LinearizedRollout, Rejection
from ._spans import SPANS_EXTRA, version_spans
from ._verify import verify_receipts
from ._writer import CaptureWriter

__all__ = [
    "SPANS_EXTRA",
    "CaptureWriter",
    "LinearizedRollout",
    "Receipt",
    "Rejection",
    "StagedCall",
    "StagedPrefix",
    "assemble_receipt",
    "read_staged_prefix",
    "verify_receipts",
    "version_spans",
]

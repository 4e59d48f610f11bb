"""The token-capture contract: staging keys, call records, receipts, verification.

Generation side: :class:`CaptureWriter` stages each model call's token delta under
``{rollout_id}/{model_call_id}`` in the data plane's staging partition
(``CaptureWriter.staging_partition``) *before* it returns the call's call record; an
attempt's capture (:meth:`CaptureWriter.attempt`) stages its calls in order and turns
them into the token-free :class:`Receipt` the ledger seals (as its dict). Finalizer side:
:func:`verify_receipts` re-checks every staged row of a group's receipts against them and
returns, per receipt, a :class:`LinearizedRollout` or a :class:`Rejection`.
:meth:`StagedPrefix.read` reads an unsealed attempt's staged calls back as a verified
:class:`StagedPrefix`, which a later attempt of the same sibling continues. Digests, key
patterns, record codecs and receipt assembly are private.
"""

from ._prefix import StagedPrefix
from ._receipt import Receipt
from ._result import LinearizedRollout, Rejection
from ._verify import verify_receipts
from ._writer import CaptureWriter

__all__ = [
    "CaptureWriter",
    "LinearizedRollout",
    "Receipt",
    "Rejection",
    "StagedPrefix",
    "verify_receipts",
]

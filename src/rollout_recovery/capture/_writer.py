"""The capture writer: stage one model call's token delta durably, then return its record.

This is the generation side's half of the contract (§2 step 2). The order is the point: the
row is ``put`` into the data plane's staging partition, and ``put`` returns only once the
row is visible (and durable, for a durable store), *before* the call record exists. So a
record that reaches a manifest always names a row that can be fetched; a crash in between
leaves an orphan row, which the restore inventory pass deletes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from .._bounds import INT32_MAX, INT64_MAX
from .._crashpoints import crash_point
from ..dataplane import DataPlane, Row
from ..errors import InvalidArgumentError, InvalidStateError
from ._digest import (
    compute_call_digest,
    compute_chain_hash,
    hash_token_ids,
)
from ._extras import compute_extras_digest
from ._keys import parse_staging_key, staging_key
from ._receipt import CaptureFailure, Receipt, assemble_receipt
from ._records import CallRecord, CaptureMode, StagedCallHeader
from ._spans import SPANS_EXTRA, version_spans

__all__ = ["STAGING_PARTITION", "AttemptCapture", "CaptureWriter"]

STAGING_PARTITION = "rollout_staging"


def _token_array(
    values: Sequence[int] | npt.NDArray[np.integer], name: str
) -> npt.NDArray[np.int32]:
    array = np.asarray(values)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise InvalidArgumentError(f"{name} must be a 1-D sequence of integers", path=f"$.{name}")
    # Rows store int32; check the range before casting so nothing wraps silently.
    if array.size and (int(array.min()) < 0 or int(array.max()) > INT32_MAX):
        raise InvalidArgumentError(f"{name} must lie in [0, 2**31)", path=f"$.{name}")
    return array.astype(np.int32)


def _spans_extra(
    token_versions: Sequence[int], generated: int, weight_version: int
) -> list[dict[str, Any]]:
    if len(token_versions) != generated:
        raise InvalidArgumentError(
            "token_versions must have one entry per generated token", path="$.token_versions"
        )
    if token_versions[-1] != weight_version:
        # The staged version is the newest weights the call saw: a reuse policy then
        # judges every token of it (``_spans``).
        raise InvalidArgumentError(
            "the last of token_versions must be weight_version", path="$.token_versions"
        )
    return version_spans(token_versions)


class CaptureWriter:
    """Stages model calls into ``partition`` of ``data_plane`` and mints their call records.

    Stateless apart from its store: the caller keeps the records it gets back (the manifest
    store) and passes a call's parent record when it stages a continuation.
    """

    # The partition writers stage in by default: the one the ledger's staging keys name,
    # the finalizer verifies from and the restore inventory reconciles.
    staging_partition: ClassVar[str] = STAGING_PARTITION

    def __init__(self, data_plane: DataPlane, *, partition: str = STAGING_PARTITION) -> None:
        self._data_plane = data_plane
        self._partition = partition

    @property
    def partition(self) -> str:
        return self._partition

    def attempt(self, rollout_id: str) -> AttemptCapture:
        """The capture of one attempt: its calls staged in order, each continuing the last,
        and its receipt."""
        return AttemptCapture(self, rollout_id)

    def check_continuation(
        self,
        *,
        rollout_id: str,
        model_call_id: str,
        parent: CallRecord,
        prompt_token_ids: Sequence[int] | npt.NDArray[np.integer],
    ) -> None:
        """Refuse, before the call is sent, a prompt that does not extend ``parent``.

        The same check :meth:`stage_call` makes; a backend calls it first so that a
        continuation built from re-rendered text never reaches a server at all.
        """
        prompt = _token_array(prompt_token_ids, "prompt_token_ids")
        self._check_extends(rollout_id, model_call_id, parent, prompt)

    @staticmethod
    def _check_extends(
        rollout_id: str, model_call_id: str, parent: CallRecord, prompt: npt.NDArray[np.int32]
    ) -> None:
        parent_rollout, _ = parse_staging_key(parent.staging_key)
        if parent_rollout != rollout_id or parent.model_call_id == model_call_id:
            raise InvalidArgumentError(
                f"parent {parent.staging_key!r} is not an earlier call of rollout {rollout_id!r}",
                path="$.parent",
            )
        prev_len = parent.cum_len
        if prompt.size < prev_len or hash_token_ids(prompt[:prev_len]) != parent.cumulative_hash:
            # The contract's prefix check: a continuation must extend its parent's exact
            # tokens, or earlier policy tokens would train as prompt.
            raise InvalidArgumentError(
                f"prompt does not begin with the {prev_len} tokens of parent call "
                f"{parent.model_call_id!r}",
                path="$.prompt_token_ids",
            )

    def stage_call(
        self,
        *,
        rollout_id: str,
        model_call_id: str,
        parent: CallRecord | None,
        prompt_token_ids: Sequence[int] | npt.NDArray[np.integer],
        generated_token_ids: Sequence[int] | npt.NDArray[np.integer],
        generated_logprobs: Sequence[float] | npt.NDArray[np.floating],
        weight_version: int,
        extras: Mapping[str, Any] | None = None,
        token_versions: Sequence[int] | None = None,
    ) -> CallRecord:
        """Stage one call and return its manifest record.

        ``prompt_token_ids`` is the whole prompt the engine saw; for a continuation it must
        begin with the parent's full token sequence (checked against the parent's
        ``cumulative_hash``, so the writer never needs the parent's tokens). The staged
        delta is the prompt after that prefix (mask 0, logprob 0) followed by the generated
        tokens (mask 1). ``weight_version`` is the policy version read at admission.
        ``extras`` is per-call material the tokens do not carry (sampling params, logprob
        mode, the server's own weight version); plain JSON-like values only, digested into
        the call digest. ``token_versions`` (one per generated token) says which weights
        generated each token of a call new weights interrupted; it is staged as the
        ``weight_version_spans`` extra, and its last version must be ``weight_version``.
        Raises ``InvalidArgumentError`` for inputs that break the contract; nothing is staged
        then. Errors from the data plane propagate.
        """
        key = staging_key(rollout_id, model_call_id)
        if isinstance(weight_version, bool) or not isinstance(weight_version, int):
            raise InvalidArgumentError("weight_version must be an int", path="$.weight_version")
        if not 0 <= weight_version <= INT64_MAX:
            raise InvalidArgumentError("weight_version must be >= 0", path="$.weight_version")
        prompt = _token_array(prompt_token_ids, "prompt_token_ids")
        generated = _token_array(generated_token_ids, "generated_token_ids")
        generated_lp = np.asarray(generated_logprobs, dtype=np.float64)
        if generated.size == 0:
            raise InvalidArgumentError(
                "a call must generate at least one token", path="$.generated_token_ids"
            )
        if generated_lp.shape != generated.shape:
            raise InvalidArgumentError(
                "generated_logprobs must have one entry per generated token",
                path="$.generated_logprobs",
            )
        with np.errstate(over="ignore"):  # an overflow becomes inf, refused just below
            generated_lp32 = generated_lp.astype(np.float32)
        if not np.isfinite(generated_lp32).all():
            raise InvalidArgumentError(
                "generated_logprobs must be finite in float32", path="$.generated_logprobs"
            )

        extras_dict = None if extras is None else dict(extras)
        if token_versions is not None:
            extras_dict = {
                **(extras_dict or {}),
                SPANS_EXTRA: _spans_extra(token_versions, generated.size, weight_version),
            }
        try:
            extras_digest = compute_extras_digest(extras_dict)
        except InvalidStateError as exc:
            raise InvalidArgumentError(exc.message, path=exc.path) from exc

        mode: CaptureMode
        if parent is None:
            mode, prev_len, parent_call_id, parent_chain = "text", 0, None, None
        else:
            self._check_extends(rollout_id, model_call_id, parent, prompt)
            prev_len = parent.cum_len
            mode, parent_call_id, parent_chain = "token_in", parent.model_call_id, parent.chain_hash

        carried = prompt[prev_len:]
        token_ids = np.concatenate([carried, generated]).astype(np.int32)
        token_mask = np.concatenate(
            [np.zeros(carried.size, np.float32), np.ones(generated.size, np.float32)]
        )
        logprobs = np.concatenate([np.zeros(carried.size, np.float32), generated_lp32])
        delta_len = int(token_ids.size)
        cum_len = prev_len + delta_len
        chain_hash = compute_chain_hash(parent_chain, token_ids)
        cumulative_hash = hash_token_ids(np.concatenate([prompt, generated]))
        # The coordinates the digest covers are exactly the header's fields.
        coordinates: dict[str, Any] = {
            "rollout_id": rollout_id,
            "model_call_id": model_call_id,
            "parent_call_id": parent_call_id,
            "mode": mode,
            "prev_len": prev_len,
            "delta_len": delta_len,
            "cum_len": cum_len,
            "weight_version": weight_version,
            "extras_digest": extras_digest,
            "chain_hash": chain_hash,
            "cumulative_hash": cumulative_hash,
        }
        digest = compute_call_digest(
            **coordinates, token_ids=token_ids, token_mask=token_mask, logprobs=logprobs
        )
        header = StagedCallHeader(**coordinates, digest=digest, extras=extras_dict)
        row = Row(
            token_ids=token_ids,
            token_mask=token_mask,
            logprobs=logprobs,
            metadata=header.to_dict(),
        )
        # Durable first: only a staged row may be acknowledged with a call record.
        self._data_plane.put(self._partition, {key: row})
        # A kill here: the row is durable but the caller never learned it was staged.
        crash_point("capture.before_ack")
        return header.call_record(key)


class AttemptCapture:
    """One attempt's calls, staged in order through its writer, each the continuation of
    the one before; then the attempt's receipt (:func:`assemble_receipt`).

    The records stay here: an episode asks for the next call's checks and for the receipt,
    never for the records themselves.
    """

    def __init__(self, writer: CaptureWriter, rollout_id: str) -> None:
        self._writer = writer
        self._rollout_id = rollout_id
        self._records: list[CallRecord] = []

    @property
    def calls(self) -> int:
        """How many calls are staged so far."""
        return len(self._records)

    def check_next(
        self, model_call_id: str, prompt_token_ids: Sequence[int] | npt.NDArray[np.integer]
    ) -> None:
        """Refuse, before the call is sent, a next prompt that does not extend the last
        staged call (:meth:`CaptureWriter.check_continuation`); the first call is free."""
        if self._records:
            self._writer.check_continuation(
                rollout_id=self._rollout_id,
                model_call_id=model_call_id,
                parent=self._records[-1],
                prompt_token_ids=prompt_token_ids,
            )

    async def stage(
        self,
        model_call_id: str,
        *,
        prompt_token_ids: Sequence[int] | npt.NDArray[np.integer],
        generated_token_ids: Sequence[int] | npt.NDArray[np.integer],
        generated_logprobs: Sequence[float] | npt.NDArray[np.floating],
        weight_version: int,
        extras: Mapping[str, Any] | None = None,
        token_versions: Sequence[int] | None = None,
        in_thread: bool = False,
    ) -> None:
        """Stage the next call as the continuation of the last (:meth:`CaptureWriter.
        stage_call`); ``in_thread`` stages from a worker thread (a durable store fsyncs
        every put)."""
        call: dict[str, Any] = {
            "rollout_id": self._rollout_id,
            "model_call_id": model_call_id,
            "parent": self._records[-1] if self._records else None,
            "prompt_token_ids": prompt_token_ids,
            "generated_token_ids": generated_token_ids,
            "generated_logprobs": generated_logprobs,
            "weight_version": weight_version,
            "extras": extras,
            "token_versions": token_versions,
        }
        if in_thread:
            record = await asyncio.to_thread(lambda: self._writer.stage_call(**call))
        else:
            record = self._writer.stage_call(**call)
        self._records.append(record)

    def receipt(self, *, reward: float) -> Receipt:
        """The receipt of the attempt that ended normally: its last call is the terminal."""
        terminal = self._records[-1].model_call_id if self._records else None
        return assemble_receipt(
            self._rollout_id, self._records, terminal_model_call_id=terminal, reward=reward
        )

    def failed_receipt(self, model_call_id: str, reason: str) -> Receipt:
        """The receipt of an attempt whose call ``model_call_id`` failed: every staged call
        listed (so their rows are cleared with it), poisoned with ``reason``."""
        return assemble_receipt(
            self._rollout_id,
            self._records,
            terminal_model_call_id=None,
            failures=[CaptureFailure(model_call_id=model_call_id, reason=reason)],
        )

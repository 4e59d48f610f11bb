"""The recorder's rows in the data plane: staged calls, and canonical rows naming seals.

Deletion waits for the next checkpoint (:class:`DeferredClears`): the run's newest
checkpoint must find every row it owns (the auditor checks it does), so a publication's or
a training step's clears are not done when their records apply; each checkpoint then
deletes every row the state it snapshotted does not own (the recorder keeps one
checkpoint, so that is every row no retained checkpoint owns).

Staged calls are rows under the capture contract's staging keys.

A call is one row of ``CaptureWriter.staging_partition`` under ``{rollout_id}/c{n:04d}``
(the attempt's rollout id, then its call number): the prompt and output tokens with a mask
over the output, and the exact values in its metadata (float32 arrays would round the
caller's logprobs). A put is durable when it returns (SQLite, ``synchronous=FULL``), so a
staged call survives a kill of the process; its seal's receipt lists the keys, and the
group's publication clears them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import cast

import numpy as np

from .._cut import MutationCut
from ..capture import CaptureWriter
from ..dataplane import DataPlane, ReplayIndex, Row, SqliteDataPlane
from ._values import SiblingOutput, StagedCall

__all__ = [
    "DeferredClears",
    "call_key",
    "call_row",
    "canonical_key",
    "canonical_row",
    "output_key",
    "output_row",
    "row_call",
]


def call_key(rollout_id: str, number: int) -> str:
    """The staging key of call ``number`` of attempt ``rollout_id``."""
    return f"{rollout_id}/c{number:04d}"


def call_row(call: StagedCall) -> Row:
    tokens = [*call.prompt_token_ids, *call.output_token_ids]
    mask = [0.0] * len(call.prompt_token_ids) + [1.0] * len(call.output_token_ids)
    return Row(
        token_ids=np.asarray(tokens, dtype=np.int32),
        token_mask=np.asarray(mask, dtype=np.float32),
        logprobs=np.zeros(len(tokens), dtype=np.float32),
        metadata={
            "prompt_length": len(call.prompt_token_ids),
            "logprobs": call.logprobs,
            "weight_version": call.weight_version,
            "extra": call.extra,
        },
    )


def row_call(row: Row) -> StagedCall:
    meta = row.metadata
    tokens = [int(token) for token in row.token_ids]
    split = int(meta["prompt_length"])
    logprobs = meta["logprobs"]
    return StagedCall(
        prompt_token_ids=tokens[:split],
        output_token_ids=tokens[split:],
        logprobs=None if logprobs is None else [float(x) for x in logprobs],
        weight_version=meta["weight_version"],
        extra=dict(meta["extra"]),
    )


def canonical_key(group_id: str, sibling: int) -> str:
    """The canonical row key of a published sibling: its logical id, as the controller's."""
    return f"{group_id}_g{sibling}"


def output_key(rollout_id: str) -> str:
    """The staging key of a sealed attempt's output: the one entry of its receipt's
    manifest, so the ledger owns the row as it owns any sealed attempt's staged rows."""
    return f"{rollout_id}/output"


def output_row(output: SiblingOutput) -> Row:
    """A sealed output as a staged row (the journal's receipt holds the same values)."""
    prompt, completion = output.prompt_token_ids, output.completion_token_ids
    logprobs = output.logprobs or [0.0] * len(completion)
    return Row(
        token_ids=np.asarray([*prompt, *completion], dtype=np.int32),
        token_mask=np.asarray([0.0] * len(prompt) + [1.0] * len(completion), dtype=np.float32),
        logprobs=np.asarray([0.0] * len(prompt) + list(logprobs), dtype=np.float32),
        metadata={"prompt_length": len(prompt)},
    )


def canonical_row(*, group_id: str, sibling: int, rollout_id: str) -> Row:
    """A published sibling's canonical row: it names the seal. The caller's trainer holds
    the tokens it trains on and the journal the sealed output, so the row holds none; the
    replay index owns it as it owns any canonical row (and the auditor checks it is here)."""
    return Row(
        token_ids=np.zeros(0, dtype=np.int32),
        token_mask=np.zeros(0, dtype=np.float32),
        logprobs=np.zeros(0, dtype=np.float32),
        metadata={"group_id": group_id, "generation_index": sibling, "rollout_id": rollout_id},
    )


class DeferredClears:
    """The recorder's store as its transitions see it: puts and reads go through, clears
    wait for :meth:`collect` (at the next checkpoint)."""

    def __init__(self, inner: SqliteDataPlane) -> None:
        self.inner = inner

    def put(
        self, partition: str, rows: Mapping[str, Row], *, cut: MutationCut | None = None
    ) -> None:
        self.inner.put(partition, rows, cut=cut)

    def get(self, partition: str, keys: Sequence[str]) -> list[Row]:
        return self.inner.get(partition, keys)

    def keys(self, partition: str) -> list[str]:
        return self.inner.keys(partition)

    def clear(self, partition: str, keys: Iterable[str], *, cut: MutationCut | None = None) -> None:
        del partition, keys, cut  # deferred: collect() deletes what no checkpoint owns

    def as_data_plane(self) -> DataPlane:
        # The four calls a transition makes; the rest of the protocol (snapshots) is the
        # inner store's, which nothing reaches through this view.
        return cast(DataPlane, self)

    def collect(self, *, staged: Iterable[str], canonical: Iterable[str]) -> int:
        """Delete every staged and canonical row but ``staged`` and ``canonical`` (what the
        state just checkpointed owns); returns how many went."""
        removed = 0
        for partition, owned in (
            (CaptureWriter.staging_partition, set(staged)),
            (ReplayIndex.canonical_partition, set(canonical)),
        ):
            doomed = [key for key in self.inner.keys(partition) if key not in owned]
            self.inner.clear(partition, doomed)
            removed += len(doomed)
        return removed

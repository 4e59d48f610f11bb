"""Shared helpers for the capture tests: a dict-backed data plane and rollout builders."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import strategies as st

from rollout_recovery._cut import MutationCut
from rollout_recovery.capture import CaptureWriter
from rollout_recovery.capture._digest import compute_call_digest
from rollout_recovery.capture._receipt import assemble_receipt
from rollout_recovery.capture._records import CallRecord
from rollout_recovery.dataplane._protocol import Row


def _copy_row(row: Row) -> Row:
    # Copy in and out, like a real store: a test that mutates a fetched row must not be
    # able to corrupt the stored one by aliasing.
    return Row(
        token_ids=np.array(row.token_ids, copy=True),
        token_mask=np.array(row.token_mask, copy=True),
        logprobs=np.array(row.logprobs, copy=True),
        metadata=copy.deepcopy(dict(row.metadata)),
    )


class DictDataPlane:
    """The smallest thing that satisfies the ``DataPlane`` protocol: a dict of dicts."""

    def __init__(self) -> None:
        self.partitions: dict[str, dict[str, Row]] = {}
        self.put_log: list[tuple[str, tuple[str, ...]]] = []

    def put(
        self, partition: str, rows: Mapping[str, Row], *, cut: MutationCut | None = None
    ) -> None:
        if cut is not None:
            cut.require_live()
        self.put_log.append((partition, tuple(rows)))
        target = self.partitions.setdefault(partition, {})
        for key, row in rows.items():
            target[key] = _copy_row(row)

    def get(self, partition: str, keys: Sequence[str]) -> list[Row]:
        stored = self.partitions.get(partition, {})
        for key in keys:
            if key not in stored:
                raise KeyError(key)
        return [_copy_row(stored[key]) for key in keys]

    def clear(self, partition: str, keys: Iterable[str], *, cut: MutationCut | None = None) -> None:
        for key in keys:
            self.partitions.get(partition, {}).pop(key, None)

    def keys(self, partition: str) -> list[str]:
        return sorted(self.partitions.get(partition, {}))

    def snapshot(self, directory: Path, *, cut: MutationCut | None = None) -> None:
        raise NotImplementedError

    def restore(self, directory: Path, *, cut: MutationCut | None = None) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


@dataclass
class CallSpec:
    """One model call of a generated rollout; ``parent`` indexes an earlier call."""

    parent: int | None
    carried: list[int]
    generated: list[int]
    logprobs: list[float]
    weight_version: int


@dataclass
class Built:
    """A staged rollout plus an independent oracle of its expected linearization."""

    rollout_id: str
    receipt: dict[str, Any]
    records: list[CallRecord]
    data_plane: DictDataPlane
    terminal: int
    expected_tokens: list[int] = field(default_factory=list)
    expected_mask: list[float] = field(default_factory=list)
    expected_logprobs: list[float] = field(default_factory=list)
    expected_chain: list[int] = field(default_factory=list)
    specs: list[CallSpec] = field(default_factory=list)

    def rows(self) -> list[Row]:
        return self.data_plane.get(
            CaptureWriter.staging_partition, [r.staging_key for r in self.records]
        )


def call_id(index: int) -> str:
    return f"call{index:02d}"


def build_rollout(rollout_id: str, specs: Sequence[CallSpec], terminal: int) -> Built:
    """Stage ``specs`` through the real writer; compute the expectation the naive way."""
    data_plane = DictDataPlane()
    writer = CaptureWriter(data_plane)
    records: list[CallRecord] = []
    # Oracle: each call's full sequence as plain lists (tokens, mask, logprobs).
    full: list[tuple[list[int], list[float], list[float]]] = []
    for index, spec in enumerate(specs):
        if spec.parent is None:
            base: tuple[list[int], list[float], list[float]] = ([], [], [])
            parent_record = None
        else:
            base = full[spec.parent]
            parent_record = records[spec.parent]
        prompt = base[0] + spec.carried
        records.append(
            writer.stage_call(
                rollout_id=rollout_id,
                model_call_id=call_id(index),
                parent=parent_record,
                prompt_token_ids=prompt,
                generated_token_ids=spec.generated,
                generated_logprobs=spec.logprobs,
                weight_version=spec.weight_version,
            )
        )
        full.append(
            (
                prompt + spec.generated,
                base[1] + [0.0] * len(spec.carried) + [1.0] * len(spec.generated),
                base[2] + [0.0] * len(spec.carried) + [float(np.float32(x)) for x in spec.logprobs],
            )
        )
    receipt = assemble_receipt(
        rollout_id, records, terminal_model_call_id=call_id(terminal)
    ).to_dict()
    chain: list[int] = []
    cursor: int | None = terminal
    while cursor is not None:
        chain.append(cursor)
        cursor = specs[cursor].parent
    chain.reverse()
    tokens, mask, logprobs = full[terminal]
    return Built(
        rollout_id=rollout_id,
        receipt=receipt,
        records=records,
        data_plane=data_plane,
        terminal=terminal,
        expected_tokens=tokens,
        expected_mask=mask,
        expected_logprobs=logprobs,
        expected_chain=chain,
        specs=list(specs),
    )


def simple_rollout(rollout_id: str = "grp1_g0_aabc123") -> Built:
    """root -> child -> grandchild, plus a dead-branch sibling of the child; terminal = 2."""
    specs = [
        CallSpec(None, [11, 12, 13], [21, 22], [-0.5, -1.25], 3),
        CallSpec(0, [31], [41, 42, 43], [-0.1, -0.2, -0.3], 3),
        CallSpec(1, [], [51], [-2.0], 4),
        CallSpec(0, [32, 33], [61], [-0.75], 4),
    ]
    return build_rollout(rollout_id, specs, terminal=2)


def with_row(row: Row, **changes: Any) -> Row:
    return replace(row, **changes)


# ---------------------------------------------------------------- hypothesis strategies

identifiers = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,20}\Z")
token_ids = st.integers(min_value=0, max_value=2**31 - 1)
logprob_values = st.floats(min_value=-30.0, max_value=0.0, width=32, allow_subnormal=False)


@st.composite
def call_specs(draw: st.DrawFn, index: int) -> CallSpec:
    # Mostly continuations of a random earlier call (dead branches arise naturally), now
    # and then a fresh root, which is how a restarted conversation looks in a manifest.
    parent = None
    if index > 0 and draw(st.integers(0, 4)) > 0:
        parent = draw(st.integers(0, index - 1))
    carried = draw(st.lists(token_ids, max_size=6 if parent is None else 4))
    generated = draw(st.lists(token_ids, min_size=1, max_size=5))
    logprobs = draw(st.lists(logprob_values, min_size=len(generated), max_size=len(generated)))
    return CallSpec(parent, carried, generated, logprobs, draw(st.integers(0, 50)))


@st.composite
def rollouts(draw: st.DrawFn, min_calls: int = 1) -> Built:
    count = draw(st.integers(min_calls, 6))
    specs = [draw(call_specs(index)) for index in range(count)]
    terminal = draw(st.integers(0, count - 1))
    return build_rollout(draw(identifiers), specs, terminal)


def forge(
    receipt: Mapping[str, Any], rows: Sequence[Row], index: int, **changes: Any
) -> tuple[dict[str, Any], list[Row]]:
    """A *consistent* forgery: apply ``changes`` to manifest entry ``index`` and its staged
    row header alike, then re-sign both with a recomputed call digest.

    This is what a buggy or hostile writer could produce; only the lineage checks (chain
    and cumulative hashes, parent links, lengths) can catch it.
    """
    forged = copy.deepcopy(dict(receipt))
    entry = forged["manifest"][index]
    entry.update(changes)
    header = dict(rows[index].metadata)
    header.update(changes)
    row = rows[index]
    digest = compute_call_digest(
        rollout_id=forged["rollout_id"],
        model_call_id=entry["model_call_id"],
        parent_call_id=entry["parent_call_id"],
        mode=entry["mode"],
        prev_len=entry["prev_len"],
        delta_len=entry["delta_len"],
        cum_len=entry["cum_len"],
        weight_version=entry["weight_version"],
        token_ids=row.token_ids,
        token_mask=row.token_mask,
        logprobs=row.logprobs,
        extras_digest=entry["extras_digest"],
        chain_hash=entry["chain_hash"],
        cumulative_hash=entry["cumulative_hash"],
    )
    entry["digest"] = header["digest"] = digest
    new_rows = list(rows)
    new_rows[index] = replace(row, metadata=header)
    return forged, new_rows


PREFIX_PROMPT = [1, 2, 3, 4]


def stage_chain(
    store: Any, rollout_id: str, versions: Sequence[int], *, generated: int = 3
) -> list[CallRecord]:
    """One attempt's calls through the real writer, each continuing the last (its prompt:
    everything so far and a tag): call ``c{i}`` at weight version ``versions[i]``
    generates ``generated`` tokens ``10 + i * generated ...`` with logprobs ``-0.5 - j``."""
    writer = CaptureWriter(store)
    records: list[CallRecord] = []
    tokens = list(PREFIX_PROMPT)
    for index, version in enumerate(versions):
        prompt = tokens if index == 0 else [*tokens, 9]
        out = [10 + index * generated + i for i in range(generated)]
        records.append(
            writer.stage_call(
                rollout_id=rollout_id,
                model_call_id=f"c{index}",
                parent=records[-1] if records else None,
                prompt_token_ids=prompt,
                generated_token_ids=out,
                generated_logprobs=[-0.5 - i for i in range(generated)],
                weight_version=version,
                extras={"call": index},
            )
        )
        tokens = [*prompt, *out]
    return records

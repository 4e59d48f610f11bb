"""Sample completions: what the model said, for the step's metrics, sinks and console.

The controller hands :meth:`CompletionSamples.describe` the canonical rows a step trained
(``finalize.CanonicalRowMeta`` metadata, the row's tokens); it returns what the step's
``metrics.jsonl`` record gets besides the numbers: ``samples``, the first row of each of
the first ``count`` groups as text (the prompt as the dataset has it, the completion
decoded from the row's generated tokens, the reward), and for the dataset task the mean
of each reward component (``reward_components/<name>``) over the step's rows graded in
this process, with their count (``reward_components_rows``). A row sealed before a
restart was graded by the process that died: it has its reward and its text, not its
components.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np

from ..dataplane import Row
from ..finalize import CanonicalRowMeta
from ._dataset_task import DatasetTask, Tokenizer
from ._emit_task import EmitTokenTask

__all__ = ["CompletionSamples"]

#: Text longer than this is cut in a sample (metrics.jsonl stays a log, not a dump).
_MAX_TEXT: Final = 2000


def _cut(text: str) -> str:
    return text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 3] + "..."


class CompletionSamples:
    """A step's samples and reward components (see the module docstring)."""

    def __init__(
        self, dataset: DatasetTask | EmitTokenTask, tokenizer: Tokenizer | None, *, count: int
    ) -> None:
        self._dataset = dataset
        self._tokenizer = tokenizer
        self._count = count

    def describe(self, step: int, rows: Sequence[Row]) -> dict[str, Any]:
        """The step's ``samples`` and reward component means (``step`` names the step
        in nothing but the caller's record)."""
        metas = [CanonicalRowMeta.of(row) for row in rows]
        picked = self._pick(rows, metas)
        out: dict[str, Any] = {"samples": [self._sample(row, meta) for row, meta in picked]}
        if isinstance(self._dataset, DatasetTask):
            out.update(self._component_means(rows, metas))
        return out

    def _pick(
        self, rows: Sequence[Row], metas: Sequence[CanonicalRowMeta]
    ) -> list[tuple[Row, CanonicalRowMeta]]:
        """The first row of each group first, then the others, ``count`` in all."""
        pairs = list(zip(rows, metas, strict=True))
        firsts = [pair for pair in pairs if pair[1].generation_index == 0]
        rest = [pair for pair in pairs if pair[1].generation_index != 0]
        return (firsts + rest)[: self._count]

    def _generated(self, row: Row) -> list[int]:
        mask = np.asarray(row.token_mask) > 0
        return [int(t) for t in np.asarray(row.token_ids)[mask]]

    def _text(self, token_ids: Sequence[int]) -> str:
        if isinstance(self._dataset, DatasetTask):
            return self._dataset.decode(token_ids)
        if self._tokenizer is None:
            return " ".join(map(str, token_ids))
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=False)

    def _prompt(self, idx: int) -> str:
        if isinstance(self._dataset, DatasetTask):
            return self._dataset.prompt_text(idx)
        return self._text(self._dataset[idx]["prompt_token_ids"])

    def _sample(self, row: Row, meta: CanonicalRowMeta) -> dict[str, Any]:
        idx = int(meta.prompt_id)
        generated = self._generated(row)
        sample: dict[str, Any] = {
            "group_id": meta.group_id,
            "generation_index": meta.generation_index,
            "prompt_idx": idx,
            "prompt": _cut(self._prompt(idx)),
            "completion": _cut(self._text(generated)) if meta.valid else "",
            "reward": meta.reward if meta.valid else None,
        }
        if not meta.valid:
            sample["reason"] = meta.reason
        if isinstance(self._dataset, DatasetTask) and meta.valid:
            components = self._dataset.components(idx, generated)
            if components:
                sample["components"] = dict(components)
        return sample

    def _component_means(
        self, rows: Sequence[Row], metas: Sequence[CanonicalRowMeta]
    ) -> dict[str, Any]:
        assert isinstance(self._dataset, DatasetTask)
        sums: dict[str, float] = {}
        graded = 0
        for row, meta in zip(rows, metas, strict=True):
            if not meta.valid:
                continue
            components = self._dataset.components(int(meta.prompt_id), self._generated(row))
            if components is None:
                continue
            graded += 1
            for name, value in components.items():
                sums[name] = sums.get(name, 0.0) + value
        if not sums:
            return {}
        means: Mapping[str, float] = {name: total / graded for name, total in sums.items()}
        return {"reward_components": dict(means), "reward_components_rows": graded}

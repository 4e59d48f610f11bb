"""Sample completions as each tool shows text: table rows, a markdown table, a JSON file.

A step's samples (the LLM job's ``samples``: prompt, completion, reward, where each came
from) are checked once (:func:`check_samples`) and rendered the same way for every sink:
:func:`sample_table` gives the columns and rows of a W&B table, :func:`samples_markdown`
the text TensorBoard's Text dashboard renders, and the MLflow sink stores them as a JSON
artifact per step.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..errors import InvalidArgumentTypeError

__all__ = ["SAMPLE_COLUMNS", "check_samples", "sample_table", "samples_markdown"]

#: The columns every sink shows, in order (``components`` as JSON text).
SAMPLE_COLUMNS: Final = ("row", "reward", "prompt", "completion", "components", "reason")
_PLAIN = (str, int, float, type(None))


def check_samples(samples: object) -> list[dict[str, Any]]:
    """A plain copy of a step's samples, or the first bad one named: a list of mappings
    of text, numbers or None (``components``: a mapping of numbers)."""
    if not isinstance(samples, Sequence) or isinstance(samples, str | bytes):
        raise InvalidArgumentTypeError(f"samples must be a list, got {type(samples).__name__}")
    checked: list[dict[str, Any]] = []
    for index, sample in enumerate(samples):
        where = f"$[{index}]"
        if not isinstance(sample, Mapping):
            raise InvalidArgumentTypeError(
                f"a sample must be a mapping, got {type(sample).__name__}", path=where
            )
        copy: dict[str, Any] = {}
        for key, value in sample.items():
            if not isinstance(key, str):
                raise InvalidArgumentTypeError("a sample's keys must be str", path=where)
            if key == "components" and isinstance(value, Mapping):
                copy[key] = {str(k): v for k, v in value.items() if isinstance(v, int | float)}
            elif isinstance(value, _PLAIN):
                copy[key] = value
            else:
                raise InvalidArgumentTypeError(
                    f"sample field {key!r} is a {type(value).__name__}, not text or a number",
                    path=where,
                )
        checked.append(copy)
    return checked


def _row_name(sample: Mapping[str, Any]) -> str:
    group, index = sample.get("group_id"), sample.get("generation_index")
    return f"{group}/{index}" if group is not None else str(sample.get("prompt_idx", ""))


def sample_table(samples: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    """One row per sample, :data:`SAMPLE_COLUMNS` in order."""
    rows: list[list[Any]] = []
    for sample in samples:
        components = sample.get("components")
        rows.append(
            [
                _row_name(sample),
                sample.get("reward"),
                str(sample.get("prompt", "")),
                str(sample.get("completion", "")),
                json.dumps(components, sort_keys=True) if components else "",
                str(sample.get("reason") or ""),
            ]
        )
    return rows


def _cell(value: Any) -> str:
    text = "" if value is None else (f"{value:.4g}" if isinstance(value, float) else str(value))
    # One table line per sample: newlines and pipes would end the cell.
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", "\\n")


def samples_markdown(step: int, samples: Sequence[Mapping[str, Any]]) -> str:
    """The samples as a markdown table (what TensorBoard's Text dashboard renders)."""
    lines = [
        f"samples of step {step}",
        "",
        "| " + " | ".join(SAMPLE_COLUMNS) + " |",
        "|" + "---|" * len(SAMPLE_COLUMNS),
    ]
    lines.extend("| " + " | ".join(_cell(c) for c in row) + " |" for row in sample_table(samples))
    return "\n".join(lines)

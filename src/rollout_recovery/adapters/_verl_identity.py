"""Which prompt and which sibling a verl agent-loop call is: pure, no verl import.

verl calls ``AgentLoopBase.run(sampling_params, **sample)`` once per sibling, where ``sample``
is the dataset row (``RLHFDataset.__getitem__``) plus what the trainer adds: ``uid`` (a fresh
``uuid4`` per fetch, so a re-fetched prompt gets a new one), ``session_id`` (the sibling's
position among ``rollout.n``, from the V1 worker) and ``global_steps`` (the trainer step at
fetch). The recorder's key must name the *dataset* row, stable across a restart:

- the row: ``extra_info["index"]``, which verl copies to ``sample["index"]``; verl defaults
  ``index`` to 0 when the row has none, so a row without a stamped index is keyed by the
  digest of its ``raw_prompt`` instead (two rows with the same messages are then one prompt);
- the split: ``extra_info["split"]`` when present (verl's data scripts stamp it), so a
  validation row never shares a key with the training row of the same index;
- the epoch: ``sample["epoch"]`` when the dataset stamps it, else ``(global_steps - 1) //
  steps_per_epoch`` when the caller gives ``steps_per_epoch``, else 0, allowed only when the
  run has one epoch (else a row's second epoch would be answered with its first epoch's
  outputs).

``uid`` is recorded as an alias; it is never the key.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import ConfigError, InvalidArgumentError, InvalidArgumentTypeError

__all__ = ["JsonValue", "aliases_of", "json_value", "prompt_key", "sibling_of"]

JsonValue = None | bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"]


def json_value(value: Any, *, path: str = "$") -> JsonValue:
    """``value`` as plain JSON data: numpy scalars and arrays (verl's non-tensor batch hands
    dataset fields over as numpy objects) become Python values and lists.

    Raises InvalidArgumentTypeError at the first value JSON cannot hold (an image, a
    tensor), naming where it is: such an output is not recorded (see ``verl.py``).
    """
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidArgumentTypeError(f"{value} is not JSON (not a finite number)", path=path)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.generic):
        return json_value(value.item(), path=path)
    if isinstance(value, np.ndarray):
        return json_value(value.tolist(), path=path)
    if isinstance(value, list | tuple):
        return [json_value(item, path=f"{path}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, Mapping):
        out: dict[str, JsonValue] = {}
        for name, item in value.items():
            if not isinstance(name, str):
                raise InvalidArgumentTypeError(
                    f"a mapping key is {type(name).__name__}, not str", path=path
                )
            out[name] = json_value(item, path=f"{path}.{name}")
        return out
    raise InvalidArgumentTypeError(
        f"{type(value).__name__} is not JSON data (text, numbers, lists, mappings)", path=path
    )


def _extra_info(sample: Mapping[str, Any]) -> Mapping[str, Any]:
    info = sample.get("extra_info")
    return info if isinstance(info, Mapping) else {}


def _epoch(sample: Mapping[str, Any], steps_per_epoch: int | None, total_epochs: int) -> int:
    if "epoch" in sample:
        return int(sample["epoch"])
    if steps_per_epoch is not None and "global_steps" in sample:
        return max(int(sample["global_steps"]) - 1, 0) // steps_per_epoch
    if total_epochs > 1:
        raise ConfigError(
            f"trainer.total_epochs is {total_epochs} and the sample has no 'epoch' field: set "
            "steps_per_epoch in the recovering loop's config (len(train_dataset) // "
            "data.train_batch_size), or stamp 'epoch' in the dataset rows; without either a "
            "row's later epochs would be answered with its first epoch's outputs"
        )
    return 0


def prompt_key(
    sample: Mapping[str, Any], *, steps_per_epoch: int | None = None, total_epochs: int = 1
) -> str:
    """The dataset identity of the sample's prompt: ``verl:<split>:e<epoch>:<row>``, where
    ``<row>`` is ``i<index>`` or ``d<digest of raw_prompt>`` (see the module docstring)."""
    info = _extra_info(sample)
    split = str(info.get("split", "data"))
    epoch = _epoch(sample, steps_per_epoch, total_epochs)
    if "index" in info:
        row = f"i{int(info['index'])}"
    elif "extra_info" not in sample and "index" in sample:
        row = f"i{int(sample['index'])}"
    else:
        canonical = json.dumps(
            json_value(sample.get("raw_prompt"), path="$.raw_prompt"),
            sort_keys=True,
            separators=(",", ":"),
        )
        row = "d" + hashlib.sha256(canonical.encode()).hexdigest()[:24]
    return f"verl:{split}:e{epoch}:{row}"


def sibling_of(sample: Mapping[str, Any], group_size: int) -> int:
    """The sibling's position: ``session_id``, which verl's V1 worker passes (one loop per
    ``rollout.n`` session). The classic trainer repeats the row ``n`` times without one: its
    siblings cannot be told apart across a restart, so it is refused."""
    if "session_id" not in sample:
        raise InvalidArgumentError(
            "the sample has no 'session_id': the recovering agent loop needs verl's V1 "
            "trainer (verl.trainer.ppo.v1), whose worker numbers the rollout.n siblings",
            path="$.session_id",
        )
    sibling = int(sample["session_id"])
    if not 0 <= sibling < group_size:
        raise InvalidArgumentError(
            f"session_id {sibling} is outside 0..{group_size - 1} (rollout.n = {group_size})",
            path="$.session_id",
        )
    return sibling


def aliases_of(sample: Mapping[str, Any]) -> tuple[str, ...]:
    """verl's own ids of this fetch (``uid``), recorded beside the key."""
    uid = sample.get("uid")
    return (f"uid:{uid}",) if uid is not None else ()

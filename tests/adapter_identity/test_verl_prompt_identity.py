"""verl samples to recorder keys (``adapters._verl_identity``): pure, no verl needed.

The key must name the dataset row across a restart: never verl's per-fetch ``uid``, never a
defaulted index, and never the same for a row's two epochs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout_recovery.adapters._verl_identity import (
    aliases_of,
    json_value,
    prompt_key,
    sibling_of,
)
from rollout_recovery.errors import ConfigError, InvalidArgumentError, InvalidArgumentTypeError

MESSAGES = [{"role": "user", "content": "Count on from 7:"}]


def sample(**fields: Any) -> dict[str, Any]:
    """A row as verl's RLHFDataset hands it over (numpy scalars from the non-tensor batch)."""
    row: dict[str, Any] = {
        "raw_prompt": np.array(MESSAGES, dtype=object),
        "extra_info": {"index": np.int64(7), "split": "train"},
        "index": np.int64(7),
        "uid": "8c1f-first-fetch",
        "session_id": 1,
        "global_steps": 5,
    }
    row.update(fields)
    return row


def test_a_prompt_fetched_again_under_a_new_uid_has_the_same_key() -> None:
    first, again = sample(), sample(uid="03aa-second-fetch", global_steps=6)
    assert prompt_key(first) == prompt_key(again) == "verl:train:e0:i7"
    assert aliases_of(first) == ("uid:8c1f-first-fetch",)
    assert aliases_of(again) == ("uid:03aa-second-fetch",)


def test_a_validation_row_never_shares_the_training_rows_key() -> None:
    validation = sample(extra_info={"index": 7, "split": "test"})
    assert prompt_key(validation) != prompt_key(sample())


def test_a_row_without_a_stamped_index_is_keyed_by_its_messages() -> None:
    # RLHFDataset stamps index 0 on every row whose extra_info has none: not an identity.
    other = [{"role": "user", "content": "Count on from 8:"}]
    unstamped = sample(extra_info={}, index=0)
    assert prompt_key(unstamped).startswith("verl:data:e0:d")
    assert prompt_key(unstamped) != prompt_key(sample(extra_info={}, index=0, raw_prompt=other))
    assert prompt_key(unstamped) == prompt_key(sample(extra_info={}, index=0, uid="new"))


def test_a_dataset_without_extra_info_keys_by_its_own_index() -> None:
    row = sample()
    del row["extra_info"]
    assert prompt_key(row) == "verl:data:e0:i7"


@pytest.mark.parametrize(("step", "epoch"), [(1, 0), (4, 0), (5, 1), (9, 2)])
def test_the_epoch_comes_from_the_fetch_step(step: int, epoch: int) -> None:
    key = prompt_key(sample(global_steps=step), steps_per_epoch=4, total_epochs=3)
    assert key == f"verl:train:e{epoch}:i7"


def test_a_stamped_epoch_wins() -> None:
    assert prompt_key(sample(epoch=np.int64(2)), total_epochs=3) == "verl:train:e2:i7"


def test_several_epochs_without_an_epoch_are_refused() -> None:
    with pytest.raises(ConfigError, match="steps_per_epoch"):
        prompt_key(sample(), total_epochs=2)


def test_the_sibling_is_the_session_id() -> None:
    assert sibling_of(sample(session_id=np.int64(2)), group_size=3) == 2
    with pytest.raises(InvalidArgumentError, match="V1 trainer"):
        sibling_of({"index": 7}, group_size=3)
    with pytest.raises(InvalidArgumentError, match=r"outside 0\.\.2"):
        sibling_of(sample(session_id=3), group_size=3)


def test_numpy_values_become_json_and_anything_else_is_named() -> None:
    assert json_value({"a": np.array([1, 2]), "b": (np.float32(0.5), None)}) == {
        "a": [1, 2],
        "b": [0.5, None],
    }
    with pytest.raises(InvalidArgumentTypeError) as error:
        json_value({"extra_fields": {"image": object()}}, path="$.output")
    assert error.value.path == "$.output.extra_fields.image"
    with pytest.raises(InvalidArgumentTypeError, match="not str"):
        json_value({1: "x"})
    with pytest.raises(InvalidArgumentTypeError, match="finite") as error:
        json_value({"logprobs": [-0.5, float("-inf")]})
    assert error.value.path == "$.logprobs[1]"


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(JSON)
def test_json_data_passes_through_unchanged(value: Any) -> None:
    assert json_value(value) == value

"""The dataset task (issue 27 item 1): a dataset in every format the `datasets` library
reads, prompts rendered by the chat template, the row's fields handed to the reward, and
a digest that makes other data another job."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from dataset_support import FORMATS, ROWS, write_dataset, write_reward

from rollout_recovery._reward_function import RewardConfig
from rollout_recovery.errors import ConfigError, InvalidArgumentError
from rollout_recovery.llm import ModelConfig
from rollout_recovery.llm._dataset import load_rows, resolve_dataset
from rollout_recovery.llm._dataset_task import DatasetEpisodes, DatasetTask
from rollout_recovery.policy import TaskConfig
from rollout_recovery.rollout import Completion

pytest.importorskip("datasets")


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def _task(path: Path, **fields: Any) -> TaskConfig:
    return TaskConfig(kind="dataset", path=str(path), **fields)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_reads_the_same_rows_in_file_order(tmp_path: Path, fmt: str) -> None:
    rows = load_rows(_task(write_dataset(tmp_path, fmt)))
    assert len(rows) == len(ROWS)
    assert [dict(rows[i]) for i in range(len(rows))] == ROWS


def test_a_saved_dataset_dict_gives_the_split_named(tmp_path: Path) -> None:
    path = write_dataset(tmp_path, "disk_dict")
    assert len(load_rows(_task(path, split="test"))) == 2
    with pytest.raises(ConfigError) as refused:
        load_rows(_task(path, split="validation"))
    assert refused.value.path == "$.task.split"
    assert "['test', 'train']" in str(refused.value)


@pytest.mark.parametrize(
    ("fields", "path_of", "message"),
    [
        ({"prompt_field": "question"}, "$.task.prompt_field", "no column 'question'"),
        ({"messages_field": "chat"}, "$.task.messages_field", "no column 'chat'"),
    ],
)
def test_a_missing_column_is_refused_naming_the_columns(
    tmp_path: Path, fields: dict[str, str], path_of: str, message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_rows(_task(write_dataset(tmp_path, "jsonl"), **fields))
    assert refused.value.path == path_of
    assert message in str(refused.value) and "['prompt', 'answer', 'level']" in str(refused.value)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("data.txt", "1+1=\n", "reads .csv, .json, .jsonl, .parquet files"),
        ("empty.jsonl", "", "could not be read"),
        ("bad.jsonl", "{not json\n", "could not be read"),
    ],
)
def test_a_file_that_is_no_dataset_is_refused(
    tmp_path: Path, name: str, content: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ConfigError) as refused:
        load_rows(_task(path))
    assert refused.value.path == "$.task.path" and message in str(refused.value)


def test_a_missing_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        load_rows(_task(tmp_path / "nope.jsonl"))
    assert "does not exist" in str(refused.value)
    with pytest.raises(ConfigError) as empty:
        load_rows(TaskConfig(kind="dataset"))
    assert empty.value.path == "$.task.path"


def test_a_prompt_is_one_user_message_in_the_chat_template(tmp_path: Path, tokenizer: Any) -> None:
    task = DatasetTask(
        load_rows(_task(write_dataset(tmp_path, "jsonl"))), _task(tmp_path), tokenizer
    )
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "1+2="}], add_generation_prompt=True, tokenize=False
    )
    assert rendered == "<|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n"
    item = task[5]  # row 5 is 1+2=
    assert item["prompt_token_ids"] == tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert item["idx"] == 5 and item["task_name"] == "dataset"
    assert task[5] == item  # a pure function of the row: the same after a restart
    assert task.prompt_text(5) == "1+2="
    assert task.field_names == ["answer", "level"]


def test_a_messages_field_is_rendered_as_the_chat(tmp_path: Path, tokenizer: Any) -> None:
    chats = [
        {
            "chat": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": f"{a}+1="},
            ],
            "answer": a + 1,
        }
        for a in range(3)
    ]
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in chats))
    config = _task(path, messages_field="chat")
    task = DatasetTask(load_rows(config), config, tokenizer)
    expected = tokenizer.apply_chat_template(
        chats[2]["chat"], add_generation_prompt=True, tokenize=False
    )
    assert task.prompt_ids(2) == tokenizer(expected, add_special_tokens=False)["input_ids"]
    assert task.prompt_text(2) == "2+1="


def test_a_prompt_that_is_not_text_says_to_use_messages_field(
    tmp_path: Path, tokenizer: Any
) -> None:
    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps({"prompt": [1, 2], "answer": 1}) + "\n")
    task = DatasetTask(load_rows(_task(path)), _task(path), tokenizer)
    with pytest.raises(InvalidArgumentError) as refused:
        task[0]
    assert "messages_field" in str(refused.value)


def test_the_digest_is_the_data_and_the_tokenizer(tmp_path: Path, tiny_model_dir: Path) -> None:
    path = write_dataset(tmp_path / "a", "jsonl")
    resolved = resolve_dataset(_task(path), tiny_model_dir)
    assert resolved.dataset_size == len(ROWS) and len(resolved.digest) == 64
    # The same data elsewhere is the same job; one changed row is another.
    moved = write_dataset(tmp_path / "b", "jsonl")
    assert resolve_dataset(_task(moved), tiny_model_dir).digest == resolved.digest
    changed = write_dataset(tmp_path / "c", "jsonl", [*ROWS[:-1], {**ROWS[-1], "answer": 99}])
    assert resolve_dataset(_task(changed), tiny_model_dir).digest != resolved.digest
    with pytest.raises(ConfigError) as refused:
        resolve_dataset(_task(changed, digest=resolved.digest), tiny_model_dir)
    assert refused.value.path == "$.task.digest" and "the data changed" in str(refused.value)


def test_the_model_config_resolves_only_the_dataset_task(tmp_path: Path, model_cache: Path) -> None:
    model = ModelConfig(source="tiny-llama", cache_dir=str(model_cache))
    emit = TaskConfig(kind="emit_token")
    assert model.resolved_dataset(emit) is emit
    config = _task(write_dataset(tmp_path, "csv"))
    assert model.resolved_dataset(config).dataset_size == len(ROWS)


def test_grading_gives_the_reward_the_prompt_completion_and_fields(
    tmp_path: Path, tokenizer: Any
) -> None:
    config = _task(write_dataset(tmp_path, "jsonl"))
    task = DatasetTask(load_rows(config), config, tokenizer)
    seen: list[dict[str, Any]] = []

    class Spy:
        async def score(self, arguments: dict[str, Any]) -> tuple[float, dict[str, float]]:
            seen.append(dict(arguments))
            return 1.5, {"a": 1.0, "b": 0.5}

    episodes = DatasetEpisodes(task, Spy(), max_tokens=3)
    episode = episodes.episode(task[4])
    turn = episode.next_turn()
    assert turn is not None and list(turn.prompt_ids) == task[4]["prompt_token_ids"]
    completion = tokenizer("3 ok", add_special_tokens=False)["input_ids"]
    episode.observe(
        Completion(token_ids=completion, logprobs=[0.0] * len(completion), weight_version=0)
    )
    assert episode.next_turn() is None
    reward, checks = asyncio.run(episode.grade())  # type: ignore[arg-type]
    assert (reward, checks) == (1.5, None)
    assert seen == [
        {
            "prompt": "1+1=",
            "answer": 2,
            "level": "easy",
            "completion": "3 ok",
            "completion_ids": completion,
        }
    ]
    assert task.components(4, completion) == {"a": 1.0, "b": 0.5}


def test_a_payload_of_other_tokens_is_a_bug_not_a_failed_attempt(
    tmp_path: Path, tokenizer: Any
) -> None:
    config = _task(write_dataset(tmp_path, "jsonl"))
    task = DatasetTask(load_rows(config), config, tokenizer)
    reward = RewardConfig(function=f"{write_reward(tmp_path)}:score").load(task.field_names)
    episodes = DatasetEpisodes(task, reward, max_tokens=3)
    wrong = {**task[1], "prompt_token_ids": task[2]["prompt_token_ids"]}
    with pytest.raises(InvalidArgumentError):
        episodes.episode(wrong)
    assert msgspec.json.encode(task[1])  # the payload is plain data the ledger can keep

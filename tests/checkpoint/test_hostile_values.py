"""Crafted values inside a well-formed file get the documented error, naming the field.

Found by review: a 2^1500 integer (which the .pt format can carry) reached float() and
escaped as OverflowError; a deeply nested JSON document inside a log context escaped as
RecursionError, through the loader and through ``rollout-recovery validate``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rollout_recovery import RolloutRecoveryLedger, build_rollout_recovery_state
from rollout_recovery.checkpoint import load_sidecar
from rollout_recovery.checkpoint._sidecar_io import encode_sidecar
from rollout_recovery.checkpoint._torch_pt import encode_torch_pt
from rollout_recovery.cli._main import cli
from rollout_recovery.errors import InvalidStateError


class _Cut:
    def require_live(self) -> None:
        return None


def _state() -> dict[str, Any]:
    cut = _Cut()
    ledger = RolloutRecoveryLedger()
    ledger.reserve_group(
        cut,
        prompt_id="1",
        prompt_payload={"idx": 1},
        expected_generations=2,
        target_step=0,
        start_weight_version=0,
        group_id="g",
    )
    ledger.mark_group_dispatched(cut, "g")
    gate = ledger.get_group("g").gate_rollout_id(0)
    ledger.mark_sibling_sealed(
        cut,
        "g",
        generation_index=0,
        gate_rollout_id=gate,
        receipt=None,
        reward=1.0,
        mask_sample=False,
    )
    return build_rollout_recovery_state(
        ledger, batch_shortfall={}, sampler_stamps_target_steps=True
    )


DEEP_JSON = "[" * 100_000 + "]" * 100_000


def _attempt(state: dict[str, Any]) -> dict[str, Any]:
    attempt: dict[str, Any] = state["groups"][0]["siblings"][0]["attempts"][0]
    return attempt


CASES: list[tuple[str, str, Callable[[dict[str, Any]], None], str]] = [
    ("huge-reward", "pt", lambda s: _attempt(s).__setitem__("reward", 2**1500), ".reward"),
    (
        "huge-metric",
        "pt",
        lambda s: s.__setitem__("finalizer_metrics_by_group", {"x": {"m": 2**1500}}),
        "finalizer_metrics_by_group",
    ),
    (
        "deep-json-context",
        "native",
        lambda s: _attempt(s).__setitem__(
            "reward_log_context", {"agent_name": "a", "full_result_json": DEEP_JSON}
        ),
        "reward_log_context",
    ),
    (
        "deep-json-context-pt",
        "pt",
        lambda s: _attempt(s).__setitem__(
            "reward_log_context", {"agent_name": "a", "full_result_json": DEEP_JSON}
        ),
        "reward_log_context",
    ),
]


def _write(path: Path, state: dict[str, Any], format: str) -> None:
    if format == "pt":
        path.write_bytes(encode_torch_pt(state))
    else:
        path.write_bytes(encode_sidecar(state, format="native", validate=False))


@pytest.mark.parametrize(("name", "format", "mutate", "where"), CASES, ids=[c[0] for c in CASES])
def test_crafted_values_get_the_documented_error(
    tmp_path: Path, name: str, format: str, mutate: Callable[[dict[str, Any]], None], where: str
) -> None:
    state = copy.deepcopy(_state())
    mutate(state)
    path = tmp_path / name
    _write(path, state, format)
    with pytest.raises(InvalidStateError) as caught:
        load_sidecar(path)
    assert caught.value.path is not None and where in caught.value.path
    result = CliRunner().invoke(cli, ["validate", str(path)])
    # A crash would surface as result.exception (a non-SystemExit) with exit code 1 too.
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 1, result.output
    assert where in result.output


# --- lone surrogates: a pickle carries them (BINUNICODE is "surrogatepass"), nothing else can


def _pickled_pt(state: dict[str, Any]) -> bytes:
    """A .pt whose data.pkl is CPython's own pickle, which keeps lone surrogates."""
    import pickle

    from rollout_recovery.checkpoint._torch_pt import _zip_records

    return _zip_records("archive", pickle.dumps(state, protocol=2))


LONE = "\ud800"
SURROGATE_CASES: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("receipt-value", lambda s: _attempt(s).__setitem__("receipt", None), ""),  # replaced below
    ("status", lambda s: _attempt(s).__setitem__("status", "sealed" + LONE), ".status"),
    ("task-source", lambda s: s["groups"][0].__setitem__("task_source", LONE), ".task_source"),
    ("dict-key", lambda s: s["groups"][0]["prompt_ref"].__setitem__(LONE, 1), "prompt_ref"),
]


def _with_receipt(state: dict[str, Any]) -> None:
    attempt = _attempt(state)
    gate = f"g_g0_a{attempt['attempt_uuid'].hex()}"
    attempt["receipt"] = {"rollout_id": gate, "manifest": [], "note": "x" + LONE}


SURROGATE_CASES[0] = ("receipt-value", _with_receipt, ".receipt.note")


@pytest.mark.parametrize(
    ("name", "mutate", "where"), SURROGATE_CASES, ids=[c[0] for c in SURROGATE_CASES]
)
def test_a_pt_holding_a_lone_surrogate_is_refused_on_every_way_in(
    tmp_path: Path, name: str, mutate: Callable[[dict[str, Any]], None], where: str
) -> None:
    state = copy.deepcopy(_state())
    mutate(state)
    path = tmp_path / f"{name}.pt"
    path.write_bytes(_pickled_pt(state))
    with pytest.raises(InvalidStateError, match="lone surrogates") as caught:
        load_sidecar(path)
    assert caught.value.path is not None and where in caught.value.path
    commands = [
        ["validate", str(path)],
        ["inspect", str(path)],
        ["inspect", "--json", str(path)],
        ["convert", "--to", "native", str(path), str(tmp_path / "out")],
    ]
    for command in commands:
        result = CliRunner().invoke(cli, command)
        # A clean refusal (1: invalid, 2: unreadable), never a traceback.
        assert isinstance(result.exception, SystemExit), (command, repr(result.exception))
        assert result.exit_code in (1, 2), (command, result.output)
        assert "lone surrogates" in result.output, (command, result.output)
    assert not (tmp_path / "out").exists()


def test_the_pt_writer_refuses_a_lone_surrogate_instead_of_writing_it() -> None:
    state = copy.deepcopy(_state())
    state["groups"][0]["task_source"] = LONE
    with pytest.raises(InvalidStateError, match="lone surrogates") as caught:
        encode_torch_pt(state)
    assert caught.value.path == "$.groups[0].task_source"


def test_a_reward_log_context_with_a_lone_surrogate_is_refused_at_the_seal() -> None:
    from rollout_recovery import RewardLogContext

    with pytest.raises(InvalidStateError, match="lone surrogate"):
        RewardLogContext(agent_name="a" + LONE)
    with pytest.raises(InvalidStateError, match="lone surrogate"):
        RewardLogContext(agent_name="a", full_result_json='{"k": "' + LONE + '"}')


# --- one nesting bound for receipts, whatever the path


def _nested(levels: int) -> dict[str, Any]:
    """A dict holding containers ``levels`` deep, itself included."""
    root: dict[str, Any] = {}
    node = root
    for _ in range(levels - 1):
        node["a"] = {}
        node = node["a"]
    return root


def _state_with_receipt_depth(levels: int) -> dict[str, Any]:
    state = copy.deepcopy(_state())
    attempt = _attempt(state)
    gate = f"g_g0_a{attempt['attempt_uuid'].hex()}"
    receipt = _nested(levels - 1) if levels > 1 else {}
    attempt["receipt"] = {"rollout_id": gate, "manifest": [], "deep": receipt}
    return state


@pytest.mark.parametrize("format", ["native", "pt"])
def test_a_receipt_deeper_than_a_seal_allows_is_refused_by_both_loaders(
    tmp_path: Path, format: str
) -> None:
    path = tmp_path / "deep"
    state = _state_with_receipt_depth(65)
    path.write_bytes(
        encode_sidecar(state, format="native", validate=False)
        if format == "native"
        else _pickled_pt(state)
    )
    with pytest.raises(InvalidStateError, match="deeper than") as caught:
        load_sidecar(path)
    assert caught.value.path is not None and ".receipt" in caught.value.path


@pytest.mark.parametrize("format", ["native", "pt"])
def test_a_receipt_as_deep_as_a_seal_allows_writes_and_loads_in_both_formats(
    tmp_path: Path, format: str
) -> None:
    from rollout_recovery.ledger._plain import validated_plain_copy

    state = _state_with_receipt_depth(64)
    validated_plain_copy(_attempt(state)["receipt"])  # what a seal accepts
    path = tmp_path / "deep"
    path.write_bytes(encode_sidecar(state, format=format))  # type: ignore[arg-type]
    assert load_sidecar(path).state["groups"][0]["siblings"][0]["attempts"][0]["receipt"]

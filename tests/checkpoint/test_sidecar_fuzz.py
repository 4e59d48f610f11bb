"""Fuzzing the sidecar readers: damaged bytes and malformed state dicts.

The contract under test: whatever the input, loading either yields exactly the state that
was written, or raises the project's documented error (``InvalidStateError``, which
``SidecarFormatError`` derives from, or ``InvalidStateTypeError``), within a bounded time.
Any other exception, a different state, or a hang fails the test.
"""

from __future__ import annotations

import contextlib
import copy
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sidecar_fixtures import rich_state

from rollout_recovery import InvalidStateError, InvalidStateTypeError
from rollout_recovery.checkpoint._problems import find_sidecar_problems
from rollout_recovery.checkpoint._sidecar_io import (
    decode_sidecar,
    encode_sidecar,
    validate_sidecar_state,
)

DOCUMENTED = (InvalidStateError, InvalidStateTypeError)
STATE = rich_state()
FILES = {fmt: encode_sidecar(STATE, format=fmt) for fmt in ("native", "pt")}
# Generous: a sidecar this small loads in milliseconds; only a hang or a blow-up exceeds it.
# CPU time of this process, so a loaded machine cannot fail the bound (a decode bomb
# would blow any bound, however generous).
TIME_LIMIT = 5.0


def load_bytes(data: bytes) -> dict[Any, Any]:
    """What ``load_sidecar`` does after reading the file."""
    _, state = decode_sidecar(data)
    validate_sidecar_state(state)
    return state


def assert_identical_or_documented(data: bytes, expected: object) -> str:
    start = time.process_time()
    try:
        state = load_bytes(data)
    except DOCUMENTED:
        outcome = "refused"
    else:
        assert state == expected, "a damaged file loaded to a different state"
        outcome = "identical"
    assert time.process_time() - start < TIME_LIMIT
    return outcome


# ---------------------------------------------------------------------------- bytes


@pytest.mark.parametrize("fmt", sorted(FILES))
def test_every_truncation_is_refused(fmt: str) -> None:
    data = FILES[fmt]
    for length in range(len(data)):
        assert assert_identical_or_documented(data[:length], STATE) == "refused", length


@pytest.mark.parametrize("fmt", sorted(FILES))
def test_every_single_byte_flip_sweep(fmt: str) -> None:
    """Each byte XOR 0xFF, at a stride that keeps the sweep a few thousand loads."""
    data = FILES[fmt]
    stride = max(1, len(data) // 3000)
    for position in range(0, len(data), stride):
        mutated = bytearray(data)
        mutated[position] ^= 0xFF
        assert_identical_or_documented(bytes(mutated), STATE)


_MUTATION = st.tuples(
    st.sampled_from(["flip", "set", "insert", "delete", "splice"]),
    st.integers(0, 2**32),
    st.binary(min_size=1, max_size=8),
)


def _mutate(data: bytes, mutations: list[tuple[str, int, bytes]]) -> bytes:
    out = bytearray(data)
    for kind, where, blob in mutations:
        if not out:
            break
        at = where % len(out)
        if kind == "flip":
            out[at] ^= blob[0] or 1
        elif kind == "set":
            out[at : at + len(blob)] = blob
        elif kind == "insert":
            out[at:at] = blob
        elif kind == "delete":
            del out[at : at + len(blob)]
        else:  # splice: copy a run of the file elsewhere (valid-looking structure)
            source = blob[0] * 7 % len(out)
            out[at:at] = out[source : source + len(blob) * 4]
    return bytes(out)


@pytest.mark.parametrize("fmt", sorted(FILES))
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutations=st.lists(_MUTATION, min_size=1, max_size=4))
def test_random_byte_mutations(fmt: str, mutations: list[tuple[str, int, bytes]]) -> None:
    assert_identical_or_documented(_mutate(FILES[fmt], mutations), STATE)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200), prefix=st.sampled_from([b"", b"PK\x03\x04"]))
def test_arbitrary_bytes(data: bytes, prefix: bytes) -> None:
    from rollout_recovery.checkpoint._native import MAGIC

    for head in (prefix, MAGIC):
        assert_identical_or_documented(head + data, STATE)


# ---------------------------------------------------------------------- state dicts


def _slots(node: Any, out: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """Every (container, key) pair of the tree, parents before children."""
    if isinstance(node, dict):
        for key in list(node):
            out.append((node, key))
            _slots(node[key], out)
    elif isinstance(node, list):
        for index in range(len(node)):
            out.append((node, index))
            _slots(node[index], out)
    return out


WRONG_VALUES = [None, 0, -1, True, 1.5, "x", "", b"\x00" * 16, [], {}, {"k": 1}, [None], 2**63]


def _mutate_state(state: dict[str, Any], kind: str, choice: int, value: Any) -> None:
    slots = _slots(state, [])
    container, key = slots[choice % len(slots)]
    value = copy.deepcopy(value)  # never share one WRONG_VALUES object between slots
    if kind == "wrong_type":
        container[key] = value
    elif kind == "unknown_field":
        target = container if isinstance(container, dict) else container[key]
        if isinstance(target, dict):
            target["unexpected"] = value
        else:
            container[key] = {"unexpected": value}
    elif kind == "missing_key":
        if isinstance(container, dict):
            del container[key]
        else:
            container.pop(key)
    elif kind == "duplicate":
        # Duplicate a list element (a group, a sibling, an attempt, a manifest entry...).
        if isinstance(container, list):
            container.insert(key, copy.deepcopy(container[key]))
        else:
            container[key] = copy.deepcopy(container[key])
    else:  # shared_id: reuse another group's id or an attempt's uuid elsewhere
        # An earlier mutation may have removed what this one needs.
        with contextlib.suppress(KeyError, TypeError, IndexError, ZeroDivisionError):
            _share_id(state, kind, choice)


def _share_id(state: dict[str, Any], kind: str, choice: int) -> None:
    if True:
        groups = state["groups"]
        first, second = groups[choice % len(groups)], groups[(choice + 1) % len(groups)]
        if kind == "shared_group_id":
            second["group_id"] = first["group_id"]
        else:
            second["siblings"][0]["attempts"][0]["attempt_uuid"] = first["siblings"][0]["attempts"][
                0
            ]["attempt_uuid"]


STATE_MUTATION = st.tuples(
    st.sampled_from(
        [
            "wrong_type",
            "unknown_field",
            "missing_key",
            "duplicate",
            "shared_group_id",
            "shared_uuid",
        ]
    ),
    st.integers(0, 10**6),
    st.sampled_from(WRONG_VALUES),
)


@pytest.mark.slow
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutations=st.lists(STATE_MUTATION, min_size=1, max_size=3))
def test_structural_mutations(mutations: list[tuple[str, int, Any]]) -> None:
    state = copy.deepcopy(STATE)
    for kind, choice, value in mutations:
        _mutate_state(state, kind, choice, value)
    snapshot = copy.deepcopy(state)
    try:
        validate_sidecar_state(state)
        valid = True
    except DOCUMENTED:
        valid = False
    # validate's listing agrees with the loader: no problems exactly when it loads.
    assert (find_sidecar_problems(state) == []) == valid
    for fmt in ("native", "pt"):
        # The checked writer: refuses with a documented error, or reads back identical.
        try:
            data = encode_sidecar(state, format=fmt)  # type: ignore[arg-type]
        except DOCUMENTED:
            pass
        else:
            assert valid
            assert assert_identical_or_documented(data, snapshot) == "identical"
        # An unchecked (hostile or buggy) writer: the reader alone must hold the line.
        try:
            data = encode_sidecar(state, format=fmt, validate=False)  # type: ignore[arg-type]
        except DOCUMENTED:
            continue
        outcome = assert_identical_or_documented(data, snapshot)
        if not valid:
            assert outcome == "refused"
    assert state == snapshot  # nothing above mutated its input


@pytest.mark.parametrize("fmt", sorted(FILES))
def test_self_referencing_state_is_refused_on_write(fmt: str) -> None:
    """Found by the structural fuzzer: a cycle in memory must not escape as RecursionError."""
    state = copy.deepcopy(STATE)
    loop: list[Any] = []
    loop.append(loop)
    state["groups"][2]["siblings"][0]["attempts"][0]["receipt"]["meta"]["loop"] = loop
    with pytest.raises(DOCUMENTED):
        encode_sidecar(state, format=fmt)  # type: ignore[arg-type]
    with pytest.raises(DOCUMENTED):
        encode_sidecar(state, format=fmt, validate=False)  # type: ignore[arg-type]

"""The torch-free ``rollout_recovery.pt`` codec: goldens, interop with real torch, refusals, fuzz.

Tests marked ``torch`` skip when torch is not installed (``pip install torch==2.13.0``).
"""

from __future__ import annotations

import enum
import io
import math
import os
import pickle
import random
import struct
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from make_golden_pt import (
    DATA,
    golden_expectations,
    malicious_archive,
    sidecar_v3,
)

from rollout_recovery.checkpoint._torch_pt import (
    ADMITTED_GLOBALS,
    DEFAULT_MAX_DEPTH,
    _SidecarUnpickler,
    _zip_records,
    decode_torch_pt,
    encode_torch_pt,
    looks_like_torch_zip,
    read_torch_pt,
    write_torch_pt,
)
from rollout_recovery.errors import InvalidStateError, InvalidStateTypeError

PWNED = Path("/tmp/rollout_recovery_pwned")


def assert_identical(actual: Any, expected: Any, path: str = "$") -> None:
    """Equality that also demands equal types (``True == 1`` and ``0.0 == -0.0`` in Python)."""
    assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
    if type(expected) is dict:
        assert list(actual) == list(expected), f"{path}: keys or key order differ"
        for key in expected:
            assert type(key) is type(next(k for k in actual if k == key)), f"{path} key {key!r}"
            assert_identical(actual[key], expected[key], f"{path}[{key!r}]")
    elif type(expected) is list:
        assert len(actual) == len(expected), f"{path}: lengths differ"
        for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_identical(a, e, f"{path}[{index}]")
    elif type(expected) is float:
        assert struct.pack(">d", actual) == struct.pack(">d", expected), f"{path}: {actual}"
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


# ---------------------------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------------------------

_leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.integers(min_value=-(2**2000), max_value=2**2000)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=24)
)
_keys = st.text(max_size=12) | st.integers(min_value=-(2**64), max_value=2**64)
_trees = st.recursive(
    _leaves,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(_keys, children, max_size=5),
    max_leaves=40,
)
primitive_dicts = st.dictionaries(_keys, _trees, max_size=8)


# ---------------------------------------------------------------------------------------------
# Golden files made by real torch 2.13 (read without torch)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(golden_expectations()))
def test_golden_file_reads_to_expected_dict(name: str) -> None:
    data = (DATA / name).read_bytes()
    assert looks_like_torch_zip(data)
    assert_identical(decode_torch_pt(data), golden_expectations()[name])
    assert_identical(read_torch_pt(DATA / name), golden_expectations()[name])


def test_golden_sidecar_types_survive() -> None:
    state = read_torch_pt(DATA / "sidecar_v3.pt")
    attempt = state["groups"][0]["siblings"][1]["attempts"][1]
    assert type(attempt["attempt_uuid"]) is bytes and len(attempt["attempt_uuid"]) == 16
    assert state["batch_shortfall"] == {7: 1} and type(next(iter(state["batch_shortfall"]))) is int
    assert state["groups"][1]["target_step"] is None
    assert state["sampler_stamps_target_steps"] is True


def test_golden_archive_folder_names_differ_but_both_read() -> None:
    names = {
        zipfile.ZipFile(DATA / name).namelist()[0]
        for name in ("sidecar_v3.pt", "sidecar_v3_buffer.pt")
    }
    assert names == {"sidecar_v3/data.pkl", "archive/data.pkl"}


def test_golden_files_are_small() -> None:
    for path in DATA.iterdir():
        assert path.stat().st_size < 16 * 1024, path


# ---------------------------------------------------------------------------------------------
# Malicious input is refused, never executed
# ---------------------------------------------------------------------------------------------


def test_malicious_file_is_refused_naming_the_global() -> None:
    PWNED.unlink(missing_ok=True)
    data = (DATA / "malicious_os_system.pt").read_bytes()
    assert data == malicious_archive()
    assert looks_like_torch_zip(data)  # detection is a format guess; reading is the gate
    with pytest.raises(InvalidStateError, match=r"'posix\.system'"):
        read_torch_pt(DATA / "malicious_os_system.pt")
    assert not PWNED.exists()


def test_restricted_unpickler_alone_refuses_globals() -> None:
    # Defence in depth: even with the opcode scanner bypassed, find_class is the gate.
    pkl = zipfile.ZipFile(DATA / "malicious_os_system.pt").read("archive/data.pkl")
    with pytest.raises(InvalidStateError, match=r"'posix\.system'"):
        _SidecarUnpickler(io.BytesIO(pkl)).load()
    for module, name in [("builtins", "eval"), ("os", "system"), ("torch", "Tensor")]:
        with pytest.raises(InvalidStateError, match=rf"'{module}\.{name}'"):
            _SidecarUnpickler(io.BytesIO(b"")).find_class(module, name)
    with pytest.raises(InvalidStateError, match="persistent id"):
        _SidecarUnpickler(io.BytesIO(b"")).persistent_load(("storage", "x", "0", "cpu", 1))
    assert not PWNED.exists()


def test_admitted_globals_are_exactly_the_bytes_constructors() -> None:
    assert frozenset({"_codecs.encode", "__builtin__.bytes", "builtins.bytes"}) == ADMITTED_GLOBALS


def _pt(pkl: bytes, folder: str = "archive") -> bytes:
    return _zip_records(folder, pkl)


def _p2(body: bytes) -> bytes:
    return b"\x80\x02" + body + b"."


def _binunicode(text: str) -> bytes:
    raw = text.encode()
    return b"X" + len(raw).to_bytes(4, "little") + raw


@pytest.mark.parametrize(
    ("pkl", "message"),
    [
        (_p2(b"cbuiltins\neval\n" + _binunicode("1") + b"\x85R"), "'builtins.eval'"),
        (_p2(b"c__builtin__\nset\n)R"), "'__builtin__.set'"),
        (_p2(b"ctorch._utils\n_rebuild_tensor_v2\n)R"), "'torch._utils._rebuild_tensor_v2'"),
        (_p2(b"(X\x01\x00\x00\x00ttQ"), "persistent id"),
        (_p2(b"P0\n"), "persistent id"),
        (_p2(b"}b"), "opcode BUILD"),
        (_p2(b"c_codecs\nencode\n)\x81"), "opcode NEWOBJ"),
        (_p2(b"\x82\x01"), "opcode EXT1"),
        (_p2(b"\x8c\x01a"), "opcode SHORT_BINUNICODE"),
        (_p2(b"C\x01a"), "opcode SHORT_BINBYTES"),
        (b"\x80\x04\x95\x01\x00\x00\x00\x00\x00\x00\x00N.", "not a protocol-2 pickle"),
        (b"N.", "not a protocol-2 pickle"),
        (_p2(b"}") + b"junk", "after STOP"),
        (b"\x80\x02}", "truncated"),
        # bytes(10**12) would allocate a terabyte; _codecs.encode must be the exact bytes call.
        (_p2(b"c__builtin__\nbytes\nJ\x00\x10\xa5\xd4\x85R"), "bytes\\(\\) with arguments"),
        (
            _p2(b"c_codecs\nencode\n" + _binunicode("x") + _binunicode("utf-8") + b"\x86R"),
            "other than",
        ),
        (
            _p2(b"c_codecs\nencode\n" + _binunicode("\u2603") + _binunicode("latin1") + b"\x86R"),
            "not latin-1",
        ),
        # The C unpickler sizes its memo from the index: this would allocate 16 GB.
        (_p2(b"Nr\xff\xff\xff\x3f0}"), "memo slot"),
        (_p2(b"]"), "top-level object is list"),
        (_p2(b"}X\x01\x00\x00\x00kK\x01K\x02\x86s"), "type tuple"),
        (_p2(b"}G\x3f\xf8\x00\x00\x00\x00\x00\x00K\x01s"), "dict key of type float"),
        (_p2(b"}\x88K\x01s"), "dict key of type bool"),
        (_p2(b"}K\x01h\x00s"), "does not unpickle"),  # GET of an unset memo slot
        (_p2(b"}e"), "does not unpickle"),  # APPENDS without MARK
    ],
)
def test_hostile_or_foreign_pickles_are_refused(pkl: bytes, message: str) -> None:
    with pytest.raises(InvalidStateError, match=message):
        decode_torch_pt(_pt(pkl))


def test_refusal_carries_a_path() -> None:
    # {"a": [1, {"b": (1,)}]} -- a tuple two levels down
    pkl = _p2(b"}" + _binunicode("a") + b"]K\x01a}" + _binunicode("b") + b"K\x01\x85sas")
    with pytest.raises(InvalidStateError) as caught:
        decode_torch_pt(_pt(pkl))
    assert caught.value.path == "$.a[1].b"


def test_deep_nesting_is_refused_without_crashing() -> None:
    # 200,000 nested lists: fine for the iterative C unpickler, fatal for recursive consumers.
    pkl = _p2(b"}" + _binunicode("x") + b"]" * 200_000 + b"a" * 199_999 + b"s")
    with pytest.raises(InvalidStateError, match="nested deeper") as caught:
        decode_torch_pt(_pt(pkl))
    assert caught.value.path is not None and caught.value.path.startswith("$.x[0][0]")
    shallow = _p2(b"}" + _binunicode("x") + b"]" * 10 + b"a" * 9 + b"s")
    assert decode_torch_pt(_pt(shallow))["x"] == [[[[[[[[[[]]]]]]]]]]
    with pytest.raises(InvalidStateError, match="nested deeper"):
        decode_torch_pt(_pt(shallow), max_depth=5)


def test_self_referencing_structure_is_refused() -> None:
    # d = {}; d["self"] = d
    pkl = _p2(b"}q\x00" + _binunicode("self") + b"h\x00s")
    with pytest.raises(InvalidStateError, match="self-referencing"):
        decode_torch_pt(_pt(pkl))


def test_shared_subtree_bomb_is_refused_quickly() -> None:
    # Each level is a list holding the next level twice: 60 levels = 2**59 nodes in 400 B.
    # Built outermost first (memo slots 0..59), then each list is appended to its parent
    # twice: once by popping it, once by memo reference.
    body = b"".join(b"]q" + bytes((level,)) for level in range(60))
    body += b"".join(b"ah" + bytes((level,)) + b"a" for level in range(59, 0, -1))
    pkl = _p2(b"}" + _binunicode("bomb") + body + b"s")
    started = time.process_time()
    with pytest.raises(InvalidStateError, match="more nodes"):
        decode_torch_pt(_pt(pkl), max_depth=1000)
    assert time.process_time() - started < 1.0


def test_modest_sharing_is_accepted() -> None:
    # What torch writes when one dict object is referenced twice.
    shared = {"k": [1, 2, 3]}
    state = {"a": shared, "b": shared}
    raw = pickle.dumps(state, protocol=2)
    assert_identical(decode_torch_pt(_pt(raw)), {"a": {"k": [1, 2, 3]}, "b": {"k": [1, 2, 3]}})


def test_container_limits() -> None:
    good = (DATA / "sidecar_v3.pt").read_bytes()
    with pytest.raises(InvalidStateError, match="over the 1000-byte limit"):
        decode_torch_pt(good, max_file_bytes=1000)

    def archive(entries: list[tuple[str, bytes]], compression: int = zipfile.ZIP_STORED) -> bytes:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", compression=compression) as zf:
            for name, content in entries:
                zf.writestr(name, content)
        return buffer.getvalue()

    pkl = pickle.dumps({"a": 1}, protocol=2)
    base = [("archive/data.pkl", pkl), ("archive/version", b"3\n")]
    assert decode_torch_pt(archive(base)) == {"a": 1}
    cases = {
        "compressed": archive(base, zipfile.ZIP_DEFLATED),
        "no archive/data.pkl": archive([("archive/version", b"3\n"), ("other/data.pkl", pkl)]),
        "version": archive([("archive/data.pkl", pkl)]),
        "byteorder": archive([*base, ("archive/byteorder", b"middle")]),
        "tensor storage": archive([*base, ("archive/data/0", b"\x00" * 8)]),
        "members": archive([*base] + [(f"archive/x{i}", b"") for i in range(1100)]),
        "ZIP local-file header": b"\x80\x02}.",
    }
    for message, data in cases.items():
        with pytest.raises(InvalidStateError, match=message):
            decode_torch_pt(data)
    with pytest.raises(InvalidStateError, match="ZIP local-file header"):
        decode_torch_pt(archive([]))  # an empty zip is only an end-of-directory record
    with pytest.warns(UserWarning, match="Duplicate name"):
        duplicated = archive([*base, ("archive/data.pkl", pkl)])
    with pytest.raises(InvalidStateError, match="twice"):
        decode_torch_pt(duplicated)


def test_read_refuses_oversized_file_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "big.pt"
    with open(path, "wb") as handle:
        handle.truncate(64 * 1024 * 1024)  # sparse: no disk or memory spent
    with pytest.raises(InvalidStateError, match="over the"):
        read_torch_pt(path, max_file_bytes=1024 * 1024)
    with pytest.raises(FileNotFoundError):
        read_torch_pt(tmp_path / "missing.pt")


# ---------------------------------------------------------------------------------------------
# Detection
# ---------------------------------------------------------------------------------------------


def test_detection_is_by_content() -> None:
    ours = encode_torch_pt({"a": 1})
    assert looks_like_torch_zip(ours)
    assert looks_like_torch_zip(bytearray(ours))
    assert not looks_like_torch_zip(b"")
    assert not looks_like_torch_zip(b"\x81\xa1a\x01")  # msgpack {"a": 1}
    assert not looks_like_torch_zip(pickle.dumps({"a": 1}, protocol=2))  # legacy torch format
    assert not looks_like_torch_zip(ours[:100])
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("archive/other.txt", b"x")
        zf.writestr("elsewhere/data.pkl", b"x")
    assert not looks_like_torch_zip(buffer.getvalue())


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_detection_and_decoding_never_raise_on_junk(junk: bytes) -> None:
    for data in (junk, b"PK\x03\x04" + junk):
        assert isinstance(looks_like_torch_zip(data), bool)
        with pytest.raises(InvalidStateError):
            decode_torch_pt(data)


# ---------------------------------------------------------------------------------------------
# Writer
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(primitive_dicts)
def test_round_trip_without_torch(state: dict[Any, Any]) -> None:
    data = encode_torch_pt(state)
    assert looks_like_torch_zip(data)
    assert encode_torch_pt(state) == data  # deterministic
    assert_identical(decode_torch_pt(data), state)


def test_round_trip_nan_and_sidecar(tmp_path: Path) -> None:
    back = decode_torch_pt(encode_torch_pt({"nan": float("nan"), "s": sidecar_v3()}))
    assert math.isnan(back["nan"])
    assert_identical(back["s"], sidecar_v3())
    write_torch_pt(tmp_path / "rollout_recovery.pt", sidecar_v3())
    assert_identical(read_torch_pt(tmp_path / "rollout_recovery.pt"), sidecar_v3())
    assert os.listdir(tmp_path) == ["rollout_recovery.pt"]  # no temporary left behind


class _Color(enum.IntEnum):
    RED = 1


class _Text(str):
    pass


@pytest.mark.parametrize(
    ("state", "error", "path"),
    [
        ({"a": (1, 2)}, InvalidStateTypeError, "$.a"),
        ({"a": {1, 2}}, InvalidStateTypeError, "$.a"),
        ({"a": [0, _Color.RED]}, InvalidStateTypeError, "$.a[1]"),
        ({"a": {"b": _Text("x")}}, InvalidStateTypeError, "$.a.b"),
        ({"a": bytearray(b"x")}, InvalidStateTypeError, "$.a"),
        ({"a": {1.5: 1}}, InvalidStateTypeError, "$.a"),
        ({"a": {True: 1}}, InvalidStateTypeError, "$.a"),
        ({"odd key": {7: [object()]}}, InvalidStateTypeError, "$['odd key'][7][0]"),
        ({"a": [2**2100]}, InvalidStateError, "$.a[0]"),
    ],
)
def test_writer_refuses_non_primitives(state: dict[Any, Any], error: type, path: str) -> None:
    with pytest.raises(error) as caught:
        encode_torch_pt(state)
    assert caught.value.path == path  # type: ignore[attr-defined]


def test_writer_refuses_cycles_and_depth() -> None:
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    with pytest.raises(InvalidStateError, match="nested deeper"):
        encode_torch_pt(cyclic)
    deep: list[Any] = []
    node = deep
    for _ in range(DEFAULT_MAX_DEPTH):
        node.append([])
        node = node[0]
    with pytest.raises(InvalidStateError, match="nested deeper"):
        encode_torch_pt({"deep": deep})
    with pytest.raises(InvalidStateTypeError, match="top-level"):
        encode_torch_pt([1])  # type: ignore[arg-type]


def test_writer_output_has_torch_layout() -> None:
    data = encode_torch_pt({"a": b""})
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert names == [
        "archive/data.pkl",
        "archive/.format_version",
        "archive/.storage_alignment",
        "archive/byteorder",
        "archive/version",
        "archive/.data/serialization_id",
    ]
    pkl = zipfile.ZipFile(io.BytesIO(data)).read("archive/data.pkl")
    assert b"__builtin__" not in pkl  # b"" spelled with _codecs.encode, which torch admits
    assert zipfile.ZipFile(io.BytesIO(encode_torch_pt({}, archive_name="rr"))).namelist()[0] == (
        "rr/data.pkl"
    )


# ---------------------------------------------------------------------------------------------
# Interop with real torch (both directions)
# ---------------------------------------------------------------------------------------------


@pytest.mark.torch
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(primitive_dicts)
def test_torch_reads_our_output(state: dict[Any, Any]) -> None:
    torch = pytest.importorskip("torch")
    loaded = torch.load(io.BytesIO(encode_torch_pt(state)), weights_only=True)
    assert_identical(loaded, state)


@pytest.mark.torch
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(primitive_dicts)
def test_we_read_torch_output(state: dict[Any, Any]) -> None:
    torch = pytest.importorskip("torch")
    buffer = io.BytesIO()
    torch.save(state, buffer)
    assert_identical(decode_torch_pt(buffer.getvalue()), state)


@pytest.mark.torch
def test_torch_interop_on_the_sidecar_and_goldens(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    write_torch_pt(tmp_path / "rollout_recovery.pt", sidecar_v3())
    assert_identical(torch.load(tmp_path / "rollout_recovery.pt", weights_only=True), sidecar_v3())
    torch.save(sidecar_v3(), tmp_path / "theirs.pt")
    assert_identical(read_torch_pt(tmp_path / "theirs.pt"), sidecar_v3())
    for name, expected in golden_expectations().items():
        assert_identical(torch.load(DATA / name, weights_only=True), expected)
    # torch refuses the malicious golden too, so refusing it loses no interop.
    with pytest.raises(pickle.UnpicklingError):
        torch.load(DATA / "malicious_os_system.pt", weights_only=True)
    assert not PWNED.exists()


@pytest.mark.torch
def test_tensor_checkpoints_are_refused() -> None:
    torch = pytest.importorskip("torch")
    buffer = io.BytesIO()
    torch.save({"weights": torch.zeros(3)}, buffer)
    with pytest.raises(InvalidStateError, match="tensor storage"):
        decode_torch_pt(buffer.getvalue())


# ---------------------------------------------------------------------------------------------
# Mutation and truncation fuzz: an identical dict or InvalidStateError, nothing else
# ---------------------------------------------------------------------------------------------


def _decode_outcome(data: bytes, expected: dict[str, Any]) -> str:
    # CPU time, not wall time: other processes on a loaded machine do not count.
    started = time.process_time()
    try:
        result = decode_torch_pt(data)
    except InvalidStateError:
        outcome = "refused"
    else:
        assert_identical(result, expected)
        outcome = "identical"
    elapsed = time.process_time() - started
    assert elapsed < 1.0, f"decode took {elapsed:.2f}s"
    return outcome


def test_truncation_sweep() -> None:
    for name, expected in golden_expectations().items():
        data = (DATA / name).read_bytes()
        for cut in range(len(data)):
            assert _decode_outcome(data[:cut], expected) == "refused", (name, cut)


def test_archive_mutation_fuzz() -> None:
    rng = random.Random(20240601)
    data = (DATA / "sidecar_v3.pt").read_bytes()
    expected = sidecar_v3()
    outcomes = {"refused": 0, "identical": 0}
    for _ in range(2000):
        mutated = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            position = rng.randrange(len(mutated))
            mutated[position] = rng.choice([rng.randrange(256), mutated[position] ^ 0x80, 0, 255])
        outcomes[_decode_outcome(bytes(mutated), expected)] += 1
    # A mutation inside data.pkl trips its CRC-32; one in unread metadata is harmless.
    assert outcomes["refused"] > 1000 and outcomes["identical"] > 0


def test_pickle_mutation_fuzz() -> None:
    # Re-zipped with a valid CRC so every mutation reaches the scanner and the unpickler.
    rng = random.Random(7)
    expected = sidecar_v3()
    pkl = zipfile.ZipFile(DATA / "sidecar_v3.pt").read("sidecar_v3/data.pkl")
    outcomes = {"refused": 0, "identical": 0}
    for case in range(3000):
        mutated = bytearray(pkl)
        if case % 10 == 0:  # splice: duplicate or drop a run of bytes
            start = rng.randrange(len(mutated))
            stop = start + rng.randint(1, 32)
            if case % 20 == 0:
                mutated[start:start] = mutated[start:stop]
            else:
                del mutated[start:stop]
        else:
            for _ in range(rng.randint(1, 3)):
                position = rng.randrange(len(mutated))
                mutated[position] = rng.randrange(256)
        started = time.process_time()
        try:
            result = decode_torch_pt(_pt(bytes(mutated)))
        except InvalidStateError:
            outcomes["refused"] += 1
        else:
            # A mutation can change a value yet leave a valid pickle (a flipped character in
            # a string): the result must then still be a clean tree, which the reader proved.
            assert type(result) is dict
            outcomes["identical"] += result == expected
        assert time.process_time() - started < 1.0
    assert outcomes["refused"] > 100
    assert not PWNED.exists()

"""The native codec, atomic writes and the format-agnostic sidecar API."""

from __future__ import annotations

import datetime
import hashlib
import math
import os
from pathlib import Path
from typing import Any

import msgspec
import pytest
from sidecar_fixtures import fresh, rich_state

from rollout_recovery import InvalidStateError, InvalidStateTypeError, RolloutRecoveryError
from rollout_recovery._durable import atomic_write_bytes
from rollout_recovery.checkpoint import load_sidecar, write_sidecar
from rollout_recovery.checkpoint._native import (
    FORMAT_NAME,
    MAGIC,
    NativeEnvelope,
    decode_native,
    encode_native,
    read_native_envelope,
)
from rollout_recovery.checkpoint._sidecar_io import (
    NATIVE_SIDECAR_FILENAME,
    PT_SIDECAR_FILENAME,
    decode_sidecar,
    detect_sidecar_format,
    encode_sidecar,
    read_sidecar,
)
from rollout_recovery.errors import SidecarFormatError

STATE = rich_state()
FORMATS = ["native", "pt"]


def _envelope_bytes(**fields: Any) -> bytes:
    """A native file whose envelope fields are replaced (checksum recomputed unless given)."""
    envelope = read_native_envelope(encode_native(STATE))
    values = {f: getattr(envelope, f) for f in envelope.__struct_fields__}
    values.update(fields)
    if "payload" in fields and "checksum" not in fields:
        values["checksum"] = "sha256:" + hashlib.sha256(values["payload"]).hexdigest()
    return MAGIC + msgspec.msgpack.encode(values)


# ------------------------------------------------------------------------- native codec


def test_error_hierarchy() -> None:
    assert issubclass(SidecarFormatError, InvalidStateError)
    assert issubclass(SidecarFormatError, RolloutRecoveryError)
    assert issubclass(SidecarFormatError, ValueError)


def test_native_round_trip_is_exact_and_deterministic() -> None:
    data = encode_native(STATE)
    assert data.startswith(MAGIC)
    assert data == encode_native(fresh(STATE))
    assert decode_native(data) == STATE
    envelope = read_native_envelope(data)
    assert envelope.format == FORMAT_NAME and envelope.format_version == 1
    assert envelope.checksum == "sha256:" + hashlib.sha256(envelope.payload).hexdigest()


def test_absent_optional_keys_stay_absent() -> None:
    state = fresh(STATE)
    del state["batch_shortfall"], state["sampler_stamps_target_steps"]
    assert decode_native(encode_native(state)) == state


def test_checksum_mismatch_is_a_format_error() -> None:
    envelope = read_native_envelope(encode_native(STATE))
    with pytest.raises(SidecarFormatError, match="checksum") as caught:
        read_native_envelope(_envelope_bytes(payload=envelope.payload, checksum="sha256:00"))
    assert caught.value.path == "$.checksum"


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        ({"format": "something-else"}, "$.format"),
        ({"format_version": 2}, "$.format_version"),
        ({"extra": 1}, "$"),
        ({"format_version": "1"}, "$.format_version"),
    ],
)
def test_envelope_is_strict(fields: dict[str, Any], path: str) -> None:
    with pytest.raises(SidecarFormatError) as caught:
        decode_native(_envelope_bytes(**fields))
    assert caught.value.path == path


def test_payload_type_error_names_the_field_path() -> None:
    state = fresh(STATE)
    state["groups"][1]["siblings"][2]["attempts"][1]["status"] = 5
    payload = msgspec.msgpack.encode(state)
    with pytest.raises(InvalidStateError) as caught:
        decode_native(_envelope_bytes(payload=payload))
    assert not isinstance(caught.value, SidecarFormatError)
    assert caught.value.path == "$.groups[1].siblings[2].attempts[1].status"


def test_payload_unknown_field_is_refused() -> None:
    state = fresh(STATE)
    state["groups"][0]["siblings"][0]["attempts"][0]["surprise"] = 1
    with pytest.raises(InvalidStateError) as caught:
        decode_native(_envelope_bytes(payload=msgspec.msgpack.encode(state)))
    assert caught.value.path == "$.groups[0].siblings[0].attempts[0]"


def test_timestamps_and_extensions_in_free_form_data_are_refused() -> None:
    state = fresh(STATE)
    receipt = state["groups"][2]["siblings"][0]["attempts"][0]["receipt"]
    receipt["meta"]["when"] = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    with pytest.raises(InvalidStateError) as caught:
        decode_native(_envelope_bytes(payload=msgspec.msgpack.encode(state)))
    assert caught.value.path == "$.groups[2].siblings[0].attempts[0].receipt"
    receipt["meta"]["when"] = msgspec.msgpack.Ext(7, b"x")
    with pytest.raises(SidecarFormatError, match="extension type 7"):
        decode_native(_envelope_bytes(payload=msgspec.msgpack.encode(state)))


def test_missing_magic_and_empty_input() -> None:
    for data in (b"", MAGIC[:-1], b"PK\x03\x04", b"{}"):
        with pytest.raises(SidecarFormatError):
            decode_native(data)


def test_encoder_refuses_what_would_not_read_back() -> None:
    state = fresh(STATE)
    state["groups"][2]["siblings"][0]["attempts"][0]["receipt"]["meta"]["tokens"] = (1, 2)
    with pytest.raises(InvalidStateError, match="read back unchanged"):
        encode_native(state)
    state = fresh(STATE)
    state["groups"][2]["siblings"][0]["attempts"][0]["receipt"]["meta"]["big"] = 2**70
    with pytest.raises(InvalidStateError, match="cannot encode"):
        encode_native(state)
    state = fresh(STATE)
    state["groups"][2]["siblings"][0]["attempts"][0]["receipt"]["meta"]["obj"] = object()
    with pytest.raises(InvalidStateTypeError):
        encode_native(state)
    with pytest.raises(InvalidStateTypeError):
        encode_native([])  # type: ignore[arg-type]


def test_nan_metric_round_trips() -> None:
    state = fresh(STATE)
    state["finalizer_metrics_by_group"]["done-1"]["len"] = math.nan
    decoded = decode_native(encode_native(state))
    assert math.isnan(decoded["finalizer_metrics_by_group"]["done-1"]["len"])


# ------------------------------------------------------------------------ atomic writes


def test_atomic_write_failure_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "sidecar"
    target.write_bytes(b"old")

    def crash(*args: Any) -> None:
        raise OSError("simulated crash before the rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated"):
        atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sidecar"]


def test_atomic_write_replaces(tmp_path: Path) -> None:
    target = tmp_path / "sidecar"
    atomic_write_bytes(target, b"one")
    atomic_write_bytes(target, b"two")
    assert target.read_bytes() == b"two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sidecar"]


# ------------------------------------------------------------------ format-agnostic API


@pytest.mark.parametrize("format", FORMATS)
def test_write_then_load_either_format(tmp_path: Path, format: Any) -> None:
    path = tmp_path / "side"
    write_sidecar(path, STATE, format=format)
    loaded = load_sidecar(path)
    assert loaded.format == format
    assert loaded.state == STATE
    assert read_sidecar(path) == STATE
    assert loaded.parsed.batch_shortfall == {0: 1, 5: 2}
    assert [g["group_id"] for g in loaded.parsed.ledger_state["groups"]] == [
        g.group_id for g in loaded.ledger.groups()
    ]
    assert (loaded.writer_version is None) == (format == "pt")


@pytest.mark.parametrize("format", FORMATS)
def test_format_comes_from_content_not_name(tmp_path: Path, format: Any) -> None:
    # Each format under the *other* format's conventional name.
    name = PT_SIDECAR_FILENAME if format == "native" else NATIVE_SIDECAR_FILENAME
    write_sidecar(tmp_path / name, STATE, format=format)
    assert load_sidecar(tmp_path / name).format == format
    assert load_sidecar(tmp_path).format == format  # a checkpoint directory


def test_directory_lookup_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_sidecar(tmp_path)
    write_sidecar(tmp_path / NATIVE_SIDECAR_FILENAME, STATE)
    write_sidecar(tmp_path / PT_SIDECAR_FILENAME, STATE, format="pt")
    with pytest.raises(SidecarFormatError, match="several"):
        load_sidecar(tmp_path)


def test_unknown_content_is_a_format_error() -> None:
    assert detect_sidecar_format(b"hello") is None
    with pytest.raises(SidecarFormatError, match="neither"):
        decode_sidecar(b"hello")


def test_pt_container_errors_become_format_errors() -> None:
    data = bytearray(encode_sidecar(STATE, format="pt"))
    data[60] ^= 0xFF
    with pytest.raises(InvalidStateError):
        decode_sidecar(bytes(data))


@pytest.mark.parametrize("format", FORMATS)
def test_invalid_state_is_never_written(tmp_path: Path, format: Any) -> None:
    state = fresh(STATE)
    state["groups"][1]["siblings"][0]["attempts"][0]["staging_keys"] = ["other"]
    with pytest.raises(InvalidStateError) as caught:
        write_sidecar(tmp_path / "side", state, format=format)
    assert caught.value.path == "$.groups[1].siblings[0].attempts[0].staging_keys"
    assert not (tmp_path / "side").exists()


def test_unknown_format_name() -> None:
    with pytest.raises(ValueError, match="unknown sidecar format"):
        encode_sidecar(STATE, format="json")  # type: ignore[arg-type]


def test_load_is_all_or_nothing(tmp_path: Path) -> None:
    state = fresh(STATE)
    state["groups"][3]["status"] = "ready_to_finalize"  # its siblings are not sealed
    path = tmp_path / "side"
    path.write_bytes(encode_sidecar(state, validate=False))
    with pytest.raises(InvalidStateError) as caught:
        load_sidecar(path)
    assert caught.value.path == "$.groups[3].status"


def test_envelope_struct_is_public_metadata() -> None:
    envelope = read_native_envelope(encode_native(STATE))
    assert isinstance(envelope, NativeEnvelope)


# --- paths that are not regular files are refused before they are opened for reading


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_refused_instead_of_blocking_the_reader(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    from rollout_recovery.checkpoint._torch_pt import read_torch_pt
    from rollout_recovery.errors import NotARegularFileError

    fifo = tmp_path / "rollout_recovery.sidecar"
    os.mkfifo(fifo)

    def _hung(signum: int, frame: object) -> None:
        raise AssertionError("reading a FIFO blocked")

    previous = signal.signal(signal.SIGALRM, _hung)
    signal.alarm(10)
    try:
        for read in (load_sidecar, read_torch_pt):
            with pytest.raises(NotARegularFileError, match="a FIFO") as caught:
                read(fifo)
            assert isinstance(caught.value, OSError)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    result = subprocess.run(
        [sys.executable, "-m", "rollout_recovery", "validate", str(fifo)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "not a regular file (a FIFO)" in result.stderr


def test_a_character_device_is_refused(tmp_path: Path) -> None:
    from rollout_recovery.errors import NotARegularFileError

    if not os.path.exists("/dev/zero"):
        pytest.skip("needs /dev/zero")
    with pytest.raises(NotARegularFileError, match="character device"):
        load_sidecar("/dev/zero")


@pytest.mark.parametrize("format", FORMATS)
def test_a_loaded_sidecar_summarizes_what_inspect_shows(tmp_path: Path, format: str) -> None:
    path = tmp_path / f"sidecar.{format}"
    write_sidecar(path, STATE, format=format)
    summary = load_sidecar(path).summary()
    groups = STATE["groups"]
    siblings = [sibling for group in groups for sibling in group["siblings"]]
    assert summary["path"] == str(path)
    assert summary["format"] == format
    assert summary["size_bytes"] == path.stat().st_size
    assert (summary["format_version"] is None) == (format == "pt")
    assert summary["groups"]["total"] == len(groups)
    assert summary["siblings"]["total"] == len(siblings)
    assert summary["siblings"]["attempts_total"] == sum(len(s["attempts"]) for s in siblings)

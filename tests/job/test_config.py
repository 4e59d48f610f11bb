"""The job configuration: defaults, TOML round trip, refusals with exact paths, comparison."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_recovery._settings import (
    _toml_string,
    config_to_builtins,
    config_to_toml,
    operational_paths,
)
from rollout_recovery._settings import identity_fingerprint as config_fingerprint
from rollout_recovery.control import BACKENDS
from rollout_recovery.control._config import (
    JobConfig,
    RunConfig,
    config_differences,
    config_from_builtins,
    load_config,
)
from rollout_recovery.errors import ConfigError
from rollout_recovery.policy import PolicyConfig
from rollout_recovery.rollout import FaultsConfig

# --------------------------------------------------------------------------------------
# Helpers derived from the Structs themselves, so a new field is covered automatically.

Leaf = tuple[str, str, mi.Type]  # (section, field, msgspec type info)


def _leaves() -> Iterator[Leaf]:
    run = mi.type_info(RunConfig)
    assert isinstance(run, mi.StructType)
    for section in run.fields:
        section_type = section.type
        while isinstance(section_type, mi.Metadata):  # a section marked operational
            section_type = section_type.type
        assert isinstance(section_type, mi.StructType)
        for field in section_type.fields:
            kind = field.type
            # A field marked operational carries its bounds inside a Metadata wrapper.
            while isinstance(kind, mi.Metadata):
                kind = kind.type
            yield section.name, field.name, kind


LEAVES = list(_leaves())


def _value_strategy(kind: mi.Type) -> st.SearchStrategy[object]:
    if isinstance(kind, mi.BoolType):
        return st.booleans()
    if isinstance(kind, mi.IntType):
        low = int(kind.ge) if kind.ge is not None else -(2**63)
        high = int(kind.le) if kind.le is not None else 2**63 - 1
        return st.integers(min_value=low, max_value=high)
    if isinstance(kind, mi.FloatType):
        bottom = kind.gt if kind.gt is not None else kind.ge
        top = kind.lt if kind.lt is not None else kind.le
        return st.floats(
            min_value=None if bottom is None else float(bottom),
            max_value=None if top is None else float(top),
            exclude_min=kind.gt is not None,
            exclude_max=kind.lt is not None,
            allow_nan=False,
            allow_infinity=False,
        )
    if isinstance(kind, mi.LiteralType):
        return st.sampled_from(kind.values)
    if isinstance(kind, mi.EnumType):
        return st.sampled_from([member.value for member in kind.cls])
    if isinstance(kind, mi.StrType):
        if kind.pattern is not None and kind.pattern.startswith("^https?"):  # a server url
            return st.from_regex(r"\Ahttp://127\.0\.0\.1:[1-9][0-9]{0,4}\Z")
        if kind.pattern is not None:  # an environment variable's name, or ""
            return st.from_regex(kind.pattern, fullmatch=True)
        return st.text(min_size=max(1, kind.min_length or 0), max_size=20)
    if isinstance(kind, mi.VarTupleType):
        # Unique: a list of sinks names each at most once (the rule is the config's own).
        return st.lists(_value_strategy(kind.item_type), max_size=3, unique=True).map(tuple)
    raise AssertionError(f"no strategy for {kind!r}")


#: Fields a generation backend constrains together (``check_combination``): the trainer
#: and the task a backend serves, and the reward function only the dataset task takes.
COMBINED = {
    ("generation", "backend"),
    ("trainer", "kind"),
    ("task", "kind"),
    ("reward", "function"),
}


@st.composite
def valid_configs(draw: st.DrawFn) -> RunConfig:
    data: dict[str, dict[str, object]] = {}
    for section, field, kind in LEAVES:
        data.setdefault(section, {})[field] = draw(_value_strategy(kind))
    # A backend's name is a str the run config checks against its table of backends.
    data["generation"]["backend"] = draw(st.sampled_from(list(BACKENDS)))
    _hold_the_vllm_rules(data)
    # The trainer and task the drawn backend serves: on HTTP servers, the torch trainer
    # with the vLLM weight sync and the numpy one with the others.
    backend = data["generation"]["backend"]
    llm = backend == "transformers" or (backend == "http" and data["http"]["weight_sync"] == "vllm")
    data["trainer"]["kind"] = "torch" if llm else "numpy"
    data["task"]["kind"] = "emit_token" if llm else "digits"
    if backend == "transformers":
        data["task"]["kind"] = draw(st.sampled_from(["emit_token", "dataset"]))
    # [reward] function belongs to the dataset task, which needs one.
    data["reward"]["function"] = "reward.py:score" if data["task"]["kind"] == "dataset" else ""
    _hold_the_interrupt_rules(data)
    return config_from_builtins(data)


def _hold_the_interrupt_rules(data: dict[str, dict[str, object]]) -> None:
    """``on_weight_update = "interrupt"`` only where ``check_weight_update_mode`` allows it
    (``test_interrupt_job.py`` tests the refusals)."""
    generation, http = data["generation"], data["http"]
    if generation["on_weight_update"] != "interrupt":
        return
    if generation["backend"] not in ("simulated", "http"):
        generation["on_weight_update"] = "continue"
    elif generation["backend"] == "http":
        http["dialect"] = "vllm-generate"
        if http["weight_sync"] not in ("policy", "vllm"):
            http["weight_sync"] = "policy"


def _hold_the_vllm_rules(data: dict[str, dict[str, object]]) -> None:
    """Make drawn ``[vllm]`` and ``[http]`` values agree where they meet (``[vllm] launch``
    with no listed servers and the vLLM weight sync, that sync with some servers), as
    ``check_vllm_config`` requires; ``test_vllm_fleet.py`` tests the refusals."""
    http, vllm = data["http"], data["vllm"]
    uses_http = data["generation"]["backend"] == "http" or (
        data["generation"]["backend"] == "ray" and data["ray"]["worker"] == "http"
    )
    if not uses_http:
        return
    if data["generation"]["backend"] == "ray":
        # Ray's workers push the numpy policy to the servers: no vLLM sync, no launch.
        if http["weight_sync"] == "vllm":
            http["weight_sync"] = "none"
        vllm["launch"] = 0
        return
    if vllm["launch"]:
        http["servers"], http["weight_sync"] = (), "vllm"
        vllm["python"] = vllm["python"] or "python"
        vllm["model"] = vllm["model"] or "model"
    elif http["weight_sync"] == "vllm" and not http["servers"]:
        http["servers"] = ("http://127.0.0.1:8000",)


def _out_of_range(kind: mi.Type) -> object | None:
    """A value just outside the field's bounds, or None when it has no bound to break."""
    if isinstance(kind, mi.IntType) and kind.ge is not None:
        return kind.ge - 1
    if isinstance(kind, mi.FloatType):
        if kind.gt is not None:
            return float(kind.gt)
        if kind.ge is not None:
            return float(kind.ge) - 0.5
    return None


def _another_valid(kind: mi.Type, value: object) -> object | None:
    """A different valid value for the field, or None when there is none."""
    if isinstance(kind, mi.BoolType):
        assert isinstance(value, bool)
        return not value
    if isinstance(kind, mi.IntType):
        assert isinstance(value, int)
        return value + 1
    if isinstance(kind, mi.FloatType):
        assert isinstance(value, float)
        top = kind.le if kind.le is not None else kind.lt
        if top is not None:
            high = float(top)
            return (value + high) / 2 if value < high else value / 2
        return value * 2 + 1.0
    if isinstance(kind, mi.LiteralType):
        others = [v for v in kind.values if v != value]
        return others[0] if others else None
    if isinstance(kind, mi.EnumType):
        members = [m for m in kind.cls if m != value]
        return members[0] if members else None
    if isinstance(kind, mi.StrType):
        assert isinstance(value, str)
        if kind.pattern is not None and not re.fullmatch(kind.pattern, value + "x"):
            # A pattern-bound string (a digest): another value it accepts, if one is known.
            return "0" * 64 if re.fullmatch(kind.pattern, "0" * 64) and value != "0" * 64 else None
        return value + "x"
    if isinstance(kind, mi.VarTupleType):
        assert isinstance(value, tuple)
        item = kind.item_type
        if isinstance(item, mi.LiteralType):  # a tuple of choices: one more distinct choice
            others = [v for v in item.values if v not in value]
            return (*value, others[0]) if others else None
        return (*value, "http://127.0.0.1:9")
    raise AssertionError(kind)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _load_error(tmp_path: Path, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load_config(_write(tmp_path, text))
    return caught.value


# --------------------------------------------------------------------------------------
# Defaults and the round trip


def test_no_file_gives_the_documented_defaults() -> None:
    config = load_config(None)
    assert config == RunConfig()
    assert config.job.steps == 100
    assert config.job.prompts_per_step == 8
    assert config.job.min_step_fraction == 0.5
    assert config.task.prompt_group_every == 4
    assert config.generation.backend == "simulated"
    assert config.faults.hang_rate == 0.01
    assert config.faults.worker_crash_rate == 0.002
    assert config.checkpoint.format == "native"
    assert config.liveness.step_timeout_s == 120.0


def test_an_empty_file_and_a_partial_file_default_the_rest(tmp_path: Path) -> None:
    assert load_config(_write(tmp_path, "")) == RunConfig()
    config = load_config(_write(tmp_path, "[faults]\nhang_rate = 0.25\n"))
    assert config.faults == FaultsConfig(hang_rate=0.25)
    assert config.job == JobConfig()


def test_the_default_config_round_trips_and_every_field_is_written() -> None:
    text = config_to_toml(RunConfig())
    parsed = tomllib.loads(text)
    assert sorted(parsed) == sorted(RunConfig.__struct_fields__)
    assert sum(len(section) for section in parsed.values()) == len(LEAVES)
    assert config_from_builtins(parsed) == RunConfig()


@settings(max_examples=150, deadline=None)
@given(valid_configs())
def test_any_valid_config_round_trips_through_toml(config: RunConfig) -> None:
    text = config_to_toml(config)
    back = config_from_builtins(tomllib.loads(text))
    assert back == config
    assert config_differences(back, config) == []
    assert config_fingerprint(back) == config_fingerprint(config)
    # Floats stay floats (a float written as "3" would read back as an int).
    for section, field, kind in LEAVES:
        if isinstance(kind, mi.FloatType):
            assert type(getattr(getattr(back, section), field)) is float


def test_load_config_reads_what_config_to_toml_wrote(tmp_path: Path) -> None:
    config = RunConfig(
        job=JobConfig(steps=7, seed=3, min_step_fraction=1.0),
        checkpoint=msgspec.structs.replace(RunConfig().checkpoint, format="pt"),
        faults=FaultsConfig(hang_rate=1e-05, straggler_factor=1e16),
    )
    assert load_config(_write(tmp_path, config_to_toml(config))) == config


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_toml_strings_are_escaped_to_read_back_exactly(value: str) -> None:
    assert tomllib.loads(f"v = {_toml_string(value)}")["v"] == value


def test_an_int_is_accepted_for_a_float_field_and_read_as_a_float(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, "[policy]\nlearning_rate = 1\n"))
    assert config.policy.learning_rate == 1.0
    assert type(config.policy.learning_rate) is float


def test_configs_are_frozen() -> None:
    config = RunConfig()
    with pytest.raises(AttributeError):
        config.job = JobConfig(steps=2)  # type: ignore[misc]
    with pytest.raises(AttributeError):
        config.job.steps = 2  # type: ignore[misc]


# --------------------------------------------------------------------------------------
# Refusals


def test_an_unknown_key_names_its_section(tmp_path: Path) -> None:
    error = _load_error(tmp_path, "[faults]\nhang_rat = 0.1\n")
    assert error.path == "$.faults"
    assert str(error) == "$.faults: Object contains unknown field `hang_rat`"


def test_an_unknown_section_names_the_root(tmp_path: Path) -> None:
    error = _load_error(tmp_path, "[falts]\nhang_rate = 0.1\n")
    assert error.path == "$"
    assert str(error) == "$: Object contains unknown field `falts`"


def test_a_wrong_type_names_the_field(tmp_path: Path) -> None:
    error = _load_error(tmp_path, '[faults]\nhang_rate = "often"\n')
    assert error.path == "$.faults.hang_rate"
    assert str(error) == "$.faults.hang_rate: Expected `float`, got `str`"


def test_a_bool_is_not_an_int(tmp_path: Path) -> None:
    error = _load_error(tmp_path, "[job]\nsteps = true\n")
    assert str(error) == "$.job.steps: Expected `int`, got `bool`"


def test_a_section_that_is_not_a_table_names_the_section(tmp_path: Path) -> None:
    error = _load_error(tmp_path, "job = 3\n")
    assert str(error) == "$.job: Expected `object`, got `int`"


def test_an_out_of_range_value_names_the_field(tmp_path: Path) -> None:
    error = _load_error(tmp_path, "[faults]\nhang_rate = -0.1\n")
    assert error.path == "$.faults.hang_rate"
    assert str(error) == "$.faults.hang_rate: Expected `float` >= 0.0"
    error = _load_error(tmp_path, "[faults]\nhang_rate = 1.5\n")
    assert str(error) == "$.faults.hang_rate: Expected `float` <= 1.0"
    error = _load_error(tmp_path, "[job]\nmin_step_fraction = 0.0\n")
    assert str(error) == "$.job.min_step_fraction: Expected `float` > 0.0"


@pytest.mark.parametrize(
    ("section", "field", "kind"),
    [leaf for leaf in LEAVES if _out_of_range(leaf[2]) is not None],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_every_bounded_field_refuses_a_value_past_its_bound(
    tmp_path: Path, section: str, field: str, kind: mi.Type
) -> None:
    value = _out_of_range(kind)
    error = _load_error(tmp_path, f"[{section}]\n{field} = {value!r}\n")
    assert error.path == f"$.{section}.{field}"


def test_an_unknown_literal_names_the_field(tmp_path: Path) -> None:
    error = _load_error(tmp_path, '[checkpoint]\nformat = "zip"\n')
    assert str(error) == (
        "$.checkpoint.format: Invalid enum value 'zip'; expected one of 'native', 'pt'"
    )
    error = _load_error(tmp_path, '[generation]\nbackend = "vllm"\n')
    assert error.path == "$.generation.backend"


SECRET = "s3cret-t0ken"


@pytest.mark.parametrize(
    "url",
    [
        f"http://user:{SECRET}@127.0.0.1:8000",
        f"http://{SECRET}@127.0.0.1:8000",
        f"https://user:{SECRET}@example.com/v1",
        f"http://127.0.0.1:8000/?api_key={SECRET}",
        f"http://127.0.0.1:8000/#{SECRET}",
    ],
    ids=["user-password", "user", "https", "query", "fragment"],
)
def test_a_server_url_with_a_secret_is_refused_without_quoting_it(tmp_path: Path, url: str) -> None:
    text = f'[http]\nservers = ["http://127.0.0.1:9", "{url}"]\n'
    error = _load_error(tmp_path, text)
    assert error.path == "$.http.servers[1]"
    assert "api_key_env" in str(error)  # what to do instead
    assert SECRET not in str(error) and SECRET not in repr(error)
    assert error.__cause__ is None or SECRET not in str(error.__cause__)


def test_server_urls_without_secrets_and_an_api_key_env_are_taken(tmp_path: Path) -> None:
    text = (
        '[http]\nservers = ["http://127.0.0.1:9", "https://gpu-3.internal:8000/base"]\n'
        'api_key_env = "RR_SERVER_KEY"\n'
    )
    config = load_config(_write(tmp_path, text))
    assert config.http.api_key_env == "RR_SERVER_KEY"
    assert load_config(None).http.api_key_env == ""


@pytest.mark.parametrize("name", ["1ABC", "A-B", "A B", "$KEY", "KEY=x"])
def test_an_api_key_env_that_is_no_variable_name_is_refused(tmp_path: Path, name: str) -> None:
    error = _load_error(tmp_path, f'[http]\napi_key_env = "{name}"\n')
    assert error.path == "$.http.api_key_env"


@pytest.mark.parametrize("literal", ["inf", "+inf", "nan"])
def test_non_finite_floats_are_refused(tmp_path: Path, literal: str) -> None:
    error = _load_error(tmp_path, f"[generation]\ncall_latency_s = {literal}\n")
    assert error.path == "$.generation.call_latency_s"


def test_a_toml_syntax_error_names_the_file_and_the_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "[job]\nsteps = 3\nseed = = 1\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(path) in str(caught.value)
    assert "invalid TOML" in str(caught.value)
    assert "line 3" in str(caught.value)


def test_a_missing_or_unreadable_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as caught:
        load_config(missing)
    assert str(missing) in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path)  # a directory
    assert str(tmp_path) in str(caught.value)


def test_a_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_bytes(b'[generation]\nbackend = "\xff"\n')
    with pytest.raises(ConfigError, match="not UTF-8") as caught:
        load_config(path)
    assert str(path) in str(caught.value)


def test_config_from_builtins_refuses_bad_data_with_its_path() -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_builtins({"job": {"steps": 0}})
    assert caught.value.path == "$.job.steps"
    with pytest.raises(ConfigError) as caught:
        config_from_builtins([1, 2])
    assert caught.value.path == "$"


# --------------------------------------------------------------------------------------
# --seed


def test_seed_overrides_the_file_and_keeps_the_rest(tmp_path: Path) -> None:
    path = _write(tmp_path, "[job]\nseed = 3\nsteps = 9\n")
    assert load_config(path).job.seed == 3
    config = load_config(path, seed=11)
    assert config.job.seed == 11
    assert config.job.steps == 9
    assert load_config(None, seed=5).job == JobConfig(seed=5)


def test_a_negative_seed_override_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, seed=-1)
    assert str(caught.value) == "$.job.seed: Expected `int` >= 0"


def test_a_seed_override_does_not_hide_a_bad_job_section(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(_write(tmp_path, "job = 3\n"), seed=1)
    assert caught.value.path == "$.job"


# --------------------------------------------------------------------------------------
# Comparison, fingerprint, builtins


def test_differences_list_each_changed_field_in_order() -> None:
    base = RunConfig()
    other = RunConfig(
        job=JobConfig(seed=1),
        faults=FaultsConfig(hang_rate=0.02),
        checkpoint=msgspec.structs.replace(base.checkpoint, format="pt"),
    )
    assert config_differences(base, base) == []
    assert config_differences(base, other) == [
        "$.job.seed: 0 != 1",
        "$.faults.hang_rate: 0.01 != 0.02",
        "$.checkpoint.format: 'native' != 'pt'",
    ]
    assert config_differences(other, base)[0] == "$.job.seed: 1 != 0"


def test_fingerprint_is_hex_sha256_and_ignores_int_versus_float() -> None:
    fingerprint = config_fingerprint(RunConfig())
    assert len(fingerprint) == 64
    int(fingerprint, 16)
    assert config_fingerprint(RunConfig()) == fingerprint
    with_int = RunConfig(policy=PolicyConfig(learning_rate=1))
    with_float = RunConfig(policy=PolicyConfig(learning_rate=1.0))
    assert config_fingerprint(with_int) == config_fingerprint(with_float)


def test_fingerprint_is_stable_across_processes() -> None:
    code = (
        "from rollout_recovery.control import RunConfig;"
        "from rollout_recovery._settings import identity_fingerprint;"
        "print(identity_fingerprint(RunConfig()))"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            check=True,
            capture_output=True,
            text=True,
            env={"PYTHONHASHSEED": hash_seed},
        ).stdout.strip()
        for hash_seed in ("1", "2")
    }
    assert outputs == {config_fingerprint(RunConfig())}


@pytest.mark.parametrize(
    ("section", "field", "kind"),
    [
        leaf
        for leaf in LEAVES
        if _another_valid(leaf[2], getattr(getattr(RunConfig(), leaf[0]), leaf[1])) is not None
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_fingerprint_and_differences_see_every_field(
    section: str, field: str, kind: mi.Type
) -> None:
    base = RunConfig()
    old = getattr(getattr(base, section), field)
    new = _another_valid(kind, old)
    changed_section = msgspec.structs.replace(getattr(base, section), **{field: new})
    changed = msgspec.structs.replace(base, **{section: changed_section})
    if (section, field) not in COMBINED:  # alone, those break the backend's combination
        config_from_builtins(config_to_builtins(changed))  # still valid
    difference = [f"$.{section}.{field}: {old!r} != {new!r}"]
    assert config_differences(base, changed) == difference
    if f"$.{section}.{field}" in operational_paths(RunConfig):
        # An operational field may change on resume: the job's identity stays the same.
        assert config_fingerprint(changed) == config_fingerprint(base)
        assert config_differences(base, changed, which="operational") == difference
        assert config_differences(base, changed, which="identity") == []
    else:
        assert config_fingerprint(changed) != config_fingerprint(base)
        assert config_differences(base, changed, which="identity") == difference
        assert config_differences(base, changed, which="operational") == []


def test_builtins_round_trip_as_plain_data() -> None:
    config = RunConfig(job=JobConfig(seed=9), faults=FaultsConfig(tamper_rate=0.5))
    data = config_to_builtins(config)
    assert data["job"]["seed"] == 9
    assert data["faults"]["tamper_rate"] == 0.5
    # Plain enough for a checkpoint: MessagePack round trips it unchanged.
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(data)) == data
    assert config_from_builtins(data) == config


# --------------------------------------------------------------------------------------
# The LLM sections: [trainer], [model], [task] kind, [generation] backend = "transformers"


LLM_JOB = {
    "generation": {"backend": "transformers"},
    "trainer": {"kind": "torch"},
    "task": {"kind": "emit_token"},
}

#: The LLM job on vLLM servers: the HTTP backend, the vLLM weight sync, listed servers.
LLM_ON_HTTP = {
    "generation": {"backend": "http"},
    "trainer": {"kind": "torch"},
    "task": {"kind": "emit_token"},
    "http": {"weight_sync": "vllm", "servers": ["http://127.0.0.1:8000"]},
}


@pytest.mark.parametrize(
    ("sections", "path", "message"),
    [
        (
            {"generation": {"backend": "transformers"}},
            "$.trainer.kind",
            "generation backend 'transformers' needs [trainer] kind = 'torch'",
        ),
        (
            {"generation": {"backend": "transformers"}, "trainer": {"kind": "torch"}},
            "$.task.kind",
            "needs [task] kind = 'emit_token' or 'dataset'; task kind 'digits' works with "
            "[generation] backend = 'simulated' or 'ray' or 'http'",
        ),
        (
            {"trainer": {"kind": "torch"}},
            "$.trainer.kind",
            "trainer kind 'torch' works with [generation] backend = 'http' or 'transformers'",
        ),
        (
            {"task": {"kind": "emit_token"}, "generation": {"backend": "http"}},
            "$.task.kind",
            "generation backend 'http' with trainer kind 'numpy' needs [task] kind = 'digits'",
        ),
        (
            {**LLM_ON_HTTP, "task": {"kind": "digits"}},
            "$.task.kind",
            "generation backend 'http' with trainer kind 'torch' needs [task] kind = 'emit_token'",
        ),
        (
            {**LLM_JOB, "generation": {"backend": "ray"}},
            "$.trainer.kind",
            "generation backend 'ray' needs [trainer] kind = 'numpy'",
        ),
    ],
)
def test_a_backend_refuses_a_trainer_or_task_it_cannot_serve(
    sections: dict[str, dict[str, object]], path: str, message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        config_from_builtins(sections)
    assert refused.value.path == path
    assert message in str(refused.value)


@pytest.mark.parametrize("sync", ["policy", "version-tag", "none"])
def test_the_torch_trainer_on_http_servers_needs_the_vllm_weight_sync(sync: str) -> None:
    """Any other sync would leave the servers sampling the initial weights while the
    trainer moves on: refused, naming the field and the value to set."""
    with pytest.raises(ConfigError) as refused:
        config_from_builtins({**LLM_ON_HTTP, "http": {"weight_sync": sync}})
    assert refused.value.path == "$.http.weight_sync"
    assert 'weight_sync = "vllm"' in str(refused.value)
    assert f"not {sync!r}" in str(refused.value)


def test_the_numpy_trainer_on_http_servers_cannot_use_the_vllm_weight_sync() -> None:
    with pytest.raises(ConfigError) as refused:
        config_from_builtins({**LLM_ON_HTTP, "trainer": {"kind": "numpy"}, "task": {}})
    assert refused.value.path == "$.http.weight_sync"
    assert "'policy' or 'version-tag' or 'none', not 'vllm'" in str(refused.value)


def test_the_weight_sync_is_not_checked_without_http_servers() -> None:
    """``[http]`` is ignored by a job that generates without HTTP servers."""
    for backend in ("simulated", "ray"):
        config_from_builtins({"generation": {"backend": backend}, "http": {"weight_sync": "none"}})
    config_from_builtins({**LLM_JOB, "http": {"weight_sync": "policy"}})


def test_the_llm_job_on_vllm_servers_is_a_valid_combination() -> None:
    config = config_from_builtins(LLM_ON_HTTP)
    assert (config.generation.backend, config.http.weight_sync) == ("http", "vllm")
    # Launched servers: an empty [vllm] model is the torch trainer's own.
    launched = config_from_builtins(
        {**LLM_ON_HTTP, "http": {"weight_sync": "vllm"}, "vllm": {"launch": 2, "python": "p"}}
    )
    assert (launched.vllm.launch, launched.vllm.model) == (2, "")


def test_the_llm_job_is_a_valid_combination() -> None:
    config = config_from_builtins(LLM_JOB)
    assert (config.trainer.kind, config.task.kind) == ("torch", "emit_token")
    assert config.model.source == "tiny-llama" and config.model.digest == ""


def test_the_model_is_identified_by_its_digest_not_its_place() -> None:
    """Where the model is and how the batch is cut may change on resume; what is trained
    (the model files' digest, the update rule, the task) may not."""
    operational = operational_paths(RunConfig)
    assert {
        "$.model.source",
        "$.model.cache_dir",
        "$.trainer.micro_batch",
        "$.trainer.threads",
    } <= operational
    assert (
        not {
            "$.model.digest",
            "$.trainer.kind",
            "$.trainer.learning_rate",
            "$.trainer.epochs",
            "$.task.kind",
            "$.task.target_token",
            "$.task.max_tokens",
        }
        & operational
    )


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ('[model]\ndigest = "abc"\n', "$.model.digest"),
        ('[model]\ndigest = "' + "A" * 64 + '"\n', "$.model.digest"),
        ('[model]\nsource = ""\n', "$.model.source"),
        ('[trainer]\ndtype = "bfloat16"\n', "$.trainer.dtype"),
        ("[trainer]\nclip_epsilon = 1.0\n", "$.trainer.clip_epsilon"),
        ("[trainer]\nepochs = 0\n", "$.trainer.epochs"),
        ("[task]\nmax_tokens = 0\n", "$.task.max_tokens"),
    ],
)
def test_llm_fields_refuse_bad_values_naming_them(tmp_path: Path, text: str, path: str) -> None:
    assert _load_error(tmp_path, text).path == path

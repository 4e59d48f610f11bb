"""The default job with ``[generation] on_weight_update = "interrupt"``: calls in flight
at a weight update finish under the new weights; the run finishes, its audit passes, and
every trained row says which version generated each of its tokens."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollout_recovery.control._config import config_differences, config_from_builtins
from rollout_recovery.errors import ConfigError
from rollout_recovery.history import audit_run
from rollout_recovery.job import run_job

TrainedRows = Callable[[Path], list[dict[str, Any]]]


Span = tuple[int, int, int]


def _calls(spans: list[Span]) -> list[list[Span]]:
    """A row's spans, one list per model call. The digit task's every call after the
    first appends a token of its own to the prompt (``[THINK]`` or ``[ANSWER]``), carried
    in no span: so spans that touch are one call's, and a gap starts the next call."""
    calls: list[list[Span]] = []
    for span in spans:
        if calls and span[1] == calls[-1][-1][2]:
            calls[-1].append(span)
        else:
            calls.append([span])
    return calls


def _check_spans(rows: list[dict[str, Any]]) -> int:
    """Every valid row's spans are well formed; returns how many rows hold a call whose
    tokens came from two versions.

    A call's weights only move forwards (it is paused and goes on under newer weights).
    A row's next call may run at an older version than its last: it may go to another
    server whose push has not landed yet (with interrupt a lagging server keeps taking
    calls), as it did beside two CPU hogs ([3, 3, 3, 4, 3])."""
    interrupted = 0
    for row in rows:
        spans: list[Span] = [(v, start, end) for v, start, end in row["weight_version_spans"]]
        if not row["valid"]:
            assert spans == []
            continue
        assert spans, row
        versions = [version for version, _, _ in spans]
        assert min(versions) >= row["weight_version"]  # the group's oldest call
        # Step S trains version S into S + 1: no token it trains is newer than S.
        assert max(versions) <= row["step"], row
        for (_, start, end), (_, next_start, _) in itertools.pairwise(spans):
            assert start < end <= next_start
        calls = _calls(spans)
        for call in calls:
            call_versions = [version for version, _, _ in call]
            assert call_versions == sorted(call_versions), row
        if any(len({version for version, _, _ in call}) > 1 for call in calls):
            interrupted += 1
    return interrupted


@pytest.mark.slow
def test_the_default_job_with_interrupt_finishes_audited_with_spans(
    tmp_path: Path, trained_rows: TrainedRows
) -> None:
    config = config_from_builtins(
        {"job": {"steps": 12}, "generation": {"on_weight_update": "interrupt"}}
    )
    out = tmp_path / "run"
    result = run_job(out, config)
    assert result.summary.steps == 12
    report = audit_run(out)
    assert report.ok, report.violations
    rows = trained_rows(out)
    assert len(rows) == 12 * config.job.prompts_per_step * config.job.generations_per_prompt - (
        result.summary.prompts_dropped * config.job.generations_per_prompt
    )
    # At every step's update some calls are in flight: they are split, not waited for.
    assert _check_spans(rows) > 0


@pytest.mark.slow
def test_the_http_job_with_launched_servers_and_interrupt_finishes_audited_with_spans(
    tmp_path: Path, trained_rows: TrainedRows
) -> None:
    config = config_from_builtins(
        {
            "job": {"steps": 10},
            "generation": {
                "backend": "http",
                "on_weight_update": "interrupt",
                "call_latency_s": 0.03,
                "attempt_deadline_s": 10.0,
            },
            "http": {"launch_servers": 2, "dialect": "vllm-generate", "probe_interval_s": 0.1},
        }
    )
    out = tmp_path / "run"
    result = run_job(out, config)
    assert result.summary.steps == 10
    report = audit_run(out)
    assert report.ok, report.violations
    rows = trained_rows(out)
    assert rows and all(row["weight_version_spans"] for row in rows if row["valid"])
    assert _check_spans(rows) > 0  # pushes paused calls in flight, which went on
    # The launched servers pace their tokens, so the pushes pause calls between tokens.
    command = (out / "servers.json").read_text()
    assert "--token-latency-s" in command


@pytest.mark.parametrize(
    ("sections", "path"),
    [
        ({"generation": {"backend": "ray"}}, "$.generation.on_weight_update"),
        ({"generation": {"backend": "http"}}, "$.http.dialect"),
        (
            {
                "generation": {"backend": "http"},
                "http": {"dialect": "vllm-generate", "weight_sync": "version-tag"},
            },
            "$.http.weight_sync",
        ),
    ],
)
def test_interrupt_is_refused_where_it_cannot_be_honoured(
    sections: dict[str, dict[str, Any]], path: str
) -> None:
    data: dict[str, dict[str, Any]] = {k: dict(v) for k, v in sections.items()}
    data.setdefault("generation", {})["on_weight_update"] = "interrupt"
    with pytest.raises(ConfigError) as caught:
        config_from_builtins(data)
    assert caught.value.path == path


def test_the_knob_is_operational_and_defaults_to_continue() -> None:
    default = config_from_builtins({})
    assert default.generation.on_weight_update == "continue"
    changed = config_from_builtins({"generation": {"on_weight_update": "interrupt"}})
    # It may change on resume: it is an operational setting, not the job's identity.
    assert config_differences(default, changed, which="operational") == [
        "$.generation.on_weight_update: 'continue' != 'interrupt'"
    ]
    assert config_differences(default, changed, which="identity") == []
    with pytest.raises(ConfigError) as caught:
        config_from_builtins({"generation": {"on_weight_update": "sometimes"}})
    assert caught.value.path == "$.generation.on_weight_update"

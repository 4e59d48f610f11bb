"""A server that answers another model's logprobs (issue 24, item 12).

It acknowledged every push under the version pushed (so its version checks pass) and kept
generating from other weights. The trainer recomputed the logprobs under the very weights
the job had sent it, saw ratios far from 1 (93% of tokens clipped at step 0) and trained
on them anyway: exit 0, audit pass, "valid rows 1.000". Now each step whose tokens the
trainer can check is refused (nothing trains), a ``logprob_mismatch`` record says so, and
after ``job.max_steps_without_valid_rows`` such steps in a row the run stops saying why.
An honest server beside the same trainer is never refused.

The servers are real ``PolicyServer``s on 127.0.0.1 in the test process; the liar's weight
store relabels its own weights with each pushed version instead of loading the push.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from run_fixtures import backend_events

from rollout_recovery.control import RunConfig
from rollout_recovery.errors import NoValidRowsError
from rollout_recovery.history import audit_run
from rollout_recovery.job import run_job
from rollout_recovery.policy import NumpyGRPOTrainer, PolicySnapshot
from rollout_recovery.serve import PolicyServer

ReadJsonl = Callable[[Path], list[dict[str, Any]]]


def _another_model() -> PolicySnapshot:
    # Peaked tables: far from the job's near-uniform initial policy.
    return NumpyGRPOTrainer(seed=7, init_std=2.0).weights()


@pytest.fixture
def lying_server() -> Iterator[str]:
    server = PolicyServer(initial_weights=_another_model())
    store = server._weights
    store.load = lambda snapshot: store.relabel(snapshot.version)  # type: ignore[method-assign]
    with server:
        yield server.url


@pytest.fixture
def honest_server() -> Iterator[str]:
    with PolicyServer() as server:
        yield server.url


def _http_job(url: str, steps: int) -> dict[str, dict[str, Any]]:
    return {
        "job": {"steps": steps, "max_steps_without_valid_rows": 2},
        "generation": {"backend": "http", "call_latency_s": 0.0, "attempt_deadline_s": 10.0},
        "http": {"servers": [url], "probe_interval_s": 0.1},
        "faults": {"attempt_failure_rate": 0.0, "tamper_rate": 0.0},
    }


def test_steps_of_another_models_logprobs_are_refused_and_the_run_stops_saying_so(
    tmp_path: Path,
    lying_server: str,
    fast_config: Callable[..., RunConfig],
    read_jsonl: ReadJsonl,
) -> None:
    out = tmp_path / "run"
    with pytest.raises(NoValidRowsError) as caught:
        run_job(out, fast_config(_http_job(lying_server, steps=6)))

    message = str(caught.value)
    assert "2 steps in a row (through step 1) trained no valid row" in message
    assert "the last was refused: step 1 refused: its behaviour logprobs are" in message
    assert "[trainer] logprob_tolerance = 0.2" in message
    assert "another model's logprobs" in message
    refusals = backend_events(read_jsonl(out / "events.jsonl"), "logprob_mismatch")
    assert [r["step"] for r in refusals] == [0, 1]
    for refusal in refusals:
        assert refusal["gap"] > 1.0 and refusal["tolerance"] == 0.2
        assert refusal["checked_tokens"] > 0 and refusal["rows"] > 0
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["train/logprob_refused"] for m in metrics] == [1.0, 1.0]
    assert all(m["refused_rows"] == m["valid_rows"] > 0 for m in metrics)
    # The journal stays a true history: the audit finds nothing wrong in it.
    report = audit_run(out)
    assert not report.violations, report.violations
    # ... and counts no refused row as trained.
    assert report.counts["steps_refused"] == 2 and report.counts["valid_rows"] == 0
    assert report.counts["valid_row_fraction"] == 0.0


@pytest.mark.slow
def test_an_honest_server_is_never_refused(
    tmp_path: Path,
    honest_server: str,
    fast_config: Callable[..., RunConfig],
    read_jsonl: ReadJsonl,
) -> None:
    out = tmp_path / "run"
    result = run_job(out, fast_config(_http_job(honest_server, steps=6)))

    assert result.summary.steps == 6 and result.summary.steps_refused == 0
    assert not backend_events(read_jsonl(out / "events.jsonl"), "logprob_mismatch")
    metrics = read_jsonl(out / "metrics.jsonl")
    assert all(m["train/logprob_refused"] == 0.0 for m in metrics)
    # Checked on every step (the trainer holds the versions an async run samples from),
    # and honest logprobs are the recompute's to far below the tolerance.
    assert all(m["train/logprob_checked_tokens"] > 0 for m in metrics)
    assert max(m["train/logprob_gap"] for m in metrics) < 0.05


@pytest.mark.slow
def test_the_operator_sees_each_refusal_the_stop_and_no_rerun_advice(
    tmp_path: Path,
    lying_server: str,
    write_config: Callable[..., Path],
    run_cli: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    out = tmp_path / "run"
    config = write_config(_http_job(lying_server, steps=6))
    result = run_cli(["--out", str(out), "--config", str(config), "--plain"])

    assert result.returncode == 1, result.stdout
    lines = result.stdout.splitlines()
    refused = [line for line in lines if " refused: its behaviour logprobs are " in line]
    assert [line.split()[1] for line in refused[:2]] == ["0", "1"], result.stdout
    assert f"; servers taken out of rotation: {lying_server}. " in refused[0]
    assert "error: the run stopped: NoValidRowsError: 2 steps in a row" in result.stdout
    assert "rerun the same command" not in result.stdout
    assert "Traceback" not in result.stdout


def test_the_tolerance_is_the_configs(
    tmp_path: Path,
    lying_server: str,
    fast_config: Callable[..., RunConfig],
    read_jsonl: ReadJsonl,
) -> None:
    # Log-ratios are bounded at 20: a tolerance of 20 turns the check off.
    job = _http_job(lying_server, steps=2)
    config = fast_config({**job, "trainer": {"logprob_tolerance": 20.0}})
    out = tmp_path / "run"

    assert run_job(out, config).summary.steps == 2
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["train/logprob_refused"] for m in metrics] == [0.0, 0.0]
    assert all(m["train/logprob_gap"] > 1.0 for m in metrics)


@pytest.mark.slow
def test_the_lying_server_is_taken_out_of_rotation_and_the_honest_one_finishes_the_run(
    tmp_path: Path,
    lying_server: str,
    honest_server: str,
    fast_config: Callable[..., RunConfig],
    read_jsonl: ReadJsonl,
) -> None:
    # Both servers take calls from the start. The first refused step names the liar only
    # (its rows' own gaps are above the tolerance, the honest server's are noise) and the
    # pool marks it dead and quarantined at once, so every row generated after that step
    # is the honest server's. Main refused every step until the run stopped.
    job = _http_job(lying_server, steps=6)
    job["job"]["max_steps_without_valid_rows"] = 5
    job["http"] |= {"servers": [lying_server, honest_server], "bad_data_quarantine_s": 600.0}
    config = fast_config(job)
    out = tmp_path / "run"
    result = run_job(out, config)

    assert result.summary.steps == 6
    events = read_jsonl(out / "events.jsonl")
    refusals = backend_events(events, "logprob_mismatch")
    assert refusals and refusals[0]["step"] == 0, refusals
    assert refusals[0]["servers"] == [lying_server] and refusals[0]["untraced_rows"] == 0
    assert 0 < refusals[0]["guilty_rows"] < refusals[0]["rows"]  # the honest rows are not
    assert all(refusal["servers"] == [lying_server] for refusal in refusals)
    blamed = backend_events(events, "server_logprob_mismatch")
    assert {event["server"] for event in blamed} == {lying_server}
    marked = backend_events(events, "server_bad_data")
    assert [(e["server"], e["reason"]) for e in marked] == [(lying_server, "logprob_mismatch")]
    # Out of rotation from its first refused step to the end (no probe revived it).
    states = backend_events(events, "server_state")
    liar = [(e["from"], e["to"]) for e in states if e["server"] == lying_server]
    assert liar == [("joining", "healthy"), ("healthy", "dead")], states
    # Only the steps whose rows were generated before it was marked (the staleness
    # window's) are refused; the honest server's rows train every step after them.
    metrics = read_jsonl(out / "metrics.jsonl")
    refused = [m["step"] for m in metrics if m["train/logprob_refused"]]
    assert refused == [r["step"] for r in refusals] == list(range(len(refused)))
    assert len(refused) <= config.job.staleness_window + 1, refused
    assert all(m["valid_rows"] > 0 for m in metrics[len(refused) :])
    assert result.summary.steps_refused == len(refused)
    assert not audit_run(out).violations

"""Sample completions on the console (issue 27 item 4): indented lines under each step's
progress line in plain output, a table above the bar on a terminal."""

from __future__ import annotations

import io

from rich.console import Console

from rollout_recovery.job._report import ConsoleSamples, RunReporter, ShowsSamples
from rollout_recovery.metrics._fanout import MetricsFanout

SAMPLES = [
    {
        "group_id": "g0000004",
        "generation_index": 0,
        "prompt": "What is 2+3?\nAnswer:",
        "completion": "5" * 200,
        "reward": 1.0,
    },
    {
        "group_id": "g0000005",
        "generation_index": 1,
        "prompt": "1+1=",
        "completion": "",
        "reward": None,
        "reason": "capture_poisoned:data_error:reward_raised",
    },
]


def _step(reporter: RunReporter, done: int) -> None:
    reporter.update(step=done, mean_reward=0.5, in_flight=0, retries=0, checkpoints=1)


def test_plain_output_shows_a_steps_samples_under_its_line() -> None:
    stream = io.StringIO()
    with RunReporter(Console(file=stream, width=300)) as reporter:
        assert isinstance(reporter, ShowsSamples)
        reporter.start(3, None)
        metrics = MetricsFanout([("console", ConsoleSamples(reporter))], resume_step=0)
        # The controller logs a step's record, then reports its progress.
        metrics.log_record(0, {"step": 0, "mean_reward": 0.5, "samples": SAMPLES})
        _step(reporter, 1)
        metrics.log_record(1, {"step": 1, "mean_reward": 0.5})
        _step(reporter, 2)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "starting 3 steps (step 0 to 2)"
    assert lines[1].startswith("step 0 (1/3 done) reward=0.500")
    assert lines[2].startswith("  sample g0000004/0 reward=1.000 prompt='What is 2+3?\\nAnswer:' ")
    assert lines[2].endswith("...'") and len(lines[2]) < 200
    assert lines[3] == (
        "  sample g0000005/1 reward=n/a (capture_poisoned:data_error:reward_raised) "
        "prompt='1+1=' completion=''"
    )
    assert lines[4].startswith("step 1 (2/3 done)") and len(lines) == 5


def test_a_terminal_shows_a_table_and_the_last_samples_are_not_lost() -> None:
    stream = io.StringIO()
    with RunReporter(Console(file=stream, force_terminal=True, width=160)) as reporter:
        reporter.start(3, None)
        reporter.show_samples(2, SAMPLES)  # no progress after it: shown when it closes
    output = stream.getvalue()
    assert "step 2: samples" in output
    assert "g0000004/0" in output and "'What is 2+3?\\nAnswer:'" in output

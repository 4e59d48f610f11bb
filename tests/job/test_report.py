"""Progress lines, the terminal bar, the summary table and metrics.jsonl."""

from __future__ import annotations

import io
from dataclasses import fields

import pytest
from rich.console import Console

from rollout_recovery.job._report import (
    RestoreTotals,
    RunReporter,
    RunSummary,
    render_summary,
)


def _plain_console() -> tuple[Console, io.StringIO]:
    stream = io.StringIO()
    return Console(file=stream, width=200), stream


def _terminal_console() -> tuple[Console, io.StringIO]:
    stream = io.StringIO()
    return Console(file=stream, force_terminal=True, width=160), stream


def _update(reporter: RunReporter, step: int, reward: float | None = 0.5) -> None:
    reporter.update(step=step, mean_reward=reward, in_flight=23, retries=4, checkpoints=2)


# --------------------------------------------------------------------------------------
# RunReporter


def test_plain_mode_prints_one_line_per_step_update() -> None:
    console, stream = _plain_console()
    with RunReporter(console) as reporter:
        assert reporter.plain
        reporter.start(40, None)
        _update(reporter, 1, 0.25)
        _update(reporter, 2, 0.5313)
        reporter.log("checkpoint written at step 2 [bold]not markup[/]")
        _update(reporter, 3, None)
    assert stream.getvalue().splitlines() == [
        "starting 40 steps (step 0 to 39)",
        "step 0 (1/40 done) reward=0.250 in_flight=23 retries=4 checkpoints=2",
        "step 1 (2/40 done) reward=0.531 in_flight=23 retries=4 checkpoints=2",
        "checkpoint written at step 2 [bold]not markup[/]",
        "step 2 (3/40 done) reward=n/a in_flight=23 retries=4 checkpoints=2",
    ]


def test_plain_mode_folds_repeated_updates_of_one_step() -> None:
    console, stream = _plain_console()
    with RunReporter(console) as reporter:
        reporter.start(5, None)
        _update(reporter, 1)
        reporter.update(step=1, mean_reward=0.5, in_flight=7, retries=4, checkpoints=2)
        _update(reporter, 2)
    lines = stream.getvalue().splitlines()
    assert [line.split()[1] for line in lines[1:]] == ["0", "1"]


def test_plain_mode_reports_a_resume() -> None:
    console, stream = _plain_console()
    with RunReporter(console) as reporter:
        reporter.start(40, 15)
        _update(reporter, 16)
    assert stream.getvalue().splitlines() == [
        "resuming at step 15: 25 of 40 steps left",
        "step 15 (16/40 done) reward=0.500 in_flight=23 retries=4 checkpoints=2",
    ]


def test_force_plain_overrides_a_terminal() -> None:
    console, stream = _terminal_console()
    with RunReporter(console, force_plain=True) as reporter:
        assert reporter.plain
        reporter.start(3, None)
        _update(reporter, 1)
    output = stream.getvalue()
    assert "\x1b" not in output
    assert output.splitlines()[-1] == (
        "step 0 (1/3 done) reward=0.500 in_flight=23 retries=4 checkpoints=2"
    )


def test_a_stream_is_accepted_in_place_of_a_console() -> None:
    stream = io.StringIO()
    with RunReporter(stream) as reporter:
        reporter.start(2, None)
        _update(reporter, 1)
    assert stream.getvalue().splitlines()[-1].startswith("step 0 (1/2 done) ")


def test_terminal_mode_renders_a_progress_bar() -> None:
    console, stream = _terminal_console()
    with RunReporter(console) as reporter:
        assert not reporter.plain
        reporter.start(10, 3)
        reporter.log("a log line")
        reporter.update(step=4, mean_reward=0.75, in_flight=9, retries=1, checkpoints=1)
    output = stream.getvalue()
    assert "a log line" in output
    # The bar's final state is left on screen when the reporter closes.
    final = output.rsplit("\r", 1)[-1]
    assert "4/10 steps done" in final
    assert "reward=0.750 in_flight=9 retries=1 checkpoints=1" in final


def test_a_closed_reporter_refuses_more_and_closes_once() -> None:
    console, _ = _terminal_console()
    reporter = RunReporter(console)
    reporter.start(3, None)
    reporter.close()
    reporter.close()
    with pytest.raises(ValueError, match="closed"):
        _update(reporter, 1)
    with pytest.raises(ValueError, match="closed"):
        reporter.log("late")


# --------------------------------------------------------------------------------------
# Summary


def _summary(**overrides: object) -> RunSummary:
    values: dict[str, object] = {
        "steps": 40,
        "prompts_taken": 331,
        "prompts_trained": 317,
        "prompts_dropped": 14,
        "attempts": 1412,
        "retries": 97,
        "checkpoints": 8,
        "restores": 2,
        "longest_checkpoint_stall_s": 0.125,
        "wall_time_s": 61.5,
        "first_tenth_reward": 0.211,
        "last_tenth_reward": 0.842,
        "valid_row_fraction": 0.981,
    }
    values.update(overrides)
    return RunSummary(**values)  # type: ignore[arg-type]


def test_the_summary_table_shows_every_field() -> None:
    console, stream = _plain_console()
    render_summary(_summary(), console)
    rows = {
        cells[0]: cells[1]
        for line in stream.getvalue().splitlines()
        if len(cells := [cell.strip() for cell in line.strip("│ ").split("│")]) == 2
    }
    assert rows == {
        "steps trained": "40",
        "prompts taken": "331",
        "prompts trained": "317",
        "prompts dropped": "14",
        "attempts": "1412",
        "retries": "97",
        "checkpoints written": "8",
        "restores": "2",
        "longest checkpoint stall": "0.125 s",
        "wall time": "61.500 s",
        "mean reward, first tenth": "0.211",
        "mean reward, last tenth": "0.842",
        "valid rows (fraction trained)": "0.981",
        "calls resumed (not generated again)": "0",
        "steps refused (another model's logprobs)": "0",
        "finished groups kept by restores": "0",
        "rows kept by restores (not generated again)": "0",
        "tokens kept by restores": "0",
        "steps rolled back and trained again": "0",
        "groups trained again (from kept rows)": "0",
        "rows trained again": "0",
        "tokens lost by restores (generated again)": "0",
    }
    # Every scalar field and what the restores did; the per-part counts get a table of
    # their own, and the step time shares a row only when a step was timed.
    assert len(rows) == len(fields(RunSummary)) - 3 + len(fields(RestoreTotals))
    assert "generation parts" not in stream.getvalue()


def test_the_summary_shows_where_the_steps_time_went() -> None:
    console, stream = _plain_console()
    shares = {"generation": 0.61, "train": 0.15, "weight_sync": 0.21, "checkpoint": 0.04}
    render_summary(_summary(time_shares=shares), console)
    assert "generation 61%, train 15%, weight sync 21%, checkpoint 4%" in stream.getvalue()


def test_the_summary_shows_one_row_per_server_or_actor() -> None:
    console, stream = _plain_console()
    parts = {
        "gen-0": {"attempts": 40, "failures": 3, "state": "dead", "pid": 11, "replaces": None},
        "gen-2": {"attempts": 12, "failures": 0, "state": "live", "pid": 12, "replaces": "gen-0"},
    }
    render_summary(_summary(parts=parts), console)
    text = stream.getvalue()
    assert "generation parts" in text
    lines = [line for line in text.splitlines() if "gen-" in line]
    assert len(lines) == 2
    assert "dead" in lines[0] and "40" in lines[0] and "3" in lines[0]
    assert "live" in lines[1] and "gen-0" in lines[1]  # the actor it replaced
    assert "pid" not in text  # process ids are for the metrics file, not the table


def test_the_summary_shows_a_missing_reward_as_n_a() -> None:
    console, stream = _plain_console()
    render_summary(_summary(first_tenth_reward=None, last_tenth_reward=None), console)
    assert stream.getvalue().count("n/a") == 2


def test_the_summary_renders_on_a_terminal() -> None:
    console, stream = _terminal_console()
    render_summary(_summary(), console)
    assert "prompts dropped" in stream.getvalue()


def test_the_summary_is_frozen() -> None:
    summary = _summary()
    with pytest.raises(AttributeError):
        summary.steps = 1  # type: ignore[misc]


def test_many_dead_actors_are_added_up_in_one_row() -> None:
    console, stream = _plain_console()
    parts = {
        f"gen-{i}": {"attempts": 10, "failures": 2, "state": "dead", "replaces": None}
        for i in range(9)
    }
    parts["gen-9"] = {"attempts": 5, "failures": 1, "state": "live", "replaces": "gen-8"}
    render_summary(_summary(parts=parts), console)
    text = stream.getvalue()
    (row,) = [line for line in text.splitlines() if "9 dead, added up" in line]
    assert "90" in row and "18" in row
    assert "gen-9" in text and "gen-3 " not in text

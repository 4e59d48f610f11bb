"""What a run shows while it runs and when it ends: progress, the summary, metrics.jsonl.

``RunReporter`` draws a rich progress bar on a terminal and prints plain log lines
otherwise (a CI log, a file), so a captured log holds one line per step, and shows each
step's sample completions (a table, or indented lines). ``render_summary`` prints the
end-of-run table.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Final, Protocol, TextIO, runtime_checkable

from rich import box
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from .._lifecycle import Resource
from ..errors import ClosedResourceError
from ..history.records import HistoryRecord, Restored, StepTrained

__all__ = [
    "ConsoleSamples",
    "RestoreTotals",
    "RunProgress",
    "RunReporter",
    "RunSummary",
    "ShowsSamples",
    "render_summary",
    "silence_closed_stdout",
]

#: Characters of a prompt or completion a console line shows (metrics.jsonl has more).
_SHOWN: Final = 72


class RunProgress(Protocol):
    """Where :func:`run_job` reports progress (the CLI's :class:`RunReporter`, or nothing):
    ``start`` once the job knows whether it resumed, ``update`` after every trained step
    (from the controller), ``log`` for a line of text."""

    def start(self, total_steps: int, resumed_from: int | None) -> None: ...

    def update(
        self,
        *,
        step: int,
        mean_reward: float | None,
        in_flight: int,
        retries: int,
        checkpoints: int,
    ) -> None: ...

    def log(self, message: str) -> None: ...


@runtime_checkable
class ShowsSamples(Protocol):
    """A progress display that shows each step's sample completions (``RunReporter``)."""

    def show_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None: ...


class ConsoleSamples(Resource):
    """A metrics sink (beside TensorBoard, W&B, MLflow) that shows only each step's
    samples, on the run's progress display (which the CLI closes, not this)."""

    def __init__(self, display: ShowsSamples) -> None:
        self._display = display

    def log_step(self, step: int, values: Mapping[str, Any]) -> None:
        pass  # the progress line has the step's numbers

    def log_marker(self, step: int, kind: str, fields: Mapping[str, Any]) -> None:
        pass  # the job logs restores and drains itself

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        self._display.show_samples(step, samples)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass  # holds nothing: the display is the CLI's, closed by it


def _shown(text: object) -> str:
    """One line of at most ``_SHOWN`` characters: newlines and quotes escaped by repr."""
    shown = repr(str(text))
    return shown if len(shown) <= _SHOWN else shown[: _SHOWN - 4] + "...'"


def _sample_reward(sample: Mapping[str, Any]) -> str:
    reward = sample.get("reward")
    text = _format_reward(reward if isinstance(reward, int | float) else None)
    if sample.get("reason"):
        text += f" ({sample['reason']})"
    return text


def silence_closed_stdout() -> None:
    """Point stdout at /dev/null, so nothing (the interpreter's final flush included)
    writes to a pipe whose reader is gone."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _raise_broken_pipe() -> None:
    raise BrokenPipeError(errno.EPIPE, "the reader of the output went away")


def _format_reward(reward: float | None) -> str:
    if reward is None:
        return "n/a"
    return f"{reward:.3f}"


class RunReporter(Resource):
    """Live progress of one run.

    Steps are numbered from 0, as everywhere else (the journal, metrics.jsonl, every
    sink, the plot, errors): "step 12" is the 13th step, and a checkpoint or a resume "at
    step 12" comes after steps 0 to 11. On a terminal (``console.is_terminal``) it shows a
    rich progress bar with the last step trained and how many of all are done, the last
    mean reward, attempts in flight, retries and checkpoints. Anywhere else, or with
    ``force_plain=True``, it prints plain lines instead::

        starting 40 steps (step 0 to 39)
        step 12 (13/40 done) reward=0.531 in_flight=23 retries=4 checkpoints=2

    A plain line is printed when ``update`` reports a step other than the last one
    printed; repeated updates of the same step (live in-flight counts) only refresh the
    bar. ``log`` lines are printed as is, markup and highlighting off.
    """

    # The reporter owns the run's output: a CLI whose reader went away asks it too.
    silence_closed_stdout = staticmethod(silence_closed_stdout)

    def __init__(
        self, console: Console | TextIO | None = None, *, force_plain: bool = False
    ) -> None:
        if console is None:
            console = Console(stderr=True)
        elif not isinstance(console, Console):
            console = Console(file=console)
        # rich's answer to a closed output is SystemExit(1) from inside console.print (its
        # on_broken_pipe), which nothing below may catch, so a `run | head -2` stopped
        # training. The error comes back as itself instead, and _print turns output off.
        console.on_broken_pipe = _raise_broken_pipe  # type: ignore[method-assign]
        self._console = console
        self._plain = force_plain or not console.is_terminal
        self._total: int | None = None
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._last_printed_step: int | None = None
        # A step's samples arrive just before its progress: shown after its line.
        self._pending_samples: tuple[int, Sequence[Mapping[str, Any]]] | None = None
        self._closed = False
        self._output_off = False

    @property
    def plain(self) -> bool:
        """True when this reporter prints plain lines rather than a progress bar."""
        return self._plain

    def start(self, total_steps: int, resumed_from: int | None) -> None:
        """Begin the display; ``resumed_from`` is the completed-step count of the restore.

        ``None`` means a fresh run.
        """
        self._check_open()
        self._total = total_steps
        done = resumed_from or 0
        if resumed_from is None:
            self._print(f"starting {total_steps} steps (step 0 to {total_steps - 1})")
        else:
            self._print(
                f"resuming at step {resumed_from}: {max(total_steps - done, 0)} "
                f"of {total_steps} steps left"
            )
        if self._plain:
            return
        if self._progress is None:
            self._progress = Progress(
                TextColumn("[bold]{task.completed}/{task.total} steps done"),
                BarColumn(),
                TextColumn(
                    "reward={task.fields[reward]} in_flight={task.fields[in_flight]} "
                    "retries={task.fields[retries]} checkpoints={task.fields[checkpoints]}"
                ),
                TimeElapsedColumn(),
                console=self._console,
            )
            self._progress.start()
            self._task = self._progress.add_task(
                "run",
                total=total_steps,
                completed=done,
                reward="n/a",
                in_flight=0,
                retries=0,
                checkpoints=0,
            )
        else:
            assert self._task is not None
            self._progress.update(self._task, total=total_steps, completed=done)

    def update(
        self,
        *,
        step: int,
        mean_reward: float | None,
        in_flight: int,
        retries: int,
        checkpoints: int,
    ) -> None:
        """Report progress: ``step`` is the number of steps completed, so the step just
        trained is ``step - 1`` (steps are numbered from 0)."""
        self._check_open()
        reward = _format_reward(mean_reward)
        if self._plain:
            if step == self._last_printed_step:
                return
            self._last_printed_step = step
            total = "?" if self._total is None else str(self._total)
            self._print(
                f"step {step - 1} ({step}/{total} done) reward={reward} in_flight={in_flight} "
                f"retries={retries} checkpoints={checkpoints}"
            )
            self._show_pending_samples()
            return
        if self._progress is None:
            self.start(self._total or step, None)
        assert self._progress is not None and self._task is not None
        self._progress.update(
            self._task,
            completed=step,
            reward=reward,
            in_flight=in_flight,
            retries=retries,
            checkpoints=checkpoints,
        )
        self._show_pending_samples()

    def log(self, message: str) -> None:
        """One line of text, printed as is (above the bar on a terminal)."""
        self._check_open()
        self._print(message)

    def show_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        """Step ``step``'s sample completions: a table above the bar on a terminal, one
        indented line each in plain output, shown after the step's progress line."""
        self._check_open()
        self._show_pending_samples()  # a step whose progress never came
        self._pending_samples = (step, samples)

    def _show_pending_samples(self) -> None:
        if self._pending_samples is None:
            return
        (step, samples), self._pending_samples = self._pending_samples, None
        if self._plain:
            for sample in samples:
                self._print(
                    f"  sample {sample.get('group_id')}/{sample.get('generation_index')} "
                    f"reward={_sample_reward(sample)} prompt={_shown(sample.get('prompt'))} "
                    f"completion={_shown(sample.get('completion'))}"
                )
            return
        table = Table(
            title=f"step {step}: samples", box=box.SIMPLE_HEAD, show_header=True, pad_edge=False
        )
        table.add_column("row", no_wrap=True)
        table.add_column("reward", justify="right")
        table.add_column("prompt", overflow="fold")
        table.add_column("completion", overflow="fold")
        for sample in samples:
            table.add_row(
                f"{sample.get('group_id')}/{sample.get('generation_index')}",
                _sample_reward(sample),
                _shown(sample.get("prompt")),
                _shown(sample.get("completion")),
            )
        self._print_renderable(table)

    def close(self) -> None:
        """Stop the bar (leaving its last state on screen); idempotent."""
        if self._closed:
            return
        self._show_pending_samples()
        self._closed = True
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def _print(self, message: str) -> None:
        self._print_renderable(message)

    def _print_renderable(self, message: str | Table) -> None:
        if self._output_off:
            return
        console = self._progress.console if self._progress is not None else self._console
        try:
            if isinstance(message, str):
                console.print(message, markup=False, highlight=False, soft_wrap=True)
            else:
                console.print(message)
        except (BrokenPipeError, ValueError, OSError) as error:
            if (
                isinstance(error, OSError)
                and not isinstance(error, BrokenPipeError)
                and (error.errno != errno.EPIPE)
            ):
                raise
            self._turn_output_off(error)

    def _turn_output_off(self, error: BaseException) -> None:
        """The reader of our output went away (``run | head -2``): output never stops
        training, so it is turned off, said once on stderr."""
        self._output_off = True
        if self._progress is not None:
            with contextlib.suppress(Exception):
                self._progress.stop()
            self._progress = None
        silence_closed_stdout()
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(
                f"rollout-recovery: output closed ({type(error).__name__}); the run goes on "
                "without printing progress\n"
            )
            sys.stderr.flush()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedResourceError("the run reporter is closed")


@dataclass(frozen=True, slots=True)
class RestoreTotals:
    """What every restore of a run kept and what it cost, from its ``restored`` records.

    A restore keeps the work the journal holds: finished groups (their canonical rows,
    trained as they are) and the sealed siblings of unfinished ones; what was trained
    after its snapshot is rolled back and trained again from those kept rows (the policy
    lives only in checkpoints), and what it lost is generated again.
    """

    #: Finished groups kept (their rows trained without generating them again).
    groups_kept: int = 0
    #: Their rows plus the sealed siblings of unfinished groups.
    rows_kept: int = 0
    #: The generated tokens of those rows, and of staged calls kept for resumption.
    tokens_kept: int = 0
    #: Steps trained after a snapshot and trained again (with their groups and rows).
    steps_retrained: int = 0
    groups_retrained: int = 0
    rows_retrained: int = 0
    #: Generated tokens thrown away (seals the reuse policy discarded, calls in flight).
    tokens_lost: int = 0

    @classmethod
    def of(cls, history: Iterable[HistoryRecord], group_size: int) -> RestoreTotals:
        """The totals over every ``restored`` record of ``history`` (in journal order;
        streamed: of each step's newest training only its group and row counts are kept)."""
        totals: dict[str, int] = {name.name: 0 for name in fields(cls)}
        trained: dict[int, tuple[int, int]] = {}  # step: (groups, rows) of its newest training
        for record in history:
            if isinstance(record, StepTrained):
                trained[record.step] = (len(record.group_ids), len(record.rows))
            elif isinstance(record, Restored):
                totals["groups_kept"] += record.canonical_groups
                totals["rows_kept"] += record.rows_kept(group_size)
                totals["tokens_kept"] += record.tokens_kept
                totals["tokens_lost"] += record.tokens_regenerated
                for step in record.rolled_back_steps:
                    totals["steps_retrained"] += 1
                    groups, rows = trained.get(step, (0, 0))
                    totals["groups_retrained"] += groups
                    totals["rows_retrained"] += rows
        return cls(**totals)


@dataclass(frozen=True, slots=True)
class RunSummary:
    """The end-of-run numbers printed by :meth:`render`."""

    steps: int
    prompts_taken: int
    prompts_trained: int
    prompts_dropped: int
    attempts: int
    retries: int
    checkpoints: int
    restores: int
    longest_checkpoint_stall_s: float
    wall_time_s: float
    # Mean reward over the first and the last tenth of the steps (None: no reward yet).
    first_tenth_reward: float | None
    last_tenth_reward: float | None
    #: Valid rows trained over all rows (placeholders, and the valid rows of refused steps,
    #: are the rest); None before any row.
    valid_row_fraction: float | None = None
    #: Per generation part (server or actor) counts from the backend's telemetry, when it
    #: has parts that live and die on their own: ``{name: {"state": ..., "calls": ...}}``.
    parts: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: Calls sealed attempts continued from lost attempts instead of generating them again.
    calls_resumed: int = 0
    #: Where the steps' time went: each ``time/<part>_s`` field's share of ``time/step_s``
    #: over the run (``{"generation": 0.61, "train": 0.15, ...}``).
    time_shares: Mapping[str, float] = field(default_factory=dict)
    #: Steps the trainer refused: their behaviour logprobs were another model's.
    steps_refused: int = 0
    #: What the restores kept, retrained and lost (shown when there were restores).
    restored: RestoreTotals = field(default_factory=RestoreTotals)

    def render(self, console: Console) -> None:
        """Print the summary as tables (see :func:`render_summary`)."""
        render_summary(self, console)


_SUMMARY_LABELS = {
    "steps": "steps trained",
    "prompts_taken": "prompts taken",
    "prompts_trained": "prompts trained",
    "prompts_dropped": "prompts dropped",
    "attempts": "attempts",
    "retries": "retries",
    "calls_resumed": "calls resumed (not generated again)",
    "checkpoints": "checkpoints written",
    "restores": "restores",
    "longest_checkpoint_stall_s": "longest checkpoint stall",
    "wall_time_s": "wall time",
    "first_tenth_reward": "mean reward, first tenth",
    "last_tenth_reward": "mean reward, last tenth",
    "valid_row_fraction": "valid rows (fraction trained)",
    "steps_refused": "steps refused (another model's logprobs)",
}
_RESTORE_LABELS = {
    "groups_kept": "finished groups kept by restores",
    "rows_kept": "rows kept by restores (not generated again)",
    "tokens_kept": "tokens kept by restores",
    "steps_retrained": "steps rolled back and trained again",
    "groups_retrained": "groups trained again (from kept rows)",
    "rows_retrained": "rows trained again",
    "tokens_lost": "tokens lost by restores (generated again)",
}


def _format_summary_value(name: str, value: object) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if name.endswith("_s"):
            return f"{value:.3f} s"
        return f"{value:.3f}"
    return str(value)


def render_summary(summary: RunSummary, console: Console) -> None:
    """Print the summary as a two-column table (also readable on a plain console)."""
    table = Table(title="run summary", show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for item in fields(summary):
        if item.name in ("parts", "time_shares", "restored"):
            continue
        value = getattr(summary, item.name)
        table.add_row(_SUMMARY_LABELS[item.name], _format_summary_value(item.name, value))
    if summary.restores:
        for item in fields(summary.restored):
            value = getattr(summary.restored, item.name)
            table.add_row(_RESTORE_LABELS[item.name], _format_summary_value(item.name, value))
    if summary.time_shares:
        # Each part's share of the steps' time; a background push overlaps generation, so
        # the shares need not add up to 100%.
        shares = ", ".join(
            f"{name.replace('_', ' ')} {share:.0%}" for name, share in summary.time_shares.items()
        )
        table.add_row("step time", shares)
    console.print(table)
    if summary.parts:
        console.print(_parts_table(summary.parts))


# More dead parts than this are added up into one row.
_MAX_DEAD_ROWS = 6
# Short headers: the table fits 80 columns with a server address in the first one.
_PART_LABELS = {
    "infra_failures": "infra",
    "data_failures": "data",
    "weight_pushes": "pushes",
}


def _parts_table(parts: Mapping[str, Mapping[str, Any]]) -> Table:
    """One row per server or actor: its state and counts (attempts, failures, ...)."""
    columns: list[str] = []
    for counts in parts.values():
        columns.extend(c for c in counts if c not in columns and c != "pid")
    table = Table(
        title="generation parts",
        caption="infra, data: failed calls by class" if "infra_failures" in columns else None,
        show_header=True,
        header_style="bold",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("part", no_wrap=True)
    for column in columns:
        table.add_column(_PART_LABELS.get(column, column.replace("_", " ")), justify="right")
    dead = {name: counts for name, counts in parts.items() if counts.get("state") == "dead"}
    folded = len(dead) > _MAX_DEAD_ROWS
    for name, counts in parts.items():
        if folded and name in dead:
            continue
        shown = name.removeprefix("http://").removeprefix("https://")
        table.add_row(shown, *(_format_summary_value(c, counts.get(c)) for c in columns))
    if folded:
        # A long run replaces many actors: one row adds them up (metrics.jsonl has each).
        total = {
            c: sum(v.get(c) or 0 for v in dead.values())
            for c in columns
            if all(isinstance(v.get(c), int | None) for v in dead.values())
        }
        cells = [
            "dead" if c == "state" else _format_summary_value(c, total.get(c)) if c in total else ""
            for c in columns
        ]
        table.add_row(f"{len(dead)} dead, added up", *cells)
    return table

"""A history record type nobody handles is a type error (issue 25, item 1).

Every fold over ``HistoryRecord`` (the one transition of each record, the controller
state's fold, the replay's treatment of a rewound group, and the auditor's own model of
the run and its walk of the journal) is a ``match`` ending in ``assert_never``. This test
adds a record type to a copy of the package's history union and runs ``mypy --strict`` on
the folds: each must fail at its ``assert_never``, and nowhere else for that reason.
Imports other than the union are skipped (``--follow-imports=skip``), so it takes about a
second."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from mypy_support import run_mypy

import rollout_recovery

pytest.importorskip("mypy.api")

PACKAGE = Path(rollout_recovery.__file__).parent
#: The rooms whose folds over the history union must be exhaustive.
ROOMS = ("control", "history", "job", "chaos", "cli")
NEW_RECORD = '''
class Unhandled(_Record, tag="unhandled", frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A record type added to the union and handled nowhere."""

    group_id: str

'''
UNION = "#: Every record type a history holds.\nHistoryRecord = (\n"


def _folds(package: Path) -> dict[Path, set[int]]:
    """Each module of ``ROOMS`` that folds over a record, and the lines of its
    ``assert_never`` calls."""
    found: dict[Path, set[int]] = {}
    for room in ROOMS:
        for module in sorted((package / room).glob("*.py")):
            lines = module.read_text().splitlines()
            calls = {n for n, line in enumerate(lines, 1) if "assert_never(" in line}
            if calls:
                found[module] = calls
    return found


def _assert_never_errors(package: Path, modules: list[Path]) -> set[tuple[str, int]]:
    records = package / "history" / "records.py"
    stdout, stderr, _ = run_mypy(
        [
            "--strict",
            "--follow-imports=skip",
            "--no-error-summary",
            "--no-incremental",
            str(records),
            *map(str, modules),
        ]
    )
    assert not stderr, stderr
    return {
        (match.group(1), int(match.group(2)))
        for match in re.finditer(
            r"^(?:.*/)?([\w]+\.py):(\d+): error: Argument 1 to \"assert_never\"", stdout, re.M
        )
    }


def test_a_record_type_handled_nowhere_fails_mypy_at_every_fold(tmp_path: Path) -> None:
    copy = tmp_path / "rollout_recovery"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    folds = _folds(copy)
    assert {path.name for path in folds} >= {
        "_transitions.py",
        "_state.py",
        "_replay.py",
        "_lineage.py",
        "_trail_check.py",
    }
    modules = sorted(folds)
    # As shipped, every fold handles every record type.
    assert _assert_never_errors(copy, modules) == set()

    records = copy / "history" / "records.py"
    source = records.read_text()
    assert UNION in source, "the history union moved: update this test"
    records.write_text(source.replace(UNION, NEW_RECORD + UNION + "    Unhandled\n    | ", 1))
    expected = {(path.name, line) for path, lines in folds.items() for line in lines}
    assert _assert_never_errors(copy, modules) == expected

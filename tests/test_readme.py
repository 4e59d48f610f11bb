"""The README's promises: two Quick start commands, and an API tour that runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _section(title: str) -> str:
    text = README.read_text()
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"README has no '## {title}' section"
    return match.group(1)


def _fenced(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def test_quick_start_has_exactly_two_commands() -> None:
    blocks = _fenced(_section("Quick start"), "bash")
    assert len(blocks) == 1
    commands = [line for line in blocks[0].splitlines() if line.strip()]
    assert len(commands) == 2
    assert "rollout-recovery" in commands[0]
    assert "[test]" in commands[1] and "pytest" in commands[1]


def test_ci_runs_the_readme_test_command() -> None:
    command = [c for c in _fenced(_section("Quick start"), "bash")[0].splitlines() if c][1]
    ci_script = (README.parent / ".ci" / "run").read_text()
    assert command.strip() in ci_script


@pytest.mark.parametrize("index", range(len(_fenced(_section("A short API tour"), "python"))))
def test_api_tour_example_runs(index: int) -> None:
    code = _fenced(_section("A short API tour"), "python")[index]
    exec(compile(code, f"README.md tour block {index}", "exec"), {"__name__": "__tour__"})


RESUME = "Continuing a lost episode from its last staged call"


@pytest.mark.parametrize("index", range(len(_fenced(_section(RESUME), "python"))))
def test_the_resume_example_runs(index: int) -> None:
    """The custom backend with the resume capability, as the README shows it."""
    code = _fenced(_section(RESUME), "python")[index]
    exec(compile(code, f"README.md resume block {index}", "exec"), {"__name__": "__resume__"})

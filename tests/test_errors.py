"""The error model: every deliberate raise is a project class; fatal and located errors."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest

import rollout_recovery
from rollout_recovery import errors
from rollout_recovery._messages import join_path

PACKAGE_ROOT = Path(rollout_recovery.__file__).parent
BARE = {"ValueError", "TypeError", "RuntimeError", "KeyError"}
# The vLLM worker extension runs inside vLLM's own venv, where this project is not
# installed: it can raise only builtin errors (vLLM reports them to the caller).
PENDING = {"vllm/_extension/rollout_recovery_vllm_extension.py"}


def _bare_raises(module: Path, root: Path = PACKAGE_ROOT) -> list[str]:
    tree = ast.parse(module.read_text(), filename=str(module))
    shadowed = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Raise) or node.exc is None:
            continue
        target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        if isinstance(target, ast.Name) and target.id in BARE and target.id not in shadowed:
            found.append(f"{module.relative_to(root)}:{node.lineno} raises {target.id}")
    return found


def test_every_deliberate_raise_is_a_project_error() -> None:
    violations = []
    for module in sorted(PACKAGE_ROOT.rglob("*.py")):
        if str(module.relative_to(PACKAGE_ROOT)) in PENDING:
            continue
        violations += _bare_raises(module)
    assert not violations, "\n".join(violations)


def test_every_project_error_keeps_a_builtin_base() -> None:
    for name in errors.__all__:
        value = getattr(errors, name)
        if isinstance(value, type) and issubclass(value, errors.RolloutRecoveryError):
            if value is errors.RolloutRecoveryError:
                continue
            bases = {
                base for base in value.__mro__ if getattr(builtins, base.__name__, None) is base
            }
            assert bases - {Exception, BaseException, object}, name


@pytest.mark.parametrize(
    "cls",
    [
        errors.CheckpointUnsafeError,
        errors.DeadCutError,
        errors.FinalizationUnknownError,
        errors.StagingInventoryError,
        errors.TrainingDivergedError,
    ],
)
def test_errors_that_stop_the_run_are_fatal(cls: type[errors.RolloutRecoveryError]) -> None:
    assert cls.fatal is True


def test_other_errors_are_not_fatal() -> None:
    assert errors.RolloutRecoveryError.fatal is False
    assert errors.InvalidStateError.fatal is False
    assert errors.DataPlaneBusyError.retryable is True
    assert errors.DataPlaneBusyError.fatal is False


def test_the_location_is_rendered_once_by_str() -> None:
    error = errors.InvalidStateError("bad status", path="$.groups[3].status", file="/c/x")
    assert error.message == "bad status"
    assert str(error) == "bad status (at $.groups[3].status in /c/x)"
    assert str(errors.InvalidStateError("plain")) == "plain"
    assert join_path("$.groups[3]", "$.status") == "$.groups[3].status"
    assert join_path("$.groups[3]", None) == "$.groups[3]"


def test_a_path_is_always_rooted() -> None:
    with pytest.raises(errors.InvalidArgumentError, match="rooted"):
        errors.InvalidStateError("x", path="groups[0]")


def test_bad_arguments_have_their_own_classes() -> None:
    assert issubclass(errors.InvalidArgumentError, ValueError)
    assert issubclass(errors.InvalidArgumentTypeError, TypeError)
    assert not issubclass(errors.InvalidArgumentError, errors.InvalidStateError)
    assert issubclass(errors.BareStringError, errors.InvalidArgumentTypeError)


def test_the_checker_sees_a_bare_raise(tmp_path: Path) -> None:
    probe = PACKAGE_ROOT / "errors.py"
    assert _bare_raises(probe) == []
    fake = tmp_path / "fake.py"
    fake.write_text("def f():\n    raise ValueError('x')\n")
    assert _bare_raises(fake, tmp_path) == ["fake.py:2 raises ValueError"]
    fake.write_text("from x import ValueError\ndef f():\n    raise ValueError('x')\n")
    assert _bare_raises(fake, tmp_path) == []

"""Settings for the whole suite.

Hypothesis: no per-example deadline and no too-slow health check. Both judge wall time,
and CI runs the suite once on a loaded 2-core machine, where one descheduled example must
not fail a property that holds. Examples stay random (a real counterexample should fail
CI); set HYPOTHESIS_PROFILE=default for Hypothesis's own defaults.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

# The run fixtures (a fast job, the CLI in a child process group, finished runs) serve the
# job, history and chaos tests alike.
pytest_plugins = ["run_fixtures"]

settings.register_profile(
    "rollout-recovery", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "rollout-recovery"))


_GUARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def pytest_configure(config: pytest.Config) -> None:
    """Python's own Ctrl-C handler, as a terminal gives it. A shell without job control
    starts a background job (``pytest ... &``) with SIGINT ignored, so Python installs no
    handler, and the tests of what a job does with Ctrl-C (and which handler it puts back)
    would test the shell instead."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _starts_ray(item: pytest.Item) -> bool:
    """Whether ``item`` may start a local Ray cluster: a ``ray`` test, a test of
    ``tests/cluster`` (its module fixture calls ``ray.init``) or one named for Ray (the Ray
    backend's job, its benchmark)."""
    if item.get_closest_marker("ray") is not None or "cluster" in item.path.parts:
        return True
    return "ray" in re.split(r"[^a-z]+", item.nodeid.lower())


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The suite runs on two pytest-xdist workers (``--dist loadgroup``, pyproject). Two
    Ray clusters at once on two cores starve each other's actors past their start and ping
    timeouts, so every test that may start one runs on the same worker, one at a time."""
    for item in items:
        if _starts_ray(item):
            item.add_marker(pytest.mark.xdist_group("ray"))


@pytest.fixture(autouse=True)
def _process_state_is_left_as_found() -> Iterator[None]:
    """A test that leaves a signal handler installed, or the recursion limit changed,
    changes what every later test in the process sees: a job's "Ctrl-C while opening
    raises KeyboardInterrupt" holds only while SIGINT's handler is Python's default, and
    a deeply nested request body is refused by the recursion limit. Restore it and fail
    the test that leaked it, so the leak is named where it happens, not in whichever test
    runs next."""
    before = {sig: signal.getsignal(sig) for sig in _GUARDED_SIGNALS}
    recursion_limit = sys.getrecursionlimit()
    yield
    leaked = []
    if sys.getrecursionlimit() != recursion_limit:
        # What a deep JSON body costs the server depends on it (tests/serve).
        leaked.append(f"recursion limit {sys.getrecursionlimit()} (was {recursion_limit})")
        sys.setrecursionlimit(recursion_limit)
    for sig, handler in before.items():
        now = signal.getsignal(sig)
        if now is not handler:
            signal.signal(sig, handler)
            leaked.append(f"{sig.name}: {now!r} (was {handler!r})")
    if leaked:
        pytest.fail("the test left process state changed: " + "; ".join(leaked))

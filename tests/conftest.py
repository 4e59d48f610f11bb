"""Settings for the whole suite.

Hypothesis: no per-example deadline and no too-slow health check. Both judge wall time,
and CI runs the suite once on a loaded 2-core machine, where one descheduled example must
not fail a property that holds. Examples stay random (a real counterexample should fail
CI); set HYPOTHESIS_PROFILE=default for Hypothesis's own defaults.
"""

from __future__ import annotations

import os
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

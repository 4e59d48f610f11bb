"""Settings for the whole suite.

Hypothesis: no per-example deadline and no too-slow health check. Both judge wall time,
and CI runs the suite once on a loaded 2-core machine, where one descheduled example must
not fail a property that holds. Examples stay random (a real counterexample should fail
CI); set HYPOTHESIS_PROFILE=default for Hypothesis's own defaults.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# The run fixtures (a fast job, the CLI in a child process group, finished runs) serve the
# job, history and chaos tests alike.
pytest_plugins = ["run_fixtures"]

settings.register_profile(
    "rollout-recovery", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "rollout-recovery"))

"""The composition root of ``rollout-recovery run``: config to components, the run
directory claimed and resumed, local generation servers, the summary and the plot.

:func:`run_job` is the main job; a user plugs in their own dataset, generation backend
and trainer through ``components=``.
"""

from ._components import JobComponents
from ._drain import request_stop
from ._report import RunReporter
from ._run_job import run_job

__all__ = [
    "JobComponents",
    "RunReporter",
    "request_stop",
    "run_job",
]

"""The composition root of ``rollout-recovery run``: config to components, the run
directory claimed and resumed, local generation servers, the summary and the plot.

:func:`run_job` is the main job; a user plugs in their own dataset, generation backend
and trainer through ``components=``.
"""

from ._components import (
    JobComponents,
    default_components,
    http_backend_settings,
    http_weight_sync,
)
from ._drain import StopRequest, request_stop
from ._report import RunReporter, RunSummary, render_summary, silence_closed_stdout
from ._run_job import JobResult, run_job

__all__ = [
    "JobComponents",
    "JobResult",
    "RunReporter",
    "RunSummary",
    "StopRequest",
    "default_components",
    "http_backend_settings",
    "http_weight_sync",
    "render_summary",
    "request_stop",
    "run_job",
    "silence_closed_stdout",
]

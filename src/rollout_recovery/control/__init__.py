"""The controller and the main job: pumps, retries, checkpoints, restore, audit trail.

:func:`run_job` is ``rollout-recovery run``: it claims a run directory, resumes from the
newest committed checkpoint that verifies (or starts fresh), and drives a
:class:`Controller` to the end. A user plugs in their own dataset, generation backend
and trainer through ``components=``.
"""

from ._audit import AuditTrail
from ._auditor import AuditReport, audit_run
from ._checkpoint_dir import CheckpointStore, LoadedCheckpoint, SkippedCheckpoint
from ._checkpointing import CheckpointTiming, RestoreReport
from ._config import RunConfig, config_to_toml, load_config
from ._controller import Controller, PromptDataset, RunProgress
from ._crashpoints import CRASH_POINTS, crash_point
from ._job import JobComponents, JobResult, default_components, run_job
from ._report import RunReporter, RunSummary, render_summary

__all__ = [
    "CRASH_POINTS",
    "AuditReport",
    "AuditTrail",
    "CheckpointStore",
    "CheckpointTiming",
    "Controller",
    "JobComponents",
    "JobResult",
    "LoadedCheckpoint",
    "PromptDataset",
    "RestoreReport",
    "RunConfig",
    "RunProgress",
    "RunReporter",
    "RunSummary",
    "SkippedCheckpoint",
    "audit_run",
    "config_to_toml",
    "crash_point",
    "default_components",
    "load_config",
    "render_summary",
    "run_job",
]

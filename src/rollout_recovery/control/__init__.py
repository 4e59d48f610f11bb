"""The controller: one asyncio process that owns every prompt from dataloader to trainer.

:class:`Controller` runs the pumps, deadlines, retries and drops; its persisted state is
one :class:`ControllerState`. :func:`take_checkpoint` and :func:`restore_controller`
capture and restore one consistent cut of it with the ledger, the replay index and the
trainer. The run config (:class:`RunConfig`) is the tree of every component's section.
"""

from ._checkpointing import (
    CheckpointTiming,
    ControllerCheckpoints,
    RestoreReport,
)
from ._config import RunConfig, load_config
from ._controller import Controller, DrainReport, PromptDataset, RunProgress

__all__ = [
    "CheckpointTiming",
    "Controller",
    "ControllerCheckpoints",
    "DrainReport",
    "PromptDataset",
    "RestoreReport",
    "RunConfig",
    "RunProgress",
    "load_config",
]

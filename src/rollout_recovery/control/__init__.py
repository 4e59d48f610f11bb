"""The controller: one asyncio process that owns every prompt from dataloader to trainer.

:class:`Controller` runs the pumps, deadlines, retries and drops; its persisted state is
one :class:`ControllerState`. :func:`take_checkpoint` and :func:`restore_controller`
capture and restore one consistent cut of it with the ledger, the replay index and the
trainer. The run config (:class:`RunConfig`) is the tree of every component's section.
"""

from ._backends import BACKENDS
from ._checkpointing import ControllerCheckpoints
from ._config import RunConfig, load_config
from ._controller import Controller, PromptDataset
from ._recorded import RecordedRun

__all__ = [
    "BACKENDS",
    "Controller",
    "ControllerCheckpoints",
    "PromptDataset",
    "RecordedRun",
    "RunConfig",
    "load_config",
]

"""The controller: one asyncio process that owns every prompt from dataloader to trainer.

:class:`Controller` runs the pumps, deadlines, retries and drops; its persisted state is
one :class:`ControllerState`. Its collaborator ``ControllerCheckpoints``
(``controller.checkpoints``) captures and restores one consistent cut of it with the
ledger, the replay index and the trainer; the controller applies what it returns
(``Controller.checkpoint``, ``Controller.restore``). The run config (:class:`RunConfig`)
is the tree of every component's section.
"""

from ._backends import BACKENDS
from ._config import RunConfig, load_config
from ._controller import Controller, PromptDataset
from ._recorded import RecordedRun

__all__ = [
    "BACKENDS",
    "Controller",
    "PromptDataset",
    "RecordedRun",
    "RunConfig",
    "load_config",
]

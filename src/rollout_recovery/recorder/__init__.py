"""The recorder: the journal, snapshots and restores of a run, for a loop we do not own.

A foreign trainer (TRL's ``GRPOTrainer``, verl's agent loops; ``adapters/``) calls
:class:`Recorder` from inside its own loop: take a prompt under its dataset identity,
stage model calls, seal siblings (durable before the call returns), mark rows trained and
its checkpoints saved. It writes the controller's history through the controller's one
transition per record, so ``rollout-recovery audit``, ``journal`` and ``inspect`` work on
its run directories unchanged. :class:`StagedCall` and :class:`SiblingOutput` are what a
caller hands it.
"""

from ._recorder import Recorder
from ._values import SiblingOutput, StagedCall

__all__ = ["Recorder", "SiblingOutput", "StagedCall"]

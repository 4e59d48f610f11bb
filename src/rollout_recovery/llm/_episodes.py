"""The episodes the LLM job's backends run: one type for both tasks' episode sets."""

from __future__ import annotations

from typing import TypeAlias

from ._dataset_task import DatasetEpisodes
from ._emit_task import EmitTokenEpisodes

__all__ = ["Episodes"]

#: What ``TransformersBackend`` and the HTTP backend run (``rollout.EpisodeTask``s).
Episodes: TypeAlias = EmitTokenEpisodes | DatasetEpisodes

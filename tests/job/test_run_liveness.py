"""A stuck trainer step fails the run with an error naming what it waited for, and how
long, instead of hanging it (issue 9, liveness)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from rollout_recovery.control import RunConfig
from rollout_recovery.dataplane import DataPlane
from rollout_recovery.errors import LivenessError
from rollout_recovery.job import JobComponents, run_job
from rollout_recovery.job._components import default_components
from rollout_recovery.policy import TrainSample


class _StuckTrainer:
    """Delegates to the real trainer but never returns from ``train_step`` until released."""

    def __init__(self, inner: Any, release: threading.Event) -> None:
        self._inner = inner
        self._release = release

    @property
    def weight_version(self) -> int:
        return int(self._inner.weight_version)

    def weights(self) -> object:
        return self._inner.weights()

    def train_step(self, samples: Sequence[TrainSample], *, version: int) -> dict[str, float]:
        self._release.wait()  # stuck until the test ends (no timeout: that is the point)
        return dict(self._inner.train_step(samples))

    def state(self) -> dict[str, npt.NDArray[Any]]:
        return dict(self._inner.state())

    def load_state(self, state: Mapping[str, npt.NDArray[np.generic]]) -> None:
        self._inner.load_state(state)


@pytest.fixture
def release() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()  # let the abandoned trainer thread finish


def test_a_stuck_trainer_step_fails_the_run_naming_it(
    tmp_path: Path,
    fast_config: Callable[..., RunConfig],
    release: threading.Event,
) -> None:
    config = fast_config({"liveness": {"train_step_timeout_s": 0.3}})

    def components(config: RunConfig, data_plane: DataPlane) -> JobComponents:
        parts = default_components(config, data_plane)
        parts.trainer = _StuckTrainer(parts.trainer, release)
        return parts

    with pytest.raises(LivenessError) as raised:
        run_job(tmp_path / "run", config, components=components)
    assert raised.value.waited_for == "trainer step 0"
    assert raised.value.seconds == 0.3
    assert "gave up waiting for trainer step 0 after 0.3 s" in str(raised.value)

"""An MLflow run in the local file store ``DIR/mlflow`` (tracking URI ``file:``).

One MLflow run per job: its id is kept in ``DIR/mlflow/rollout-recovery-sink.json``; a
restart reopens it (status back to RUNNING) and ``close`` marks it FINISHED. A killed
session leaves it RUNNING until the next one.

MLflow keeps every point it is given: a second ``(key, step)`` is stored beside the first
(``get_metric_history`` returns both, the UI draws both), never overwrites it. So the sink
never logs a ``(key, step)`` the run already holds: at open it reads each key's highest
step from the store, and a re-trained step at or below it is not logged for that key. The
store is written synchronously, so what it holds is exactly what was logged (a kill in
the middle of a step leaves that step's remaining keys to the next session). After a
restore to S, steps S..H keep the values the rolled-back attempt logged; ``metrics.jsonl``
and TensorBoard have the re-trained ones.

A step's sample completions are the artifact ``samples/step_<NNNNNN>.json`` (the run's
Artifacts tab shows it; a re-trained step's replaces the rolled-back one's). The job's
config is the run's parameters (``section.field``), logged once: MLflow refuses to change
a parameter, so a resume that changed an operational setting records the new value as
the tag ``rollout_recovery.config.<key>``.

Markers are metrics at their own step: ``markers/<kind>/count`` = 1 and
``markers/<kind>/<field>`` (several at one step are kept side by side, as MLflow does). A
restore also sets the run tags ``rollout_recovery.restarts`` (how many) and
``rollout_recovery.restart.<n>`` (its text), shown on the run's page.

MLflow 3 refuses the file store unless ``MLFLOW_ALLOW_FILE_STORE`` is true ("maintenance
mode"; a database store needs SQLAlchemy, which ``mlflow-skinny`` does not bring): the
sink sets it for this process when it is unset. To browse: ``MLFLOW_ALLOW_FILE_STORE=true
mlflow ui --backend-store-uri DIR/mlflow`` (the full ``mlflow`` package has the UI).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from .._lifecycle import Resource
from ..errors import ClosedResourceError
from ._extras import require
from ._markers import marker_scalars, marker_text
from ._protocol import MarkerField, Sample, Scalar
from ._run_state import SinkRunState, load_state, save_state
from ._samples import SAMPLE_COLUMNS, sample_table

__all__ = ["MLFLOW_DIR", "MlflowSink"]

MLFLOW_DIR: Final = "mlflow"
_BATCH: Final = 1000  # MLflow's limit of metrics per log_batch
_PARAMS_BATCH: Final = 100  # and of parameters
_MAX_PARAM: Final = 6000  # characters of a parameter's value
_RESTARTS_TAG: Final = "rollout_recovery.restarts"


class MlflowSink(Resource):
    """Logs each step's values as MLflow metrics at ``step`` = the training step."""

    __slots__ = ("_Metric", "_client", "_high_water", "_restarts", "_run_id")

    def __init__(
        self,
        run_dir: Path,
        *,
        resume_step: int,
        experiment: str,
        run_name: str,
        job_config: Mapping[str, object] | None = None,
    ) -> None:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        tracking: Any = require("mlflow", "mlflow.tracking")
        entities: Any = require("mlflow", "mlflow.entities")
        self._Metric = entities.Metric
        store = run_dir / MLFLOW_DIR
        store.mkdir(exist_ok=True)
        client = tracking.MlflowClient(tracking_uri=store.resolve().as_uri())
        state = load_state(store)
        if state is None:
            found = client.get_experiment_by_name(experiment)
            experiment_id = (
                found.experiment_id if found is not None else client.create_experiment(experiment)
            )
            run = client.create_run(experiment_id, run_name=run_name)
            save_state(store, SinkRunState(run_id=run.info.run_id))
        else:
            run = client.get_run(state.run_id)
            client.update_run(state.run_id, status="RUNNING")
        self._run_id: str = run.info.run_id
        self._high_water: dict[str, int] = {
            key: max(point.step for point in client.get_metric_history(self._run_id, key))
            for key in run.data.metrics
        }
        self._restarts = int(run.data.tags.get(_RESTARTS_TAG, "0"))
        self._client: Any = client
        if job_config:
            self._log_params(entities.Param, dict(run.data.params), job_config)

    def _log_params(
        self, param: Any, held: Mapping[str, str], job_config: Mapping[str, object]
    ) -> None:
        client = self._live()
        new = []
        for key, value in job_config.items():
            text = str(value)[:_MAX_PARAM]
            if key not in held:
                new.append(param(key, text))
            elif held[key] != text:
                client.set_tag(self._run_id, f"rollout_recovery.config.{key}", text)
        for start in range(0, len(new), _PARAMS_BATCH):
            client.log_batch(self._run_id, params=new[start : start + _PARAMS_BATCH])

    @property
    def run_id(self) -> str:
        return self._run_id

    def _live(self) -> Any:
        if self._client is None:
            raise ClosedResourceError("mlflow sink is closed")
        return self._client

    def _log(self, step: int, values: Mapping[str, Scalar], *, skip_held: bool) -> None:
        client = self._live()
        stamp = int(time.time() * 1000)
        points = [
            self._Metric(key, float(value), stamp, step)
            for key, value in values.items()
            if value is not None and not (skip_held and step <= self._high_water.get(key, -1))
        ]
        for start in range(0, len(points), _BATCH):
            client.log_batch(self._run_id, metrics=points[start : start + _BATCH])

    def log_step(self, step: int, values: Mapping[str, Scalar]) -> None:
        self._log(step, values, skip_held=True)

    def log_marker(self, step: int, kind: str, fields: Mapping[str, MarkerField]) -> None:
        self._log(step, marker_scalars(kind, fields), skip_held=False)
        if kind == "restored":
            self._restarts += 1
            client = self._live()
            client.set_tag(self._run_id, _RESTARTS_TAG, str(self._restarts))
            client.set_tag(
                self._run_id,
                f"rollout_recovery.restart.{self._restarts}",
                marker_text(step, kind, fields),
            )

    def log_samples(self, step: int, samples: Sequence[Sample]) -> None:
        table = {
            "step": step,
            "columns": list(SAMPLE_COLUMNS),
            "data": sample_table(samples),
            "samples": [dict(sample) for sample in samples],
        }
        self._live().log_dict(self._run_id, table, f"samples/step_{step:06d}.json")

    def flush(self) -> None:
        self._live()  # every call above is on disk when it returns

    def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            client.set_terminated(self._run_id, "FINISHED")

"""``rollout-recovery export DIR OUT``: a run's trained model as a Hugging Face directory."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..control import load_config
from ..errors import CheckpointDirectoryError, ConfigError, InvalidStateError
from ..rundir import CheckpointStore, RunDirectory

__all__ = ["export"]


@click.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option(
    "--step",
    type=click.IntRange(min=0),
    help="Export the checkpoint at this step (DIR/checkpoints/step_NNNNNN, taken after "
    "steps 0 to N-1); default: the newest.",
)
@click.option(
    "--dtype",
    type=click.Choice(["float32", "bfloat16", "float16"]),
    default="float32",
    show_default=True,
    help="The weights' dtype: float32 is the checkpoint's master weights bit for bit.",
)
def export(run_dir: Path, out: Path, step: int | None, dtype: str) -> None:
    """Write the model a torch job trained as a Hugging Face model directory OUT
    (config.json, model.safetensors, the tokenizer, the generation config), which
    transformers' AutoModelForCausalLM.from_pretrained and `vllm serve` load.

    Reads a committed checkpoint (verified against its manifest) under the store's shared
    lock: safe on a live run. Exit status 0, or 2 naming what is wrong.
    """
    run = RunDirectory(run_dir)
    try:
        if not run.job_file.is_file():
            raise ConfigError(f"{run_dir} is not a rollout-recovery run directory (no job.toml)")
        config = load_config(run.job_file)
        if config.trainer.kind != "torch":
            raise ConfigError(
                f"{run_dir} trains the {config.trainer.kind} policy, which is no Hugging Face "
                'model: export is for [trainer] kind = "torch" runs'
            )
        store = CheckpointStore(run.root, keep=1)
        with store.reading():
            committed = store.committed()
            chosen = [c for c in committed if step is None or c.step == step][:1]
            if not chosen:
                steps = ", ".join(str(c.step) for c in committed) or "none"
                raise ConfigError(
                    f"{run_dir} has no committed checkpoint at step {step} (it has: {steps})"
                    if step is not None
                    else f"{run_dir} has no committed checkpoint yet"
                )
            loaded = store.load(chosen[0])
        written = config.model.export(loaded.files, out, dtype=dtype, log=click.echo)
    except (ConfigError, CheckpointDirectoryError, InvalidStateError) as error:
        click.echo(f"rollout-recovery export: {error}", err=True)
        sys.exit(2)
    click.echo(
        f"exported checkpoint {loaded.name} (the weights after {loaded.step} trained steps) "
        f"to {written}\n"
        f"load it with: AutoModelForCausalLM.from_pretrained({str(written)!r}), or serve it: "
        f"vllm serve {written}"
    )

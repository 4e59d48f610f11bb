"""Build the tiny random Llama that the vLLM integration tests serve.

Runs inside the vLLM venv (it needs ``torch``, ``transformers`` and ``tokenizers``, which the
project itself does not depend on)::

    python tools/vllm/build_tiny_model.py OUTPUT_DIR [--dtype float32] [--seed S] [--vocab-size V]

The model and tokenizer are made by ``rollout_recovery/llm/_tiny_llama.py`` (the LLM
trainer's tests build the same model in fp32 from the same seed). The project is not
installed in the vLLM venv, so that module is loaded by its path: it imports nothing from
the project. Defaults: a 2-layer Llama (vocab 333, hidden 128, 2 heads, 1 KV head, head_dim
64, tied embeddings, bf16, about 338k parameters, seed 1234) and a byte-level BPE tokenizer
trained on a few local sentences.

Idempotent: an OUTPUT_DIR that already holds the complete model of the same spec is left
alone. The model is written to a sibling temporary directory and renamed into place, so an
interrupted build never leaves a half-written model that a later run would take as complete.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BUILDER = Path(__file__).resolve().parents[2] / "src/rollout_recovery/llm/_tiny_llama.py"


def load_builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tiny_llama_builder", BUILDER)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load the builder from {BUILDER}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir", type=Path)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--vocab-size", type=int, default=333)
    args = parser.parse_args(argv)
    out: Path = args.output_dir.expanduser().resolve()
    builder = load_builder()
    spec = builder.TinyLlamaSpec(dtype=args.dtype, seed=args.seed, vocab_size=args.vocab_size)
    if builder.is_complete(out, spec):
        print(f"tiny Llama already in {out}; skipping")
        return 0
    n_params = builder.build_tiny_llama(out, spec)
    print(f"built tiny Llama ({n_params} parameters) in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

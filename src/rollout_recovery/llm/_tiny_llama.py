"""A tiny random Llama and its tokenizer, built locally from a seed (no model hub).

The machine that runs the tests reaches no model hub, so the model is made here from a
config: by default a 2-layer Llama (vocab 333, hidden 128, 2 heads, 1 KV head, head_dim 64,
tied embeddings, about 338k parameters) with random weights from a fixed seed, and a
byte-level BPE tokenizer trained on a few local sentences. Its outputs are meaningless until
it is trained; what it gives is a real transformers model with real token ids and logprobs
that loads in milliseconds and takes a GRPO step in tens of milliseconds on one CPU core.

Two users: the LLM trainer's tests and examples (fp32), and ``tools/vllm/build_tiny_model.py``,
which builds the bf16 model the vLLM integration tests serve. That script runs inside the
vLLM venv where this project is not installed and loads this file by its path, so this
module imports nothing from the project at import time and nothing heavy until
:func:`build_tiny_llama` runs. The same ``TinyLlamaSpec`` always writes byte-identical files
(the vLLM fixtures recorded from the default model stay reproducible).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

try:  # the project's error classes; a bare ValueError when loaded by path (see above)
    from ..errors import InvalidArgumentError
except ImportError:  # pragma: no cover - only inside the vLLM venv
    InvalidArgumentError = ValueError  # type: ignore[misc,assignment]

__all__ = [
    "REQUIRED_FILES",
    "SPECIAL_TOKENS",
    "SPEC_FILE",
    "TinyLlamaSpec",
    "build_tiny_llama",
    "is_complete",
]

# Special tokens first, so their ids are fixed and small: <s>=0 </s>=1 <pad>=2
# <|im_start|>=3 <|im_end|>=4. Tests rely on 0 and 1 being BOS and EOS.
SPECIAL_TOKENS: tuple[str, ...] = ("<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>")

# A byte-level BPE needs its 256 byte symbols and the special tokens before any merge.
_MIN_VOCAB = 256 + len(SPECIAL_TOKENS)

# ChatML, so /v1/chat/completions and /tokenize with messages render like the Qwen-style
# templates that RL recipes use.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# A few local sentences: enough byte-pair merges to fill the default vocabulary (256 byte
# symbols + 5 special tokens + merges), and nothing fetched from anywhere.
CORPUS: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog.",
    "A rollout is a sampled completion of a prompt by the current policy.",
    "Each prompt group holds several generations that share one prompt.",
    "The trainer computes group relative advantages from the rewards.",
    "Tokens in, tokens out: never re-render the history of a conversation.",
    "The ledger records which worker owns which prompt group and when.",
    "A checkpoint must be consistent with the data plane and the ledger.",
    "What is two plus two? Two plus two is four.",
    "The assistant answers the user politely and briefly.",
    "Weights are updated between steps; every token carries its policy version.",
    "Servers crash, requests time out, and the recovery logic must cope.",
    "Hello, world! How are you today? I am fine, thank you.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20.",
    "system user assistant tool function call result answer question",
)

REQUIRED_FILES: tuple[str, ...] = ("config.json", "model.safetensors", "tokenizer.json")
# What was built, so a cached directory built from another spec is not taken for this one.
SPEC_FILE = "tiny_llama_spec.json"

_DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True, slots=True, kw_only=True)
class TinyLlamaSpec:
    """What to build. The defaults are the model the vLLM integration tests serve.

    ``dtype`` is the dtype the weights are stored in; they are always initialised in fp32
    from ``seed`` and then cast, so the bf16 and fp32 builds of one seed are the same model
    up to rounding. The tokenizer's vocabulary is at most ``vocab_size`` (the corpus may not
    yield enough merges for a larger one); the model's is exactly ``vocab_size``.
    """

    vocab_size: int = 333
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim: int = 64
    max_position_embeddings: int = 512
    dtype: str = "bfloat16"
    seed: int = 1234

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if name == "dtype":
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidArgumentError(f"{name} must be an int, got {value!r}")
            if value < (0 if name == "seed" else 1):
                raise InvalidArgumentError(f"{name} must be positive, got {value!r}")
        if self.vocab_size < _MIN_VOCAB:
            raise InvalidArgumentError(
                f"vocab_size must be >= {_MIN_VOCAB} (256 bytes + {len(SPECIAL_TOKENS)} "
                f"special tokens), got {self.vocab_size!r}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise InvalidArgumentError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.dtype not in _DTYPES:
            raise InvalidArgumentError(f"dtype must be one of {_DTYPES}, got {self.dtype!r}")


def _spec_text(spec: TinyLlamaSpec) -> str:
    return json.dumps(asdict(spec), indent=2, sort_keys=True) + "\n"


def is_complete(out: Path, spec: TinyLlamaSpec | None = None) -> bool:
    """Whether ``out`` already holds the full model of ``spec`` (the idempotence check)."""
    if not all((out / name).is_file() for name in REQUIRED_FILES):
        return False
    try:
        return (out / SPEC_FILE).read_text() == _spec_text(spec or TinyLlamaSpec())
    except OSError:
        return False


@contextmanager
def _quiet_progress() -> Iterator[None]:
    """transformers' own progress bars off ("Writing model shards" of a one-shard model
    printed before the run's first line of output), then back as they were."""
    from transformers.utils import logging as transformers_logging

    # Typed handles: transformers leaves these unannotated.
    disable: Callable[[], None] = transformers_logging.disable_progress_bar
    enable: Callable[[], None] = transformers_logging.enable_progress_bar
    was_enabled = transformers_logging.is_progress_bar_enabled()
    disable()
    try:
        yield
    finally:
        if was_enabled:
            enable()


def build_tiny_llama(out: Path, spec: TinyLlamaSpec | None = None) -> int:
    """Write the model (config, safetensors, tokenizer) to ``out``; returns its parameter count.

    The files are written to a sibling temporary directory that is renamed into place, so
    an interrupted build never leaves a half-written model that a later run would take as
    complete. An existing ``out`` is replaced.
    """
    spec = spec or TinyLlamaSpec()
    # Imported here so the module loads (and --help works) without torch.
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    # Repeated so every merge clears min_frequency and the vocabulary fills up.
    bpe.train_from_iterator(
        list(CORPUS) * 8,
        vocab_size=spec.vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
    )
    for i, tok in enumerate(SPECIAL_TOKENS):
        if bpe.token_to_id(tok) != i:  # pragma: no cover - a tokenizers behaviour change
            raise InvalidArgumentError(f"special token {tok!r} did not get id {i}")
    if bpe.get_vocab_size() > spec.vocab_size:  # pragma: no cover - idem
        raise InvalidArgumentError(
            f"tokenizer vocab {bpe.get_vocab_size()} exceeds {spec.vocab_size}"
        )

    # Typed handles: transformers leaves these constructors unannotated.
    make_tokenizer: Callable[..., Any] = PreTrainedTokenizerFast
    make_model: Callable[..., Any] = LlamaForCausalLM
    tokenizer = make_tokenizer(
        tokenizer_object=bpe._tokenizer,  # the underlying tokenizers.Tokenizer
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=spec.max_position_embeddings,
    )
    tokenizer.chat_template = CHAT_TEMPLATE

    config = LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        dtype=spec.dtype,
    )
    # The global RNG is what transformers' initialisers draw from; fork_rng keeps the
    # caller's RNG state as it was (a test building a model must not reseed the process).
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = make_model(config)
    model = model.to(getattr(torch, spec.dtype))
    model.train(False)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        with _quiet_progress():
            model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / SPEC_FILE).write_text(_spec_text(spec))
        tmp.chmod(0o755)  # mkdtemp makes it 0700; the model is not a secret
        if out.exists():  # a partial leftover from an older, non-atomic build
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sum(p.numel() for p in model.parameters())

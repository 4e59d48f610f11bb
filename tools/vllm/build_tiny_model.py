"""Build the tiny random Llama that the vLLM integration tests serve.

Runs inside the vLLM venv (it needs ``torch``, ``transformers`` and ``tokenizers``, which the
project itself does not depend on)::

    python tools/vllm/build_tiny_model.py OUTPUT_DIR

The machine reaches no model hub, so the model is made here from a config: a 2-layer Llama
(vocab 333, hidden 128, 2 heads, 1 KV head, head_dim 64, tied embeddings, bf16, about 338k
parameters) with random weights from a fixed seed, and a byte-level BPE tokenizer trained on a
few local sentences. Its outputs are meaningless; what the tests need is a real vLLM engine with
real token ids, logprobs and wire formats, and a model that loads in seconds.

Idempotent: an OUTPUT_DIR that already holds a complete model is left alone. The model is
written to a sibling temporary directory and renamed into place, so an interrupted build never
leaves a half-written model that a later run would take as complete.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

# Special tokens first, so their ids are fixed and small: <s>=0 </s>=1 <pad>=2
# <|im_start|>=3 <|im_end|>=4. Tests rely on 0 and 1 being BOS and EOS.
SPECIAL_TOKENS: list[str] = ["<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 333
SEED = 1234

# ChatML, so /v1/chat/completions and /tokenize with messages render like the Qwen-style
# templates that RL recipes use.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# A few local sentences: enough byte-pair merges to fill the vocabulary (256 byte symbols + 5
# special tokens + merges), and nothing fetched from anywhere.
CORPUS: list[str] = [
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
]

REQUIRED_FILES: tuple[str, ...] = ("config.json", "model.safetensors", "tokenizer.json")


def is_complete(out: Path) -> bool:
    """Whether OUTPUT_DIR already holds a full model (the idempotence check)."""
    return all((out / name).is_file() for name in REQUIRED_FILES)


def build(out: Path) -> None:
    # Imported here so ``--help`` and the idempotent fast path work without torch.
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    # Repeated so every merge clears min_frequency and the vocabulary fills up to 333.
    bpe.train_from_iterator(
        CORPUS * 8,
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
    )
    for i, tok in enumerate(SPECIAL_TOKENS):
        if bpe.token_to_id(tok) != i:
            raise SystemExit(f"special token {tok!r} did not get id {i}")
    if bpe.get_vocab_size() > VOCAB_SIZE:
        raise SystemExit(f"tokenizer vocab {bpe.get_vocab_size()} exceeds {VOCAB_SIZE}")

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer,  # the underlying tokenizers.Tokenizer
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=512,
    )
    tokenizer.chat_template = CHAT_TEMPLATE

    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        torch_dtype="bfloat16",
    )
    # A fixed seed: the same weights on every machine, so sampled tokens recorded in
    # tests/fixtures/vllm stay reproducible for the same seed and server version.
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.eval()

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it 0700; the model is not a secret
        if out.exists():  # a partial leftover from an older, non-atomic build
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    n_params = sum(p.numel() for p in model.parameters())
    print(f"built tiny Llama ({n_params} parameters) in {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir", type=Path)
    args = parser.parse_args(argv)
    out: Path = args.output_dir.expanduser().resolve()
    if is_complete(out):
        print(f"tiny Llama already in {out}; skipping")
        return 0
    build(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

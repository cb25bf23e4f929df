"""Quality gate: run the same sample under two LLM engine configs and report how well they agree.

Typical use: before a full run with ``quantization: fp8``, compare it with the bf16 baseline on a sample of
500 rows (``batch-worker quality-gate``). The report (``RunLayout.quality_report_uri``,
``<run_dir>/quality_gate.json``) holds, over the rows both configs turned into a valid result:

* ``exact_match_rate``: share of rows whose outputs are identical (canonical JSON with a schema, else text);
* ``field_agreement``: per top-level JSON field, share of rows where both give the same value (schema runs);
* ``text_similarity_mean`` / ``_p10`` / ``_min``: ``difflib.SequenceMatcher`` ratio of the output texts
  (0..1, 1 = identical), for free text;
* validity of each side (rows dead-lettered, e.g. ``invalid_output``) and output tokens per row.

``agreement`` is the headline figure the gate compares with ``min_agreement``: the mean field agreement
for JSON outputs, the mean text similarity for free text. The comparison functions are pure (no vLLM,
:mod:`batch_contract.agreement`, shared with the upgrade canary); :func:`run_quality_gate` drives two :class:`~batch_worker.engines.llm.LLMEngine` s one after the other.

The sample is deterministic: the first ``ceil(sample / shards)`` valid rows of every shard, in manifest
order, cut to ``sample`` rows.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from batch_contract import storage
from batch_contract.agreement import (
    DEFAULT_MAX_VALIDITY_DROP,
    RowResult,
    compare,
    gate_passed,
    text_similarity,
)
from batch_contract.engine_config import ConfigError
from batch_contract.enums import EngineKind
from batch_contract.jsonutil import pretty_json
from batch_contract.llm_config import LLMConfig
from batch_contract.manifest import Manifest
from batch_contract.runstore import RunStore

from batch_worker.prompting import template_columns

log = logging.getLogger(__name__)

DEFAULT_SAMPLE = 500
"""Rows per comparison (the batch-inference guide's 500-row check)."""
DEFAULT_MIN_AGREEMENT = 0.9
"""Default threshold on the report's ``agreement``."""
# The comparison itself (RowResult, text_similarity, compare, gate_passed, DEFAULT_MAX_VALIDITY_DROP) lives in
# batch_contract.agreement, shared with the upgrade canary on the Airflow side; re-exported here.


def merged_engine(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` engine dict with ``overrides`` applied, validated as an :class:`LLMConfig` dict.

    Raises:
        ConfigError: the result is not a valid LLM config, or ``overrides`` changes ``kind``.
    """
    if overrides.get("kind", EngineKind.LLM.value) != EngineKind.LLM.value:
        raise ConfigError("quality-gate: engine overrides must keep kind 'llm'")
    merged = {**base, **overrides}
    return LLMConfig.from_dict(merged).to_dict()


def sample_rows(manifest: Manifest, sample: int, columns: Sequence[str] = ()):
    """The deterministic sample (see the module docstring) as ``ChunkRows``, with the input columns
    ``columns`` (template fields) besides id and text.

    Raises:
        BadInputError: unreadable input (from the reader).
    """
    from batch_worker.engines.base import ChunkRows
    from batch_worker.preprocess import DocumentPool, apply_extraction
    from batch_worker.reader import iter_shard_blocks
    from batch_worker.validate import Validator, concat_rows

    per_shard = math.ceil(sample / max(1, len(manifest.shards)))
    parts: list[ChunkRows] = []
    documents = manifest.input.documents
    pool = DocumentPool(documents, manifest.input.roots) if documents is not None else None
    try:
        for spec in manifest.shards:
            validator = Validator(manifest.input.id_column, text_column=manifest.input.text_column)
            taken = 0
            for block in iter_shard_blocks(manifest.input, spec.segments, manifest.worker.read_batch_rows, columns,
                                           manifest.worker):
                rows = validator.validate(block).rows
                if pool is not None and len(rows):  # documents: their extracted text (no text: left out)
                    rows, _dead = apply_extraction(rows, pool.extract(rows.texts) or [], manifest.input.text_column)
                need = min(per_shard - taken, sample - sum(len(p) for p in parts))
                if need <= 0:
                    break
                parts.append(rows.take(list(range(min(need, len(rows))))))
                taken += len(parts[-1])
            if sum(len(p) for p in parts) >= sample:
                break
    finally:
        if pool is not None:
            pool.close()
    return concat_rows(parts)


def run_config(engine_dict: Mapping[str, Any], rows: Any, settings: Any) -> tuple[dict[str, RowResult], dict]:
    """Run one LLM config over ``rows`` (load, prepare, generate, close).

    Returns:
        ``({row id: RowResult}, engine info)``.
    """
    from batch_worker.engines.llm import LLMEngine

    engine = LLMEngine(LLMConfig.from_dict(dict(engine_dict)), settings)
    try:
        info = dict(engine.load().info)
        out = engine.process(engine.prepare(rows), lambda: False)
    finally:
        engine.close()
    results = {
        r["id"]: RowResult(True, r["output_text"] or "", r["output_json"], int(r["output_tokens"] or 0))
        for r in out.table.to_pylist()
    }
    for reject in out.rejects:
        results[reject.id] = RowResult(False, reason=reject.reason.value)
    return results, info


def run_quality_gate(
    run_dir: str,
    candidate: Mapping[str, Any],
    baseline: Mapping[str, Any] | None = None,
    sample: int = DEFAULT_SAMPLE,
    min_agreement: float = DEFAULT_MIN_AGREEMENT,
) -> dict[str, Any]:
    """Compare two engine configs on a sample of the run's input and write the report.

    Args:
        run_dir: ``<output_root>/runs/<run_id>`` holding ``manifest.json`` (engine kind ``llm``).
        candidate: overrides applied to the manifest's engine for the candidate (e.g. ``{"quantization": "fp8"}``).
        baseline: overrides for the baseline (default none: the manifest's engine as planned).
        sample: rows to compare (>= 1).
        min_agreement: threshold on ``agreement`` for ``passed``.

    Returns:
        The report dict (also written to ``RunLayout.quality_report_uri``).

    Raises:
        ConfigError: not an LLM run, bad overrides, ``sample < 1`` or ``min_agreement`` outside [0, 1].
    """
    if sample < 1:
        raise ConfigError(f"quality-gate --sample: {sample} must be >= 1")
    if not 0.0 <= min_agreement <= 1.0:
        raise ConfigError(f"quality-gate --min-agreement: {min_agreement} is outside [0, 1]")
    store = RunStore.open(run_dir)
    layout, manifest = store.layout, store.manifest
    if manifest.engine_config.kind != EngineKind.LLM.value:
        raise ConfigError(f"quality-gate: run {manifest.run_id} has engine kind {manifest.engine_config.kind!r}, "
                          "not 'llm'")
    base_engine = merged_engine(manifest.engine, baseline or {})
    cand_engine = merged_engine(manifest.engine, candidate)
    columns = sorted({c for e in (base_engine, cand_engine) for c in template_columns(LLMConfig.from_dict(e))})
    rows = sample_rows(manifest, sample, columns)
    log.info("quality gate: %d sample rows, baseline then candidate", len(rows))
    base_results, base_info = run_config(base_engine, rows, manifest.worker)
    cand_results, cand_info = run_config(cand_engine, rows, manifest.worker)
    figures = compare(base_results, cand_results)
    report = {
        "run_id": manifest.run_id,
        "sample_requested": sample,
        "baseline_overrides": dict(baseline or {}),
        "candidate_overrides": dict(candidate),
        "baseline_engine": base_info,
        "candidate_engine": cand_info,
        "min_agreement": min_agreement,
        **figures,
        "max_validity_drop": DEFAULT_MAX_VALIDITY_DROP,
        "passed": gate_passed(figures, min_agreement),
    }
    storage.write_replace(layout.quality_report_uri, pretty_json(report))
    log.info("quality gate %s: agreement %s (min %s), report %s", "passed" if report["passed"] else "FAILED",
             figures["agreement"], min_agreement, layout.quality_report_uri)
    return report


def parse_overrides(text: str, flag: str) -> dict[str, Any]:
    """Parse a JSON object given on the command line.

    Raises:
        ConfigError: not JSON or not an object (names ``flag``).
    """
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{flag}: not JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{flag}: must be a JSON object of engine fields, e.g. '{{\"quantization\": \"fp8\"}}'")
    return value


QUALITY_GATE_EPILOG = """examples:
  batch-worker quality-gate --run-dir out/runs/R --candidate-engine '{"quantization": "fp8"}'
  batch-worker quality-gate --run-dir out/runs/R --baseline-engine '{"dtype": "bfloat16"}' \\
      --candidate-engine '{"dtype": "bfloat16", "quantization": "fp8"}' --sample 500 --enforce

writes <run-dir>/quality_gate.json; exit codes: 0 report written (and passed, with --enforce),
  2 bad config/input, or agreement below --min-agreement with --enforce (no retry can fix it), 1 other error
"""


def add_parser(subparsers: Any) -> None:
    """Add the ``quality-gate`` subcommand to the ``batch-worker`` argument parser."""
    import argparse

    qg = subparsers.add_parser(
        "quality-gate",
        help="compare two LLM engine configs on a sample of a run's input (e.g. fp8 vs bf16)",
        description="Run the same deterministic sample of the run's input under a baseline and a candidate "
        "LLM engine config (each given as JSON overrides of the manifest's engine) and write an agreement "
        "report: exact match per JSON field, text similarity for free text, validity, output tokens.",
        epilog=QUALITY_GATE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    qg.add_argument("--run-dir", required=True, help="<output_root>/runs/<run_id> with an llm manifest")
    qg.add_argument("--candidate-engine", required=True, help="JSON object of engine fields to change, e.g. "
                    "'{\"quantization\": \"fp8\"}'")
    qg.add_argument("--baseline-engine", default="{}", help="JSON overrides for the baseline (default: the "
                    "manifest's engine unchanged)")
    qg.add_argument("--sample", type=int, default=DEFAULT_SAMPLE, help=f"rows to compare (default {DEFAULT_SAMPLE})")
    qg.add_argument("--min-agreement", type=float, default=DEFAULT_MIN_AGREEMENT,
                    help=f"threshold on the agreement figure (default {DEFAULT_MIN_AGREEMENT})")
    qg.add_argument("--enforce", action="store_true", help="exit 2 when the gate does not pass")
    qg.add_argument("--log-level", default="INFO", help="logging level (default INFO)")


def cli_main(args: Any) -> int:
    """Run the ``quality-gate`` subcommand; returns an ``ExitCode`` value."""
    from batch_contract.enums import ExitCode

    from batch_worker.errors import BadInputError

    try:
        report = run_quality_gate(
            args.run_dir,
            candidate=parse_overrides(args.candidate_engine, "--candidate-engine"),
            baseline=parse_overrides(args.baseline_engine, "--baseline-engine"),
            sample=args.sample,
            min_agreement=args.min_agreement,
        )
    except (ConfigError, BadInputError, FileNotFoundError) as exc:
        log.error("quality gate: bad config or input (exit %d): %s", int(ExitCode.BAD_INPUT), exc)
        return int(ExitCode.BAD_INPUT)
    except Exception:
        log.exception("quality gate failed (exit %d)", int(ExitCode.FAILURE))
        return int(ExitCode.FAILURE)
    if args.enforce and not report["passed"]:
        log.error("quality gate did not pass: agreement %s < %s", report["agreement"], args.min_agreement)
        return int(ExitCode.BAD_INPUT)
    return int(ExitCode.OK)


__all__ = ["DEFAULT_MAX_VALIDITY_DROP", "DEFAULT_MIN_AGREEMENT", "DEFAULT_SAMPLE", "RowResult", "compare",
           "gate_passed", "merged_engine", "parse_overrides", "run_quality_gate", "sample_rows", "text_similarity"]

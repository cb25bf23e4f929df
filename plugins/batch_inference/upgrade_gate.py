"""The upgrade canary: compare the canary's outputs with the rows a previous model published, refuse on drift.

After the canary ran (``canary_task``), :func:`check` reads the canary's committed results (the part files
it wrote into the run's shards, under its result fingerprint) and the rows the output table holds for the
same ids, through the publish backend (:func:`batch_inference.publish.backend.read_published`: DuckDB,
PostgreSQL or Iceberg alike), and compares them (:mod:`batch_contract.agreement`):

* **embeddings** (``embedding`` column): neighbour overlap@k on the sample (the primary criterion,
  ``upgrade_min_overlap``: neighbourhoods, so it holds across vector spaces) and cosine(new, old) per row
  (p5 / p50 / mean; checked against ``upgrade_min_cosine`` only when that is set, because two different
  models put their vectors in unrelated spaces: cosine means something only for a fine-tune or re-run);
* **labels** (``label``): the share of rows with the same label (``upgrade_min_agreement``);
* **LLM outputs** (``output_text`` / ``output_json``): the quality gate's comparison
  (:func:`batch_contract.agreement.compare`, old rows as the baseline, the canary's dead letters as invalid
  candidate rows) and its pass rule with ``upgrade_min_agreement``.

The result is the ``upgrade`` section of ``projection.json``; a refusal turns the projection's decision
into ``refused_upgrade`` with a message starting ``REFUSED (upgrade):`` (:func:`apply`), so the canary task
fails and no shard starts, exactly like a budget refusal. No previous publish, no id in common, or no
output column in common: the check passes and says why.

Airflow side: NumPy and pyarrow only (no torch).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from batch_contract import storage
from batch_contract.agreement import RowResult, compare, embedding_figures, gate_passed, label_agreement
from batch_contract.canary import CanaryResult
from batch_contract.layout import DEAD_LETTER_PREFIX, PART_PREFIX, join_uri
from batch_contract.runstore import RunStore

from batch_inference.params import RunConfig
from batch_inference.publish.backend import read_published
from batch_inference.run_target import publish_target

log = logging.getLogger(__name__)

OUTPUT_COLUMNS = ("embedding", "label", "output_text", "output_json")
"""Output columns the check compares (whichever the canary's parts and the live table both have)."""
MAX_COMPARED_ROWS = 2000
"""At most this many canary rows are compared (an even spread over the ids in sorted order): the
neighbour figure holds an ``(n, n)`` float64 matrix (32 MB at 2,000 rows)."""


@dataclass(frozen=True)
class Thresholds:
    """The check's limits, from the run's Params (``upgrade_*``).

    Attributes:
        min_overlap: least mean neighbour overlap@k of the embeddings (share, 0..1).
        min_cosine: least 5th percentile of cosine(new, old) per row; ``None``: reported, not checked.
        min_agreement: least label agreement / LLM agreement (share, 0..1).
    """

    min_overlap: float
    min_cosine: float | None
    min_agreement: float

    @classmethod
    def of(cls, cfg: RunConfig) -> Thresholds:
        return cls(float(cfg.upgrade_min_overlap),
                   None if cfg.upgrade_min_cosine is None else float(cfg.upgrade_min_cosine),
                   float(cfg.upgrade_min_agreement))


def canary_rows(run_dir: str, canary: CanaryResult) -> tuple[pa.Table, list[str]]:
    """The canary's committed results and dead-lettered ids.

    Reads the committed part and dead-letter files of the shards the canary wrote to
    (``canary.shard_rows``), keeping the rows of the canary's result fingerprint. Before the fan-out those
    files are the canary's own.

    Returns:
        ``(results, dead_ids)``: ``results`` has ``id`` and the part files' columns among
        :data:`OUTPUT_COLUMNS` (empty table when there are none).
    """
    store = RunStore.open(run_dir)
    parts: list[pa.Table] = []
    dead: list[str] = []
    for shard_id in sorted(canary.shard_rows):
        shard_dir = store.layout.shard_dir(shard_id)
        for name in sorted(store.committed_files(shard_id)):
            columns = ["id", "fingerprint"] + ([] if name.startswith(DEAD_LETTER_PREFIX) else list(OUTPUT_COLUMNS))
            fs, path = storage.arrow_filesystem(join_uri(shard_dir, name))
            schema_names = pq.read_schema(path, filesystem=fs).names
            table = pq.read_table(path, columns=[c for c in columns if c in schema_names], filesystem=fs)
            table = table.filter(pc.equal(table.column("fingerprint"), canary.fingerprint))
            if name.startswith(DEAD_LETTER_PREFIX):
                dead.extend(i for i in table.column("id").to_pylist() if i is not None)
            elif name.startswith(PART_PREFIX):
                parts.append(table.select(["id"] + [c for c in OUTPUT_COLUMNS if c in table.column_names]))
    if not parts:
        return pa.table({"id": pa.array([], pa.string())}), dead
    return pa.concat_tables(parts, promote_options="default"), dead


def spread(ids: Sequence[str], limit: int = MAX_COMPARED_ROWS) -> list[str]:
    """``ids`` sorted, cut to ``limit`` evenly spaced ones (all of them when they are fewer)."""
    ordered = sorted(set(ids))
    if len(ordered) <= limit:
        return ordered
    picks = np.linspace(0, len(ordered) - 1, limit).round().astype(int)
    return [ordered[i] for i in picks]


def _by_id(table: pa.Table, column: str) -> dict[str, Any]:
    return dict(zip(table.column("id").to_pylist(), table.column(column).to_pylist(), strict=True))


def _embedding_check(new: pa.Table, old: pa.Table, ids: list[str], th: Thresholds) -> tuple[dict, list[str]]:
    a, b = _by_id(new, "embedding"), _by_id(old, "embedding")
    both = [i for i in ids if a.get(i) is not None and b.get(i) is not None]
    figures = embedding_figures(np.asarray([a[i] for i in both], np.float32).reshape(len(both), -1),
                                np.asarray([b[i] for i in both], np.float32).reshape(len(both), -1))
    failed = []
    nb = figures["neighbours"]
    if nb is not None and nb["overlap"] < th.min_overlap:
        failed.append(f"neighbour overlap@{nb['k']} {nb['overlap']:.3f} < upgrade_min_overlap={th.min_overlap:g} "
                      f"(chance {nb['chance']:.3f}, {nb['rows']} rows)")
    cos = figures["cosine"]
    if cos is not None and th.min_cosine is not None and cos["p5"] < th.min_cosine:
        failed.append(f"cosine(new, old) p5 {cos['p5']:.3f} < upgrade_min_cosine={th.min_cosine:g}")
    return figures, failed


def _label_check(new: pa.Table, old: pa.Table, ids: list[str], th: Thresholds) -> tuple[dict, list[str]]:
    a, b = _by_id(new, "label"), _by_id(old, "label")
    both = [i for i in ids if i in a and i in b]
    agreement = label_agreement([a[i] for i in both], [b[i] for i in both])
    failed = []
    if agreement is not None and agreement < th.min_agreement:
        failed.append(f"label agreement {agreement:.3f} < upgrade_min_agreement={th.min_agreement:g} "
                      f"({len(both)} rows)")
    return {"rows": len(both), "agreement": agreement}, failed


def _llm_check(new: pa.Table, old: pa.Table, dead: set[str], ids: list[str],
               th: Thresholds) -> tuple[dict, list[str]]:
    def results(table: pa.Table) -> dict[str, RowResult]:
        json_col = table.column("output_json").to_pylist() if "output_json" in table.column_names else None
        texts = table.column("output_text").to_pylist() if "output_text" in table.column_names else None
        out = {}
        for n, rid in enumerate(table.column("id").to_pylist()):
            out[rid] = RowResult(True, (texts[n] if texts else None) or "", json_col[n] if json_col else None)
        return out

    baseline = {i: r for i, r in results(old).items() if i in set(ids)}
    fresh = results(new)
    candidate = {i: fresh[i] if i in fresh else RowResult(False, reason="dead_letter")
                 for i in baseline if i in fresh or i in dead}
    figures = compare(baseline, candidate)
    figures.pop("examples", None)
    failed = []
    if figures["agreement"] is not None and not gate_passed(figures, th.min_agreement):
        failed.append(f"LLM agreement {figures['agreement']:.3f} (valid {figures['candidate_valid_rate']:.3f} vs "
                      f"{figures['baseline_valid_rate']:.3f}) below upgrade_min_agreement={th.min_agreement:g} "
                      f"({figures['rows']} rows)")
    return figures, failed


def _passed(section: dict[str, Any], reason: str) -> dict[str, Any]:
    section.update(decision="passed", compared=False, message=f"upgrade check passed: {reason}")
    return section


def compare_with_published(cfg: RunConfig, run_dir: str, canary: CanaryResult, target: Any) -> dict[str, Any]:
    """The ``upgrade`` section: the canary's outputs against the live table's rows for the same ids.

    Args:
        cfg: the run's config (mode and thresholds).
        run_dir: the run directory (the canary's parts are in its shards).
        canary: the run's ``canary.json``.
        target: the run's :class:`~batch_inference.publish.target.PublishTarget`.

    Returns:
        ``{"mode", "decision" ("passed" / "refused" / "off"), "compared" (bool), "message", "thresholds",
        "table", "previous" ({"run_id", "fingerprint", "published_at"} or None), "fingerprint" (this run's),
        "rows_compared", "embedding" / "label" / "llm" (figures of the outputs compared), "failed" (the
        thresholds missed, as text)}``.

    Raises:
        The storage driver's errors (reading the live table), ``OSError`` reading the canary's parts.
    """
    th = Thresholds.of(cfg)
    section: dict[str, Any] = {"mode": cfg.upgrade_gate, "thresholds": asdict(th), "table": target.describe(),
                               "fingerprint": canary.fingerprint, "previous": None, "rows_compared": 0,
                               "failed": []}
    if cfg.upgrade_gate == "off":
        section.update(decision="off", compared=False, message="upgrade check off (upgrade_gate=off)")
        return section
    new, dead = canary_rows(run_dir, canary)
    columns = [c for c in OUTPUT_COLUMNS if c in new.column_names]
    ids = spread(new.column("id").to_pylist() + dead)
    if not ids:
        return _passed(section, "the canary committed no row to compare")
    record, old = read_published(target, ids, columns)
    if record is None:
        return _passed(section, f"{target.describe()} has no previous publish")
    section["previous"] = {"run_id": record.run_id, "fingerprint": record.fingerprint,
                           "published_at": record.published_at}
    if cfg.upgrade_gate == "auto" and record.fingerprint == canary.fingerprint:
        return _passed(section, f"{target.describe()} was published under this run's result fingerprint "
                                f"{canary.fingerprint[:12]} (same model and engine config; upgrade_gate=on compares "
                                "anyway)")
    old = old if old is not None else pa.table({"id": pa.array([], pa.string())})
    common = [c for c in columns if c in old.column_names]
    old_ids = set(old.column("id").to_pylist())
    ids = [i for i in ids if i in old_ids]
    if not ids:
        return _passed(section, f"{target.describe()} (run {record.run_id}) holds none of the canary's "
                                f"{new.num_rows + len(dead)} ids")
    if not common:
        return _passed(section, f"{target.describe()} (run {record.run_id}) has none of the canary's output "
                                f"columns {columns}")
    section["rows_compared"] = len(ids)
    failed: list[str] = []
    if "embedding" in common:
        section["embedding"], miss = _embedding_check(new, old, ids, th)
        failed += miss
    if "label" in common:
        section["label"], miss = _label_check(new, old, ids, th)
        failed += miss
    if {"output_text", "output_json"} & set(common):
        section["llm"], miss = _llm_check(new, old, set(dead), ids, th)
        failed += miss
    section.update(compared=True, failed=failed, decision="refused" if failed else "passed")
    section["message"] = _message(section, cfg, failed)
    return section


def _figures_text(section: dict[str, Any]) -> str:
    parts = []
    emb = section.get("embedding")
    if emb:
        nb, cos = emb["neighbours"], emb["cosine"]
        parts.append(f"neighbour overlap@{nb['k']} {nb['overlap']:.3f} (jaccard {nb['jaccard']:.3f}, chance "
                     f"{nb['chance']:.3f})" if nb else f"no neighbour overlap ({emb['rows']} rows: too few)")
        parts.append(f"cosine(new, old) p5/p50/mean {cos['p5']:.3f}/{cos['p50']:.3f}/{cos['mean']:.3f}" if cos
                     else f"no cosine (dimension {emb['dim_new']} vs {emb['dim_old']}: different spaces)")
    if section.get("label"):
        lab = section["label"]["agreement"]
        parts.append("label agreement " + ("-" if lab is None else f"{lab:.3f}"))
    if section.get("llm"):
        agr = section["llm"]["agreement"]
        parts.append(f"LLM agreement ({section['llm']['output_kind']}) " + ("-" if agr is None else f"{agr:.3f}"))
    return "; ".join(parts)


def _message(section: dict[str, Any], cfg: RunConfig, failed: list[str]) -> str:
    prev = section["previous"]
    what = (f"{section['rows_compared']} canary rows of model {cfg.model or '(engine default)'} (fingerprint "
            f"{section['fingerprint'][:12]}) against {section['table']} as published by run {prev['run_id']} "
            f"(fingerprint {prev['fingerprint'][:12]})")
    if not failed:
        return f"upgrade check passed: {what}: {_figures_text(section)}"
    cosine_note = "" if cfg.upgrade_min_cosine is not None else " upgrade_min_cosine is empty (cosine not checked)."
    return (f"REFUSED (upgrade): {what}: " + "; ".join(failed) + f". Figures: {_figures_text(section)}."
            f"{cosine_note} The new model's outputs disagree with the previous model's beyond the thresholds: "
            "check the model (a corrupt or wrong checkpoint, another tokenizer or pooling) before re-embedding. "
            "If the change is intended, lower the threshold (upgrade_min_overlap / upgrade_min_cosine / "
            "upgrade_min_agreement) or set upgrade_gate=off for this run. The canary's rows stay committed in "
            "this run's shards and nothing was published.")


def apply(projection: dict[str, Any], cfg: RunConfig, run_dir: str, canary: CanaryResult,
          target: Any = None) -> dict[str, Any]:
    """Run the check and record it in ``projection`` (``projection["upgrade"]``); a refusal becomes the
    projection's decision (``refused_upgrade``, whatever the budget said: a model that fails the check is
    refused at any price) and message. Logs the outcome. Returns ``projection``.

    Args:
        target: the publish target (default :func:`batch_inference.run_target.publish_target` of ``cfg``).
    """
    if target is None:
        target = publish_target(cfg)
    section = compare_with_published(cfg, run_dir, canary, target)
    projection["upgrade"] = section
    log.info("%s", section["message"])
    if section["decision"] == "refused":
        projection["decision"] = "refused_upgrade"
        projection["message"] = section["message"]
    return projection


__all__ = ["MAX_COMPARED_ROWS", "OUTPUT_COLUMNS", "Thresholds", "apply", "canary_rows", "compare_with_published",
           "spread"]

"""An independent reference check of a run's ``report.json``: :func:`check_report`.

The check never imports ``batch_inference.report`` (nor ``batch_contract``): it reads the run directory's
files directly (``json`` for the manifest, the markers and the attempt records, ``pyarrow`` for the id
columns of the committed files) and re-implements the documented formulas itself, so a bug in the
report code cannot hide behind the same bug in the check. Sources and formulas are those of
``docs/cost-report.md`` ("Where each number comes from", "Cost model") and ``plugins/batch_inference/pricing.py``.

What is checked
===============

1. **Schema.** The report dict is validated with ``jsonschema`` against
   ``plugins/batch_inference/report/report.schema.json``, with the validator class of the draft the schema
   declares in ``$schema`` (2020-12); every error is reported, not only the first.

2. **Identity.** ``run_id`` is the run directory's name; ``uris.report_json`` / ``uris.run_dir`` name this
   run; ``shards_total`` / ``shards_complete`` / ``shards_missing`` and ``complete`` follow the manifest's
   shard ids and the ``shards/<id>/_SUCCESS.json`` markers present.

3. **Rows (exact).** From ``manifest.json``: ``rows_input = sum(row_stop - row_start)`` over every
   shard's segments. From the markers: ``rows_ok``, ``rows_dead_letter``, ``rows_truncated``,
   ``rows_reused`` summed over the manifest's shards that have a marker. Each marker is first checked
   against its own shard: ``rows_input`` equals the manifest's shard size, ``rows_ok + rows_dead_letter
   == rows_input``, ``rows_ok`` equals the distinct ids in the part files the marker lists and
   ``rows_dead_letter`` the distinct ``(source_uri, source_row)`` in the dead-letter files it lists (read
   with pyarrow; the file check applies to the files a marker lists). Then:

   * ``rows_published`` = the publish summary's ``rows_published`` (``report.publish``) when publish
     ran, else ``sum(rows_ok)``; after a publish over a complete run it must also equal
     ``sum(rows_ok) - duplicate_ids_across_shards`` (publish keeps one result per id; an id with results
     in two shards is published once, the other row becomes a ``duplicate_id`` dead letter);
   * ``rows_dead_letter`` = publish's ``rows_dead_letter``, else ``sum(marker rows_dead_letter)``;
   * ``rows_missing`` = publish's ``rows_missing``, else ``rows_input - sum(rows_ok) - sum(dead)``;
   * ``rows_published + rows_dead_letter + rows_missing == rows_input`` (every input row is published,
     dead-lettered or missing exactly once);
   * ``rows_truncated``, ``rows_reused``, ``rows_computed = sum(rows_ok) - rows_reused`` (also in
     ``reuse``); per shard row ``rows_input`` / ``rows_ok`` / ``rows_dead_letter``.

4. **Worker seconds** (relative tolerance :data:`REL_TOL`). Per shard
   ``seconds = sum(marker.stage_seconds.values())`` (the worker sums every attempt's stage seconds into
   its marker); ``worker_seconds = sum over shards``, ``stage_seconds[stage]`` = per-stage sums plus
   ``publish`` = the publish summary's ``publish_seconds`` (0 without publish; also
   ``timeline.publish_seconds``). Cross-check with the attempt records: where a shard's
   ``attempts/*.json`` hold records written under the marker's fingerprint, the sum of those records'
   ``stage_seconds`` must equal the marker's seconds (within the worker's rounding, 1 ms per stage and
   attempt). ``attempts.total`` and each shard row's ``attempts`` = the attempt records of the shard,
   the marker's copies merged with the files by ``attempt_id``.

5. **Prices.** The expected prices come, in this order, from ``cost_params`` passed to
   :func:`check_report`; else the manifest's ``params`` (what the DAG records: ``accelerator``,
   ``pricing``, ``gpu_hour_usd_spot``, ``gpu_hour_usd_on_demand``; a price not given there is the
   accelerator's default from the table in ``docs/cost-report.md``; ``gpu_count`` 1, which is what the
   DAG passes); else, when nothing records them (a run built by a unit test), the report's own
   ``cost.params``, checked against the documented default table unless ``price_source`` says the user
   gave prices. The publish machine's ``publish_usd_per_hour`` is the one given, else the documented
   default (the ``cpu`` on-demand price). ``cost.params`` (accelerator, pricing, gpu_count, both
   accelerator prices, publish price) must agree with them.

6. **Cost (relative tolerance :data:`REL_TOL`)**, with ``rate`` = the spot or on-demand $/GPU-hour as
   ``pricing`` says::

       stage_usd(stage) = stage_seconds[stage] x gpu_count x rate / 3600
       worker_usd       = worker_seconds x gpu_count x rate / 3600
       publish_usd      = publish_seconds x publish_usd_per_hour / 3600
       cost_usd         = worker_usd + publish_usd
       gpu_seconds      = worker_seconds x gpu_count
       counterfactuals[mode].cost_usd = worker_seconds x gpu_count x rate(mode) / 3600 + publish_usd
       cost_per_million_rows_usd   = cost_usd / rows_published x 1e6          (None when 0 rows)
       cost_per_million_tokens_usd = cost_usd / (input + output tokens) x 1e6 (None when 0 tokens)
       shards[i].cost_usd = shards[i].seconds x gpu_count x rate / 3600

   checked against ``cost_usd``, ``cost.worker_usd``, ``cost.publish_usd``, ``cost.usd_per_gpu_hour``,
   ``cost.by_stage_usd``, ``gpu_seconds``, ``counterfactuals.{spot,on_demand}.cost_usd`` and the two
   per-million figures. Input tokens per marker are ``tokens_prompt`` when non-zero, else
   ``tokens_real``; output tokens are ``tokens_output``.

A run with a pre-flight canary has rows the canary computed and committed into the shards, whose
markers count only their own work: the canary's stage seconds (``canary.json``, idle excluded) are the
stage ``canary`` of ``stage_seconds`` and count in ``worker_seconds`` and every cost figure above.

Not checked here: the padding counterfactual, token-length histogram, throughput, utilisation,
timeline times, attempt outcomes, history and projection (other tests pin those).

:func:`check_report` raises :class:`ReportMismatch` (an ``AssertionError``) naming every disagreeing
field with the report's value and the reference value. :func:`is_stale` tells a report that run files
changed after (a test that edits a run after its report) so a fixture can skip it.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import pyarrow.parquet as pq

REPO_ROOT = Path(__file__).resolve().parents[1]
SCHEMA_PATH = REPO_ROOT / "plugins" / "batch_inference" / "report" / "report.schema.json"
COST_DOC = REPO_ROOT / "docs" / "cost-report.md"

REL_TOL = 1e-6
"""Relative tolerance for seconds and USD (the report keeps full float precision; only summation order
differs)."""
ABS_TOL = 1e-12
"""Absolute floor of the tolerance (figures that are 0)."""
ROUNDING_S = 1e-3
"""The worker rounds each stage's running total to milliseconds when it sums attempts into a marker."""

SECONDS_PER_HOUR = 3600.0
PER_MILLION = 1_000_000
MARKER_NAME = "_SUCCESS.json"
MANIFEST_NAME = "manifest.json"
PRICE_KEYS = ("accelerator", "pricing", "gpu_hour_usd_spot", "gpu_hour_usd_on_demand")
"""Keys of ``manifest.params`` that price a run (the DAG's Params)."""
_ALIASES = {"gpu_hour_usd_spot": "spot_usd_per_gpu_hour", "gpu_hour_usd_on_demand": "on_demand_usd_per_gpu_hour"}


class ReportMismatch(AssertionError):
    """The report disagrees with the schema or with the figures recomputed from the run's files."""


@dataclass
class Reference:
    """Figures recomputed from the run directory (see the module docstring)."""

    rows_input: int = 0
    rows_ok: int = 0
    rows_dead_letter_markers: int = 0
    rows_published: int = 0
    rows_dead_letter: int = 0
    rows_missing: int = 0
    worker_seconds: float = 0.0
    stage_seconds: dict[str, float] = field(default_factory=dict)
    publish_seconds: float = 0.0
    gpu_count: int = 1
    usd_per_gpu_hour: float = 0.0
    cost_usd: float = 0.0
    price_origin: str = ""
    checked_files: bool = False
    canary_seconds: float = 0.0
    """The pre-flight canary's stage seconds, idle excluded (``canary.json``): the stage ``canary``."""


def _close(a: Any, b: float | None, rel: float = REL_TOL, abs_tol: float = ABS_TOL) -> bool:
    if b is None or a is None:
        return a is None and b is None
    if isinstance(a, bool) or not isinstance(a, int | float):
        return False
    return math.isclose(float(a), float(b), rel_tol=rel, abs_tol=abs_tol)


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def documented_prices(doc: Path = COST_DOC) -> dict[str, tuple[float, float]]:
    """``{accelerator: (spot, on_demand)}`` from the default-price table of ``docs/cost-report.md``."""
    prices: dict[str, tuple[float, float]] = {}
    row = re.compile(r"^\|\s*`([a-z0-9-]+)`\s*\|\s*([0-9.]+)\s*\|\s*([0-9.]+)\s*\|")
    for line in doc.read_text(encoding="utf-8").splitlines():
        m = row.match(line)
        if m:
            prices[m.group(1)] = (float(m.group(2)), float(m.group(3)))
    return prices


def schema_errors(report: Any, schema_path: Path = SCHEMA_PATH) -> list[str]:
    """Every JSON Schema error of ``report`` (``path: message``), validator per the schema's ``$schema``."""
    schema = _read_json(schema_path)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    errors = sorted(cls(schema).iter_errors(report), key=lambda e: [str(p) for p in e.absolute_path])
    return [f"schema: /{'/'.join(str(p) for p in e.absolute_path)}: {e.message}" for e in errors]


def _shard_rows(spec: dict[str, Any]) -> int:
    return sum(int(seg["row_stop"]) - int(seg["row_start"]) for seg in spec.get("segments", []))


def _distinct(paths: Iterable[Path], columns: list[str]) -> set:
    out: set = set()
    for path in paths:
        table = pq.read_table(path, columns=columns)
        cols = [table.column(c).to_pylist() for c in columns]
        out.update(zip(*cols, strict=True) if len(cols) > 1 else cols[0])
    return out


def _attempt_files(shard_dir: Path) -> dict[str, dict[str, Any]]:
    """``attempts/*.json`` of a shard by ``attempt_id`` (unreadable records skipped, like the readers)."""
    out: dict[str, dict[str, Any]] = {}
    adir = shard_dir / "attempts"
    if not adir.is_dir():
        return out
    for path in sorted(adir.glob("*.json")):
        try:
            rec = _read_json(path)
        except (ValueError, OSError):
            continue
        if isinstance(rec, dict) and "attempt_id" in rec:
            out[str(rec["attempt_id"])] = rec
    return out


def _expected_prices(report: dict[str, Any], manifest: dict[str, Any],
                     cost_params: dict[str, Any] | None, problems: list[str]) -> dict[str, Any]:
    """The prices the report must use (see the module docstring, point 5)."""
    table = documented_prices()
    got = (report.get("cost") or {}).get("params") or {}
    if cost_params is not None:
        given, origin = {_ALIASES.get(k, k): v for k, v in cost_params.items()}, "cost_params"
    elif any(manifest.get("params", {}).get(k) is not None for k in PRICE_KEYS):
        given = {_ALIASES.get(k, k): manifest["params"][k] for k in PRICE_KEYS
                 if manifest["params"].get(k) is not None}
        origin = "manifest.params"
    else:
        given = dict(got)
        origin = "report.cost.params"
        if str(got.get("price_source", "")).startswith("user"):
            given["_user"] = True
    accelerator = str(given.get("accelerator", "cpu"))
    default = table.get(accelerator)
    expected = {"accelerator": accelerator, "pricing": given.get("pricing", "spot"),
                "gpu_count": int(given.get("gpu_count", 1)), "origin": origin}
    for i, key in enumerate(("spot_usd_per_gpu_hour", "on_demand_usd_per_gpu_hour")):
        if key in given and (origin != "report.cost.params" or given.get("_user") or default is None):
            expected[key] = float(given[key])
        elif default is not None:
            expected[key] = default[i]
        else:
            problems.append(f"prices: {key} for accelerator {accelerator!r} is neither given nor documented")
            expected[key] = float(got.get(key, 0.0))
    # publish machine: given, else the documented default (the cpu on-demand price); a report whose
    # prices nobody recorded is taken at its word
    fallback = got.get("publish_usd_per_hour") if origin == "report.cost.params" else table.get("cpu", (0, 0))[1]
    expected["publish_usd_per_hour"] = float(given.get("publish_usd_per_hour", fallback))
    for key in ("accelerator", "pricing", "gpu_count"):
        if got.get(key) != expected[key]:
            problems.append(f"cost.params.{key}: report {got.get(key)!r} != {origin} {expected[key]!r}")
    for key in ("spot_usd_per_gpu_hour", "on_demand_usd_per_gpu_hour", "publish_usd_per_hour"):
        if not _close(got.get(key), expected[key]):
            problems.append(f"cost.params.{key}: report {got.get(key)!r} != {origin} {expected[key]!r}")
    return expected


def recompute(run_dir: Path, report: dict[str, Any], *, cost_params: dict[str, Any] | None = None,
              problems: list[str] | None = None, check_files: bool = True) -> Reference:
    """Recompute rows, seconds and cost from ``run_dir``'s files; append disagreements to ``problems``."""
    problems = [] if problems is None else problems
    ref = Reference()
    manifest = _read_json(run_dir / MANIFEST_NAME)
    specs = manifest.get("shards", [])
    markers: dict[str, dict[str, Any]] = {}
    for spec in specs:
        path = run_dir / "shards" / spec["shard_id"] / MARKER_NAME
        if path.is_file():
            markers[spec["shard_id"]] = _read_json(path)

    # -- identity -------------------------------------------------------------------------------------
    if report.get("run_id") != run_dir.name:
        problems.append(f"run_id: report {report.get('run_id')!r} != run directory {run_dir.name!r}")
    uris = report.get("uris") or {}
    tail = run_dir.as_posix()[run_dir.as_posix().rindex("/runs/"):]  # /runs/[<dag_id>/]<run_id>
    if not str(uris.get("report_json", "")).endswith(f"{tail}/report.json"):
        problems.append(f"uris.report_json: {uris.get('report_json')!r} is not this run's report.json")
    if not str(uris.get("run_dir", "")).rstrip("/").endswith(tail):
        problems.append(f"uris.run_dir: {uris.get('run_dir')!r} is not this run's directory")
    missing = [s["shard_id"] for s in specs if s["shard_id"] not in markers]
    for key, value in (("shards_total", len(specs)), ("shards_complete", len(markers)),
                       ("shards_missing", missing), ("complete", not missing)):
        if report.get(key) != value:
            problems.append(f"{key}: report {report.get(key)!r} != reference {value!r}")

    # -- rows -----------------------------------------------------------------------------------------
    ref.rows_input = sum(_shard_rows(s) for s in specs)
    files_complete = check_files
    shard_ref: dict[str, dict[str, Any]] = {}
    for spec in specs:
        sid = spec["shard_id"]
        shard_dir = run_dir / "shards" / sid
        files = _attempt_files(shard_dir)
        m = markers.get(sid)
        merged = {str(a.get("attempt_id", f"marker-{i}")): a for i, a in enumerate((m or {}).get("attempts", []))}
        merged.update(files)
        row: dict[str, Any] = {"rows_input": _shard_rows(spec), "attempts": len(merged)}
        shard_ref[sid] = row
        if m is None:
            continue
        ok, dead = int(m.get("rows_ok", 0)), int(m.get("rows_dead_letter", 0))
        if int(m.get("rows_input", -1)) != row["rows_input"]:
            problems.append(f"marker {sid}: rows_input {m.get('rows_input')} != manifest {row['rows_input']}")
        if ok + dead != int(m.get("rows_input", -1)):
            problems.append(f"marker {sid}: rows_ok {ok} + rows_dead_letter {dead} != rows_input {m.get('rows_input')}")
        row.update(rows_input=int(m.get("rows_input", 0)), rows_ok=ok, rows_dead_letter=dead)
        if check_files:
            parts = [shard_dir / n for n in m.get("parts", [])]
            deads = [shard_dir / n for n in m.get("dead_letter_parts", [])]
            if all(p.is_file() for p in parts + deads):
                ids = _distinct(parts, ["id"])
                if parts and len(ids) != ok:
                    problems.append(f"marker {sid}: rows_ok {ok} != {len(ids)} distinct ids in its part files")
                if deads and (n := len(_distinct(deads, ["source_uri", "source_row"]))) != dead:
                    problems.append(f"marker {sid}: rows_dead_letter {dead} != {n} distinct rows in its dead-letter files")
                if not parts and ok:
                    files_complete = False
            else:
                files_complete = False
                problems.append(f"marker {sid}: a listed part or dead-letter file is missing")
        ref.rows_ok += ok
        ref.rows_dead_letter_markers += dead
        # seconds: the marker's stage seconds, cross-checked with the attempt records of its fingerprint
        stages = {k: float(v) for k, v in (m.get("stage_seconds") or {}).items()}
        row["seconds"] = sum(stages.values())
        for k, v in stages.items():
            ref.stage_seconds[k] = ref.stage_seconds.get(k, 0.0) + v
        own = [a for a in files.values() if a.get("fingerprint") == m.get("fingerprint")]
        if own:
            recorded = sum(float(v) for a in own for v in (a.get("stage_seconds") or {}).values())
            slack = ROUNDING_S * max(1, sum(len(a.get("stage_seconds") or {}) for a in own))
            if not _close(row["seconds"], recorded, abs_tol=slack):
                problems.append(f"marker {sid}: stage seconds {row['seconds']!r} != {recorded!r} summed over "
                                f"its {len(own)} attempt record(s)")
    ref.checked_files = files_complete
    if (run_dir / "canary.json").is_file():
        canary = _read_json(run_dir / "canary.json").get("stage_seconds") or {}
        ref.canary_seconds = sum(float(v) for k, v in canary.items() if k != "idle")
        if ref.canary_seconds > 0:
            ref.stage_seconds["canary"] = ref.canary_seconds
    ref.worker_seconds = sum(ref.stage_seconds.values())

    publish = report.get("publish") or None
    ref.publish_seconds = float(publish.get("publish_seconds", 0.0)) if publish else 0.0
    if publish and "rows_published" in publish:
        ref.rows_published = int(publish["rows_published"])
        across = int(publish.get("duplicate_ids_across_shards") or 0)
        if not missing and ref.rows_published != ref.rows_ok - across:
            problems.append(f"publish.rows_published {ref.rows_published} != markers' rows_ok {ref.rows_ok} - "
                            f"duplicate_ids_across_shards {across}")
    else:
        ref.rows_published = ref.rows_ok
    ref.rows_dead_letter = (int(publish["rows_dead_letter"]) if publish and "rows_dead_letter" in publish
                            else ref.rows_dead_letter_markers)
    ref.rows_missing = (int(publish["rows_missing"]) if publish and "rows_missing" in publish
                        else ref.rows_input - ref.rows_ok - ref.rows_dead_letter_markers)
    rows_reused = sum(int(m.get("rows_reused", 0)) for m in markers.values())
    exact = {
        "rows_input": ref.rows_input,
        "rows_published": ref.rows_published,
        "rows_dead_letter": ref.rows_dead_letter,
        "rows_missing": ref.rows_missing,
        "rows_truncated": sum(int(m.get("rows_truncated", 0)) for m in markers.values()),
        "rows_reused": rows_reused,
        "rows_computed": ref.rows_ok - rows_reused,
    }
    for key, value in exact.items():
        if report.get(key) != value:
            problems.append(f"{key}: report {report.get(key)!r} != reference {value!r}")
    reuse = report.get("reuse") or {}
    for key in ("rows_reused", "rows_computed"):
        if reuse.get(key) != exact[key]:
            problems.append(f"reuse.{key}: report {reuse.get(key)!r} != reference {exact[key]!r}")
    if ref.rows_published + ref.rows_dead_letter + ref.rows_missing != ref.rows_input:
        problems.append(f"rows: published {ref.rows_published} + dead letter {ref.rows_dead_letter} + missing "
                        f"{ref.rows_missing} != input {ref.rows_input}")
    attempts_total = sum(r["attempts"] for r in shard_ref.values())
    if (report.get("attempts") or {}).get("total") != attempts_total:
        problems.append(f"attempts.total: report {(report.get('attempts') or {}).get('total')!r} != "
                        f"{attempts_total} attempt records")

    # -- seconds --------------------------------------------------------------------------------------
    got_stages = report.get("stage_seconds") or {}
    for stage in sorted(set(ref.stage_seconds) | (set(got_stages) - {"publish"})):
        if not _close(got_stages.get(stage, 0.0), ref.stage_seconds.get(stage, 0.0)):
            problems.append(f"stage_seconds.{stage}: report {got_stages.get(stage)!r} != reference "
                            f"{ref.stage_seconds.get(stage, 0.0)!r}")
    for key, got in (("stage_seconds.publish", got_stages.get("publish")),
                     ("timeline.publish_seconds", (report.get("timeline") or {}).get("publish_seconds"))):
        if not _close(got, ref.publish_seconds):
            problems.append(f"{key}: report {got!r} != publish summary {ref.publish_seconds!r}")
    if not _close(report.get("worker_seconds"), ref.worker_seconds):
        problems.append(f"worker_seconds: report {report.get('worker_seconds')!r} != reference {ref.worker_seconds!r}")

    # -- prices and cost ------------------------------------------------------------------------------
    prices = _expected_prices(report, manifest, cost_params, problems)
    ref.price_origin = prices["origin"]
    ref.gpu_count = gpus = prices["gpu_count"]
    rates = {"spot": prices["spot_usd_per_gpu_hour"], "on_demand": prices["on_demand_usd_per_gpu_hour"]}
    ref.usd_per_gpu_hour = rate = rates.get(prices["pricing"], rates["spot"])

    def usd(seconds: float, per_hour: float = rate, devices: int = gpus) -> float:
        return seconds * devices * per_hour / SECONDS_PER_HOUR

    worker_usd = usd(ref.worker_seconds)
    publish_usd = usd(ref.publish_seconds, prices["publish_usd_per_hour"], 1)
    ref.cost_usd = worker_usd + publish_usd
    tokens = sum(int(m.get("tokens_prompt") or m.get("tokens_real") or 0) + int(m.get("tokens_output") or 0)
                 for m in markers.values())
    cost = report.get("cost") or {}
    by_stage = cost.get("by_stage_usd") or {}
    counterfactuals = report.get("counterfactuals") or {}
    figures: list[tuple[str, Any, float | None]] = [
        ("cost_usd", report.get("cost_usd"), ref.cost_usd),
        ("cost.worker_usd", cost.get("worker_usd"), worker_usd),
        ("cost.publish_usd", cost.get("publish_usd"), publish_usd),
        ("cost.usd_per_gpu_hour", cost.get("usd_per_gpu_hour"), rate),
        ("gpu_seconds", report.get("gpu_seconds"), ref.worker_seconds * gpus),
        ("cost_per_million_rows_usd", report.get("cost_per_million_rows_usd"),
         ref.cost_usd / ref.rows_published * PER_MILLION if ref.rows_published else None),
        ("cost_per_million_tokens_usd", report.get("cost_per_million_tokens_usd"),
         ref.cost_usd / tokens * PER_MILLION if tokens else None),
        ("cost.by_stage_usd.publish", by_stage.get("publish"), publish_usd),
    ]
    figures += [(f"cost.by_stage_usd.{s}", by_stage.get(s, 0.0), usd(v)) for s, v in ref.stage_seconds.items()]
    figures += [(f"counterfactuals.{mode}.cost_usd", (counterfactuals.get(mode) or {}).get("cost_usd"),
                 usd(ref.worker_seconds, r) + publish_usd) for mode, r in rates.items()]
    for row in report.get("shards") or []:
        want = shard_ref.get(row.get("shard_id"))
        if want is None:
            problems.append(f"shards: {row.get('shard_id')!r} is not a manifest shard")
            continue
        for key in ("rows_input", "rows_ok", "rows_dead_letter", "attempts"):
            if key in want and row.get(key) != want[key]:
                problems.append(f"shards[{row['shard_id']}].{key}: report {row.get(key)!r} != reference {want[key]!r}")
        if "seconds" in want:
            figures.append((f"shards[{row['shard_id']}].seconds", row.get("seconds"), want["seconds"]))
            figures.append((f"shards[{row['shard_id']}].cost_usd", row.get("cost_usd"), usd(want["seconds"])))
    for name, got, want in figures:
        if not _close(got, want):
            problems.append(f"{name}: report {got!r} != reference {want!r}")
    return ref


def check_report(report_path: str | os.PathLike[str], *, cost_params: dict[str, Any] | None = None,
                 check_files: bool = True) -> Reference:
    """Check ``<output_root>/runs/<run_id>/report.json`` against the schema and its run's files.

    Args:
        report_path: a local ``report.json`` inside its run directory.
        cost_params: the ``cost_params`` the report was built with, when the caller knows them (else
            the manifest's params or the report's own; see the module docstring, point 5).
        check_files: also count ids in the part and dead-letter files the markers list (pyarrow).

    Returns:
        The recomputed figures.

    Raises:
        ReportMismatch: one line per schema error or disagreeing figure.
    """
    path = Path(report_path)
    report = _read_json(path)
    problems = schema_errors(report)
    if not isinstance(report, dict):
        raise ReportMismatch(f"{path}: not a JSON object")
    try:
        ref = recompute(path.parent, report, cost_params=cost_params, problems=problems, check_files=check_files)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a report too malformed to compare
        problems.append(f"cannot compare: {type(exc).__name__}: {exc}")
        ref = Reference()
    if problems:
        raise ReportMismatch(f"{path}: {len(problems)} problem(s):\n  " + "\n  ".join(problems))
    return ref


def is_stale(report_path: str | os.PathLike[str]) -> bool:
    """Whether the run's manifest, a marker, an attempt record or a shard directory changed after the
    report was written (the test edited or re-ran part of the run afterwards): its figures then describe
    an earlier state of the run and cannot be compared with the files."""
    path = Path(report_path)
    written = path.stat().st_mtime_ns
    run_dir = path.parent
    candidates = [run_dir / MANIFEST_NAME]
    shards = run_dir / "shards"
    if shards.is_dir():
        for shard in shards.iterdir():
            candidates += [shard, shard / MARKER_NAME, shard / "attempts"]
            if (shard / "attempts").is_dir():
                candidates += list((shard / "attempts").iterdir())
    for candidate in candidates:
        try:
            if candidate.stat().st_mtime_ns > written:
                return True
        except FileNotFoundError:
            continue
    return False


def find_reports(root: str | os.PathLike[str], skip: Iterable[Path] = ()) -> list[Path]:
    """Every ``runs/[<dag_id>/]<run_id>/report.json`` under ``root`` (directories in ``skip`` not entered)."""
    skipped = {os.path.realpath(p) for p in skip}
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        if os.path.realpath(dirpath) in skipped:
            dirnames[:] = []
            continue
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        parents = Path(dirpath).parts[-3:-1]  # runs/<run_id> or runs/<dag_id>/<run_id>
        if "report.json" in filenames and "runs" in parents:
            found.append(Path(dirpath) / "report.json")
    return sorted(found)

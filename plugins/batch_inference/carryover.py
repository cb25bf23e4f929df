"""Shard carry-over on the Airflow side: the plan task completes unchanged shards without a worker, and
publish indexes the shards it published (the rule and the records: :mod:`batch_contract.carryover`).

:func:`carry_over` runs in the plan task right after the manifest is written, when ``reuse`` is
``same_root`` and it is not a dry run. For each shard it computes the input key, reads the index entry
of that key, checks the source shard (marker present, same fingerprint and row count, every committed
file present with its recorded size), and then copies the source's committed files into the new shard
(hard links locally, server-side copies on GCS; result parts renamed ``part-<chunk>-reuse-<id>``) and
writes its marker, create-only like a worker's (:meth:`~batch_contract.runstore.RunStore.write_marker`,
ADR 0002). The shard gets no mapped task: no pod, no subprocess, no model load. An unchanged input
therefore publishes with zero workers.

:func:`index_published` runs in publish after the table swap: one index entry per complete shard of the
run. A missing or unusable source or index entry is logged and the shard is simply computed (or not
indexed); only a storage failure, or a marker already in the new shard that does not complete it,
fails the plan task. Every read and write of a run directory goes through
:class:`~batch_contract.runstore.RunStore`.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from batch_contract import storage
from batch_contract.carryover import (
    CarriedShard,
    CarryOverPlan,
    ShardIndexEntry,
    model_identity,
    shard_input_key,
)
from batch_contract.layout import DEAD_LETTER_PREFIX, PART_PREFIX, REUSED_MARK, join_uri
from batch_contract.manifest import Manifest, ShardSpec
from batch_contract.marker import AttemptRecord, ShardMarker
from batch_contract.modeldigest import model_digest
from batch_contract.runstore import RunStore, is_complete

log = logging.getLogger(__name__)

TEMPLATE_GLOB = "*.jinja"
"""Chat template files: they change an LLM's prompts but are not in :func:`model_digest`."""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def plan_model_identity(manifest: Manifest, runner: str, image: str | None, default_model: str) -> str | None:
    """:func:`batch_contract.carryover.model_identity` of the run's model as the plan task can see it:
    the digest of the model directory (plus its chat templates) when it is readable here, else the
    kubernetes runner's image digest; ``None`` when neither pins the model's bytes."""
    path = Path(manifest.engine.get("model_path") or default_model)
    if (path / "config.json").is_file():
        templates = "".join(f"{p.name}:{storage.content_tag(str(p))};" for p in sorted(path.glob(TEMPLATE_GLOB)))
        return model_identity(model_digest=f"{model_digest(path)}:{templates}")
    if runner == "kubernetes" and image:
        try:
            return model_identity(image=image, model_path=str(path))
        except ValueError:
            return None
    return None


def _file_tags(manifest: Manifest) -> dict[str, str]:
    """``content_tag`` of every input file that has one (files without a version tag are left out)."""
    tags = {}
    for f in manifest.input.files:
        tag = storage.content_tag(f.uri)
        if tag:
            tags[f.uri] = tag
    return tags


def shard_keys(manifest: Manifest, model: str) -> dict[str, str]:
    """Input key of every shard whose files all have a version tag."""
    tags = _file_tags(manifest)
    keys = {}
    for shard in manifest.shards:
        uris = {manifest.input.files[s.file_index].uri for s in shard.segments}
        if uris <= tags.keys():
            keys[shard.shard_id] = shard_input_key(manifest.input, shard.segments, tags,
                                                   manifest.config_fingerprint, model)
    return keys


def _source(entry: ShardIndexEntry, shard: ShardSpec) -> ShardMarker | None:
    """The source shard's marker when it can be carried over as is, else ``None`` (logged)."""
    try:
        source = RunStore.open(entry.run_dir)
        marker = source.marker(entry.shard_id)
    except (ValueError, TypeError, KeyError) as exc:
        log.info("carry-over: source %s shard %s has no usable marker (%s)", entry.run_dir, entry.shard_id, exc)
        return None
    if not is_complete(marker, entry.fingerprint):  # absent, another status, or another fingerprint
        log.info("carry-over: source %s shard %s is not complete under %s", entry.run_dir, entry.shard_id,
                 entry.fingerprint)
        return None
    if marker.rows_input != shard.rows or not marker.files:
        return None
    sizes = source.committed_files(entry.shard_id)
    if any(sizes.get(name) != rec.get("bytes") for name, rec in marker.files.items()):
        log.info("carry-over: source %s shard %s lost or changed files", entry.run_dir, entry.shard_id)
        return None
    return marker


def _candidates(store: RunStore, manifest: Manifest, keys: dict[str, str]) -> dict[str, tuple[ShardIndexEntry, ShardMarker]]:
    shards = {s.shard_id: s for s in manifest.shards}
    found = {}
    for shard_id, key in keys.items():
        try:
            entry = store.index_entry(key)
        except (ValueError, TypeError) as exc:
            log.warning("carry-over: index entry %s unreadable (%s): shard %s is computed", key, exc, shard_id)
            continue
        if entry is None:
            continue
        marker = _source(entry, shards[shard_id])
        if marker is not None:
            found[shard_id] = (entry, marker)
    return found


def decide(store: RunStore, manifest: Manifest, model: str | None) -> CarryOverPlan:
    """The run's carry-over plan: keys, the shards to carry and the fingerprint they pin (index entries
    are read from ``store``'s output root).

    When sources disagree on the fingerprint (shards computed on hosts that resolved ``auto``
    differently), only the fingerprint covering the most rows is carried, so the run stays on one.
    """
    if manifest.input.documents is not None:
        return CarryOverPlan(disabled="the input points at documents: the plan hashes the files it lists, not "
                                      "the documents' bytes (the worker extracts every document)")
    if model is None:
        return CarryOverPlan(disabled="the model's bytes are not pinned here (model directory not readable "
                                      "by the plan task and no image digest)")
    keys = shard_keys(manifest, model)
    found = _candidates(store, manifest, keys)
    if not found:
        return CarryOverPlan(keys=keys)
    rows = Counter()
    for entry, marker in found.values():
        rows[entry.fingerprint] += marker.rows_input
    pinned_fp = rows.most_common(1)[0][0]
    carried, resolved = {}, {}
    for shard_id, (entry, _) in sorted(found.items()):
        if entry.fingerprint == pinned_fp:
            carried[shard_id] = CarriedShard(entry.run_dir, entry.shard_id, entry.fingerprint, entry.seconds).__dict__
            resolved = entry.resolved
    return CarryOverPlan(keys=keys, carried=carried, pinned={"fingerprint": pinned_fp, "resolved": resolved})


def compute_seconds(marker: ShardMarker) -> float:
    """Worker seconds a shard's results cost when first computed: its stages except ``reuse`` (the
    copying) plus what the shard itself avoided by reuse (rounded to microseconds)."""
    return round(sum(marker.stage_seconds.values()) - marker.stage_seconds.get("reuse", 0.0)
                 + marker.reuse_seconds_avoided, 6)


def carried_name(name: str) -> str:
    """Name of a copied file: a result part becomes ``part-<chunk>-reuse-<rest>`` (its rows were not
    computed by this run); dead letters and parts already so named keep their names."""
    if not name.startswith(PART_PREFIX):
        return name
    chunk, _, rest = name[len(PART_PREFIX):].partition("-")
    return name if rest.startswith(REUSED_MARK) else f"{PART_PREFIX}{chunk}-{REUSED_MARK}{rest}"


def _copy_shard(store: RunStore, shard_id: str, carried: CarriedShard, run_id: str) -> ShardMarker:
    """Copy the source shard's committed files and write the new shard's marker
    (:meth:`RunStore.write_marker` with ``carried_over=True``: create-only, idempotent).

    Raises:
        FileNotFoundError: the source shard's marker is gone.
        batch_contract.runstore.MarkerConflictError: another marker that does not complete the shard is in
            place (see ADR 0002).
    """
    src = RunStore.open(carried.source_run_dir).layout
    dst = store.layout
    source = RunStore(src).marker(carried.source_shard_id)
    if source is None:
        raise FileNotFoundError(f"{src.marker_uri(carried.source_shard_id)}: the carried shard's source marker is gone")
    t0 = time.perf_counter()
    started = _now()
    files = {}
    for name, record in sorted(source.files.items()):
        new = carried_name(name)
        storage.copy(join_uri(src.shard_dir(carried.source_shard_id), name), join_uri(dst.shard_dir(shard_id), new))
        files[new] = dict(record)
    seconds = round(time.perf_counter() - t0, 6)
    avoided = compute_seconds(source)
    attempt = AttemptRecord(
        attempt_id=f"carryover-{run_id}"[:200], shard_id=shard_id, started_at=started, host="plan task",
        status="complete", ended_at=_now(), exit_code=0, rows_committed=source.rows_input,
        stage_seconds={"reuse": seconds}, fingerprint=source.fingerprint, files=files,
        rows_reused=source.rows_ok, reuse_seconds_avoided=avoided, updated_at=_now(),
    )
    marker = ShardMarker(
        run_id=run_id, shard_id=shard_id, fingerprint=source.fingerprint, rows_input=source.rows_input,
        rows_ok=source.rows_ok, rows_dead_letter=source.rows_dead_letter, rows_truncated=source.rows_truncated,
        rows_text_repaired=source.rows_text_repaired, dead_letter_reasons=dict(source.dead_letter_reasons),
        stage_seconds={"reuse": seconds},
        engine={**source.engine, "model_loaded": False, "carried_from": f"{carried.source_run_dir}#{carried.source_shard_id}"},
        attempts=[attempt.__dict__],
        parts=sorted(n for n in files if n.startswith(PART_PREFIX)),
        dead_letter_parts=sorted(n for n in files if n.startswith(DEAD_LETTER_PREFIX)),
        files=files, rows_reused=source.rows_ok, reuse_seconds_avoided=avoided,
        started_at=started, finished_at=_now(),
    )
    store.write_marker(marker, carried_over=True)
    return marker


def carry_over(manifest: Manifest, run_dir: str, *, runner: str, image: str | None, default_model: str) -> CarryOverPlan:
    """Decide (once per run: a retried plan task reads the recorded plan back) and carry over.

    Writes ``runs/<run_id>/carryover.json`` before any copy, so workers of the run see the pinned
    fingerprint; then completes every carried shard that is not complete yet
    (:meth:`RunStore.is_complete`: a shard with a complete marker, under any fingerprint, is left alone).

    Returns:
        The plan; ``plan.carried`` names the shards that need no worker.

    Raises:
        batch_contract.storage.StorageError: storage failed (the plan task is retried).
        batch_contract.runstore.MarkerConflictError: a carried shard already has a marker that does not
            complete it (unreadable or another status); it is kept and must be deleted by hand.
        FileNotFoundError: a carried shard's source marker vanished after the plan was decided.
    """
    store = RunStore.open(run_dir)
    plan = store.carryover_plan()
    if plan is None:
        model = plan_model_identity(manifest, runner, image, default_model)
        plan = decide(store, manifest, model)
        store.write_carryover_plan(plan)
    for shard_id, record in plan.carried.items():
        if not store.is_complete(shard_id):
            _copy_shard(store, shard_id, CarriedShard(**record), manifest.run_id)
    return plan


def index_published(run_dir: str) -> int:
    """Write the index entry of every shard of a published run that has a key and a complete marker
    (:func:`~batch_contract.runstore.is_complete`); returns how many. Never raises: an indexing failure only means the next run computes those shards."""
    try:
        store = RunStore.open(run_dir)
        plan = store.carryover_plan()
        if plan is None or not plan.keys:
            return 0
        written = 0
        for shard_id, key in sorted(plan.keys.items()):
            marker = store.marker(shard_id)
            if not is_complete(marker):
                log.info("carry-over: shard %s of %s is not complete: not indexed", shard_id, run_dir)
                continue
            entry = _index_entry(run_dir, shard_id, marker, plan)
            store.write_index_entry(key, entry)
            written += 1
        return written
    except Exception:  # noqa: BLE001 - an index is an optimisation; publish already succeeded
        log.exception("carry-over: could not index the shards of %s (the next run computes them)", run_dir)
        return 0


def _index_entry(run_dir: str, shard_id: str, marker: ShardMarker, plan: CarryOverPlan) -> ShardIndexEntry:
    """The entry of one published shard; a carried shard points at its own source (the files are the
    same, and the source's seconds are what computing them cost)."""
    record = plan.carried.get(shard_id)
    if record is not None:
        carried = CarriedShard(**record)
        resolved = plan.pinned.get("resolved", {})
        return ShardIndexEntry(run_dir=run_dir, shard_id=shard_id, fingerprint=marker.fingerprint,
                               resolved=dict(resolved), rows_input=marker.rows_input, seconds=carried.seconds)
    return ShardIndexEntry(run_dir=run_dir, shard_id=shard_id, fingerprint=marker.fingerprint,
                           resolved=_resolved_of(marker), rows_input=marker.rows_input,
                           seconds=compute_seconds(marker))


def _resolved_of(marker: ShardMarker) -> dict[str, Any]:
    """What the shard's worker resolved from ``auto`` settings, as recorded in ``marker.engine``."""
    resolved = marker.engine.get("resolved")
    return dict(resolved) if isinstance(resolved, dict) else {}

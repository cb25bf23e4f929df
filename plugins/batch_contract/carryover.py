"""Shard carry-over: a shard whose input bytes, engine config and model are unchanged since an earlier run
under the same output root is completed at plan time from that run's committed files, with no worker.

The result cache (:mod:`batch_contract.resultcache`) reuses rows, but only a worker can use it: it must
read and hash the shard's texts. Carry-over works one level up, on whole shards, from metadata only:

* **Shard input key** (:func:`shard_input_key`): SHA-256 of the input format, id/text columns, the
  shard's segments (file URI, row range) with each file's storage version tag
  (:func:`batch_contract.storage.content_tag`: local size + mtime + inode, GCS generation + CRC32C),
  the manifest's config fingerprint (normalised engine config, prompt template, sampling,
  ``SCHEMA_VERSION``) and the model identity (:func:`model_identity`). A shard with the same key reads
  the same rows and runs the same model with the same settings, so the worker would write the same
  results and the same dead letters.
* **Index** (:class:`ShardIndexEntry`): ``<output_root>/cache/shards/<key>.json``, written by publish
  for every shard of a published run: where the shard's committed files are and the fingerprint they
  carry (with the settings the worker resolved on its host, such as ``dtype: auto`` -> ``bfloat16``).
* **Run record** (:class:`CarryOverPlan`): ``runs/<run_id>/carryover.json``, written by the plan task
  before any worker starts: every shard's key, the shards carried over and from where, and the
  fingerprint they carry (``pinned``). A worker of the same run that computes other shards adopts the
  pinned resolution (``Engine.pin_resolved``), so one run never mixes fingerprints; a worker that
  cannot (its host lacks the pinned dtype) exits 2 with a message saying so.

What it never does: carry a shard whose input file changed, whose model files changed, or whose config
changed in any output-relevant field (speed-only settings such as the token budget do not count, as for
the fingerprint). An input whose storage cannot tell a version (``content_tag`` is ``None``), a model
directory the plan task cannot read (unless the kubernetes runner pins it inside an image digest), or
``reuse: off`` disable it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from batch_contract.jsonutil import canonical_json, sha256_hex
from batch_contract.layout import join_uri
from batch_contract.manifest import InputSpec, Segment
from batch_contract.records import JsonRecord
from batch_contract.resultcache import CACHE_DIR
from batch_contract.version import SCHEMA_VERSION

CARRYOVER_NAME = "carryover.json"
INDEX_DIR = "shards"
KEY_HEX = 40
"""Hex characters of a shard input key (160 bits of SHA-256)."""


def shard_input_key(spec: InputSpec, segments: list[Segment], tags: Mapping[str, str],
                    config_fingerprint: str, model: str) -> str:
    """The shard's input key (see the module docstring).

    Args:
        spec: the manifest's input spec (format, columns, files).
        segments: the shard's segments.
        tags: file URI -> :func:`batch_contract.storage.content_tag` of every file the segments read.
        config_fingerprint: the manifest's config fingerprint.
        model: :func:`model_identity` of the run's model.

    Returns:
        ``KEY_HEX`` lowercase hex characters.

    Raises:
        KeyError: a segment's file has no tag in ``tags``.
    """
    parts = [{"uri": spec.files[s.file_index].uri, "tag": tags[spec.files[s.file_index].uri],
              "rows": [s.row_start, s.row_stop]} for s in segments]
    payload = {"format": spec.format, "id_column": spec.id_column, "text_column": spec.text_column,
               "segments": parts, "config": config_fingerprint, "model": model,
               "schema_version": SCHEMA_VERSION}
    return sha256_hex(canonical_json(payload))[:KEY_HEX]


def model_identity(model_digest: str | None = None, image: str | None = None, model_path: str = "") -> str:
    """What pins the model's bytes: the digest of a model directory the plan task read, or the worker
    image's ``repo@sha256:`` digest with the model path inside it.

    Raises:
        ValueError: neither is given.
    """
    if model_digest:
        return f"files:{model_digest}"
    if image and "@sha256:" in image:
        return f"image:{image}:{model_path}"
    raise ValueError("model identity needs a model digest or an image pinned by digest")


def index_uri(output_root: str, key: str) -> str:
    """``<output_root>/cache/shards/<key>.json``."""
    if len(key) != KEY_HEX or any(c not in "0123456789abcdef" for c in key):
        raise ValueError(f"shard input key {key!r} is not {KEY_HEX} lowercase hex characters")
    return join_uri(output_root, CACHE_DIR, INDEX_DIR, f"{key}.json")


def carryover_uri(run_dir: str) -> str:
    """``<run_dir>/carryover.json``."""
    return join_uri(run_dir, CARRYOVER_NAME)


@dataclass
class ShardIndexEntry(JsonRecord):
    """Where a published shard's results are (``cache/shards/<key>.json``).

    Attributes:
        run_dir / shard_id: the shard that computed (or itself carried) them.
        fingerprint: the result fingerprint of its files.
        resolved: what its worker resolved from ``auto`` settings (``{"dtype": "bfloat16"}``; ``{}``).
        rows_input: the shard's rows.
        seconds: worker seconds the results cost when first computed (summed stages plus the seconds
            the source shard itself avoided by reuse), for the cost report's "cost avoided".
    """

    RECORD_NAME: ClassVar[str] = "shard index entry"

    run_dir: str
    shard_id: str
    fingerprint: str
    resolved: dict[str, Any] = field(default_factory=dict)
    rows_input: int = 0
    seconds: float = 0.0
    schema_version: int = SCHEMA_VERSION



@dataclass
class CarriedShard:
    """One shard completed at plan time: its source and what the copy cost (seconds)."""

    source_run_dir: str
    source_shard_id: str
    fingerprint: str
    seconds: float = 0.0


@dataclass
class CarryOverPlan(JsonRecord):
    """``runs/<run_id>/carryover.json``: the carry-over decisions of one run (see the module docstring).

    Attributes:
        keys: shard id -> input key (every shard whose key could be computed; publish indexes them).
        carried: shard id -> :class:`CarriedShard` as a dict.
        pinned: ``{"fingerprint": ..., "resolved": {...}}`` of the carried shards, or ``{}`` when none
            was carried (workers then resolve ``auto`` settings freely).
        disabled: why carry-over was off for this run (empty when it was on).
    """

    RECORD_NAME: ClassVar[str] = "carry-over plan"

    keys: dict[str, str] = field(default_factory=dict)
    carried: dict[str, dict[str, Any]] = field(default_factory=dict)
    pinned: dict[str, Any] = field(default_factory=dict)
    disabled: str = ""
    schema_version: int = SCHEMA_VERSION

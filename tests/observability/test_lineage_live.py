"""Lineage of the three runs (conftest.py) as the OpenLineage provider's listener sent it from a real
deployment's task processes (its own file transport): every event valid against the OpenLineage JSON
Schema, and the slow run's publish names its input file, its DuckDB table and the result fingerprint."""

from __future__ import annotations

import json

import pytest
from lineage_schemas import event_errors
from obs_deployment import record

pytestmark = [pytest.mark.integration]


def test_every_lineage_event_is_valid_and_publish_names_what_it_read_and_wrote(deployment) -> None:
    path = deployment["lineage_file"]
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    errors = {i: event_errors(e) for i, e in enumerate(events) if event_errors(e)}
    ours = [e for e in events if e["job"]["name"].split(".")[-1] in ("plan", "publish")]
    record(lineage_events=len(events), lineage_events_valid=bool(events) and not errors)
    assert events and not errors, errors
    slow = deployment["runs"]["obs_slow"]["run_id"]
    done = [e for e in ours if e["eventType"] == "COMPLETE" and e["job"]["name"] == "obs_slow.publish"
            and slow in json.dumps(e["run"]["facets"])]
    assert len(done) == 1, [(e["job"]["name"], e["eventType"]) for e in ours]
    (event,) = done
    assert any(d["name"].endswith("slow.parquet") for d in event["inputs"]), event["inputs"]
    assert any(d["name"].endswith(".obs_slow") for d in event["outputs"]), event["outputs"]
    assert event["run"]["facets"]["batchInference"]["resultFingerprint"]

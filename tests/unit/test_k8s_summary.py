"""The last line of ``make test-k8s``: issue 14's keys first, in order, missing ones null."""

from __future__ import annotations

import json

from k8s_summary import KEYS, main, summary


def test_issue_keys_first_then_extras_then_suite_seconds() -> None:
    out = summary({"orphan_pods": 0, "shards": 3, "backfill_seconds": 80.0}, seconds=301.26)
    assert list(out)[: len(KEYS)] == list(KEYS)
    assert out["shards"] == 3 and out["orphan_pods"] == 0 and out["exit2_pods"] is None
    assert list(out)[len(KEYS):] == ["backfill_seconds", "suite_seconds"] and out["suite_seconds"] == 301.3


def test_prints_one_json_line(tmp_path, capsys) -> None:
    figures = tmp_path / "f.json"
    figures.write_text(json.dumps({"equal_to_local": True}))
    assert main([str(figures)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["equal_to_local"] is True
    assert main([str(tmp_path / "missing.json")]) == 0

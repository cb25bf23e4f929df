"""``batch-worker smoke``: every missing thing in one message; storage checked create-only."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from batch_worker import smoke
from batch_worker.cli import main


def test_storage_checks_pass_on_a_writable_root_and_leave_one_probe(tmp_path: Path, capsys) -> None:
    assert main(["smoke", "--output-root", str(tmp_path / "out"), "--gpu", "false"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["ok"] and result["checks"]["create_only"] is True and result["missing"] == []
    assert [p.name for p in (tmp_path / "out" / "_smoke").iterdir()] == [Path(result["checks"]["probe"]).name]


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU machine: the GPU checks pass")
def test_without_a_gpu_every_missing_thing_is_named_in_one_message(tmp_path: Path, capsys) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert main(["smoke", "--output-root", str(blocker), "--gpu", "true"]) == 1
    out = capsys.readouterr()
    message = [line for line in out.err.splitlines() if line.startswith("SMOKE FAILED: ")]
    assert len(message) == 1, out.err
    assert "nvidia-smi is not on PATH" in message[0] and "torch.cuda.is_available() is False" in message[0]
    assert f"cannot create {blocker}" in message[0]
    assert json.loads(out.out.strip().splitlines()[-1])["ok"] is False


def test_a_store_that_overwrites_fails_the_create_only_check(tmp_path: Path, monkeypatch) -> None:
    from batch_contract import storage

    monkeypatch.setattr(storage, "write_create_only", storage.write_replace)
    report = smoke.run_smoke(str(tmp_path), require_gpu=False)
    assert not report.ok and "was overwritten: create-only writes are not enforced" in report.missing[0]


@pytest.mark.parametrize(("value", "flag"), [("True", True), ("false", False), ("1", True), ("no", False)])
def test_the_gpu_flag_reads_a_rendered_boolean_param(value: str, flag: bool) -> None:
    assert smoke.boolean(value) is flag
    with pytest.raises(ValueError, match="not a boolean"):
        smoke.boolean("maybe")


@pytest.mark.parametrize("root", ["gs://", "gs:///", "s3://"])
def test_a_root_that_names_no_bucket_is_refused_not_written_locally(root: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    report = smoke.run_smoke(root, require_gpu=False)
    assert report.missing == [f"output root {root!r} names no bucket"] and list(tmp_path.iterdir()) == []

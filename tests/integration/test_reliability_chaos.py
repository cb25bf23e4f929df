"""Worker-level chaos, small: the ``make chaos`` loop for one SIGKILL and one SIGTERM trial.

The benchmark (``bench/chaos.py``, 50 trials) is the real measurement; this keeps its machinery honest in
the test suite: a shard is killed at random moments until it completes, then checked against an
uninterrupted reference run with the same exactly-once checker (every id once, every bad row one dead
letter, vectors within ``COSINE_TOLERANCE``, at most one chunk re-done per kill, each restart's ledger
skipping exactly the committed rows, marker counts equal to the committed rows).
"""

from __future__ import annotations

import json
import random
import signal
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import chaos_lib  # noqa: E402

pytestmark = pytest.mark.integration

ROWS = 30
CHUNK_ROWS = 5


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, chaos_lib.ShardOutputs, float]:
    work = tmp_path_factory.mktemp("chaos")
    src = work / "input.parquet"
    chaos_lib.make_chaos_input(src, ROWS, seed=7)
    outputs, seconds = chaos_lib.run_reference(work / "ref", src, CHUNK_ROWS)
    assert outputs.marker is not None and outputs.rows == ROWS + len(chaos_lib.BAD_ROWS)
    return src, outputs, seconds


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killed_repeatedly_until_complete_is_exactly_once(reference, sig: signal.Signals, tmp_path: Path) -> None:
    src, ref, ref_seconds = reference
    layout = chaos_lib.write_manifest(tmp_path, "chaos", src, chunk_rows=CHUNK_ROWS)
    marker = ref.marker
    chunk_seconds = max(marker.stage_seconds.get("inference", 1.0) / (ROWS // CHUNK_ROWS), 0.05)
    rng = random.Random(1000 + int(sig))
    outcomes = chaos_lib.run_with_kills(layout, sig, rng, max_kills=2, chunk_seconds=chunk_seconds,
                                        startup_kill_prob=0.0)
    outputs = chaos_lib.read_shard(layout.shard_dir(chaos_lib.SHARD))
    verdict = chaos_lib.check_trial(0, sig.name, outputs, ref, outcomes, CHUNK_ROWS)
    assert verdict.kills >= 1 and outcomes[-1].exit_code == 0
    assert (verdict.lost_rows, verdict.duplicate_rows, verdict.unexpected_rows) == (0, 0, 0), verdict
    assert verdict.min_cosine >= chaos_lib.COSINE_TOLERANCE, verdict
    assert verdict.max_rework_chunks <= 1 and verdict.resume_mismatches == 0 and verdict.marker_ok, verdict
    assert verdict.exact
    killed_codes = {o.exit_code for o in outcomes if o.signal}
    # 0 after SIGTERM only when the signal came after the last commit (the shard completed first)
    assert killed_codes <= ({-9} if sig == signal.SIGKILL else {75, 0}), killed_codes
    assert verdict.wrong_exits == 0 and all(o.exit_ok for o in outcomes)


def test_checker_catches_a_lost_and_a_duplicated_row(reference) -> None:
    """The exactly-once checker itself must fail on a bad shard (so a green chaos run means something)."""
    import copy

    _, ref, _ = reference
    bad = copy.deepcopy(ref)
    lost_id, dup_id = sorted(bad.id_counts)[:2]
    del bad.id_counts[lost_id]
    bad.vectors.pop(lost_id)
    bad.id_counts[dup_id] += 1
    verdict = chaos_lib.check_trial(0, "SIGKILL", bad, ref, [], CHUNK_ROWS)
    assert (verdict.lost_rows, verdict.duplicate_rows, verdict.exact) == (1, 1, False)
    off = copy.deepcopy(ref)
    rid = sorted(off.vectors)[0]
    off.vectors[rid] = -off.vectors[rid]
    assert chaos_lib.check_trial(0, "SIGKILL", off, ref, [], CHUNK_ROWS).exact is False


def test_a_wrong_exit_code_is_a_failed_trial_counted_in_the_summary(reference) -> None:
    """A SIGTERM attempt that dies of an abort (-6) after committing everything is not exact, and the
    summary counts it per exit code instead of stopping (``bench/chaos.py``)."""
    _, ref, ref_seconds = reference
    attempts = [chaos_lib.AttemptOutcome("SIGTERM", -6, 1.0, 0, 10, 10, 0, 0, "mid-shard"),
                chaos_lib.AttemptOutcome(None, 0, 1.0, 10, ref.rows - 10, ref.rows - 10, 0, 10)]
    for o in attempts:
        o.exit_ok = chaos_lib.exit_code_ok(o.exit_code, o.signal)
    verdict = chaos_lib.check_trial(0, "SIGTERM", ref, ref, attempts, CHUNK_ROWS)
    assert (verdict.lost_rows, verdict.duplicate_rows, verdict.wrong_exits, verdict.exact) == (0, 0, 1, False)
    good = chaos_lib.check_trial(1, "SIGTERM", ref, ref, [
        chaos_lib.AttemptOutcome("SIGTERM", 75, 1.0, 0, 10, 10, 0, 0, "mid-shard"), attempts[1]], CHUNK_ROWS)
    assert good.exact and good.wrong_exits == 0
    summary = json.loads(chaos_lib.summary_json([verdict, good], ref_seconds, {}))
    assert summary["sigterm_exit_codes"] == {"-6": 1, "75": 1} and summary["unkilled_exit_codes"] == {"0": 2}
    assert (summary["wrong_exit_attempts"], summary["wrong_exit_trials"], summary["exact_trials"]) == (1, 1, 1)
    assert summary["incomplete_trials"] == 0 and summary["sigterm_before_handler"] == 0
    assert not chaos_lib.exit_code_ok(-15, "SIGTERM") and chaos_lib.exit_code_ok(0, "SIGTERM")

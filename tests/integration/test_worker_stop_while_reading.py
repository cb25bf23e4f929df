"""A stop request (SIGTERM) that arrives while the worker is still reading its shard is an interruption.

Found on the live cluster (tests/k8s): a spot preemption of a small shard's pod during the model load made
the producer stop reading before it handed over the shard's only chunk; the worker then took the shard
for exhausted, failed its own coverage check and exited 1 (a crash, retried and counted) instead of 75
(a preemption). The real MiniLM runs in-process here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from batch_contract.enums import ExitCode
from run_helpers import write_run

pytestmark = pytest.mark.integration


def test_stop_before_the_first_chunk_exits_75_and_a_new_attempt_completes(tmp_path: Path,
                                                                         sample_parquet: Path) -> None:
    from batch_worker.runtime import ShardRun, load_context, run_shard

    run_dir = write_run(tmp_path, sample_parquet, rows=20, worker={"reuse": "off"})
    attempt = ShardRun(load_context(run_dir, "00000"))
    attempt.stop._event.set()  # the signal's effect, without its grace-period watchdog (os._exit)
    assert attempt.run(install_signals=False) == ExitCode.INTERRUPTED
    assert attempt.counters.rows_committed == 0
    assert run_shard(run_dir, "00000", install_signals=False) == ExitCode.OK

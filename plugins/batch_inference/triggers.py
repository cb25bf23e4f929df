"""Completion trigger: polls shard markers in storage (storage, not task state, is the truth).

:class:`ShardMarkerTrigger` runs in the triggerer. It keeps one :class:`~batch_contract.runstore.RunStore`
for its whole life, so the manifest is read once and every ``poll_seconds`` a poll
(``batch_inference.completion.gate_check``) costs one listing of the run's markers and progress objects
together (paged) and one read per shard completed since the previous poll (plus the running shards'
progress objects), whatever the number of shards. It logs a progress line, sets the gate's
metrics (two more small reads) and yields
exactly one event: ``success`` (enough rows complete), ``timeout`` (deadline passed; names the missing
shards) or ``error`` (storage failure; never raises, as the provider's triggers do).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent
from batch_contract.runstore import RunStore

from batch_inference.completion import gate_check


class ShardMarkerTrigger(BaseTrigger):
    """Wait until the shards holding ``min_success_ratio`` of the run's rows have markers.

    Args:
        run_dir: ``<output_root>/runs/<run_id>``.
        deadline_epoch: UNIX time (seconds) after which the trigger yields ``timeout``.
        min_success_ratio: fraction of manifest rows that must be in completed shards (0..1).
        poll_seconds: seconds between storage polls.
    """

    def __init__(self, run_dir: str, deadline_epoch: float, min_success_ratio: float = 1.0,
                 poll_seconds: float = 10.0) -> None:
        super().__init__()
        self.run_dir = run_dir
        self.deadline_epoch = deadline_epoch
        self.min_success_ratio = min_success_ratio
        self.poll_seconds = poll_seconds

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "batch_inference.triggers.ShardMarkerTrigger",
            {"run_dir": self.run_dir, "deadline_epoch": self.deadline_epoch,
             "min_success_ratio": self.min_success_ratio, "poll_seconds": self.poll_seconds},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            store = RunStore.open(self.run_dir)  # kept across polls: manifest once, markers once each
            while True:
                status, line = await asyncio.to_thread(gate_check, store, self.min_success_ratio)
                self.log.info("%s", line)
                if status.satisfied:
                    yield TriggerEvent({"status": "success", **status.to_dict()})
                    return
                if time.time() >= self.deadline_epoch:
                    yield TriggerEvent({"status": "timeout", **status.to_dict()})
                    return
                await asyncio.sleep(min(self.poll_seconds, max(0.0, self.deadline_epoch - time.time())))
        except Exception as exc:  # a trigger never raises: the sensor turns this into a task failure
            yield TriggerEvent({"status": "error", "message": f"{type(exc).__name__}: {exc}",
                                "run_dir": self.run_dir})

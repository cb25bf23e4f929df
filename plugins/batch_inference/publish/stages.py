"""Wall-clock seconds per publish step, reported in the summary's ``stage_seconds``."""

from __future__ import annotations

import time


class StageClock:
    """Records wall seconds between laps into ``stages`` (no-op when ``stages`` is None)."""

    def __init__(self, stages: dict[str, float] | None) -> None:
        self.stages = stages
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        if self.stages is not None:
            self.stages[name] = round(self.stages.get(name, 0.0) + now - self.last, 3)
        self.last = now

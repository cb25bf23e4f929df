"""The observability suite's ``BATCH_INFERENCE_ALERT_NOTIFIER``: an Airflow notifier that appends each
run alert as a JSON line to ``$OBS_ALERT_FILE`` (what a Slack or PagerDuty notifier would send), with
where it ran (``async`` in the triggerer, ``sync`` in a task)."""

from __future__ import annotations

import json
import os
from typing import Any

from airflow.sdk import BaseNotifier


class AlertFileNotifier(BaseNotifier):
    """Appends ``{**alert, "delivered": "sync" | "async"}`` to ``$OBS_ALERT_FILE``."""

    def __init__(self, alert: dict[str, Any]) -> None:
        super().__init__()
        self.alert = alert

    def _append(self, how: str) -> None:
        with open(os.environ["OBS_ALERT_FILE"], "a") as out:
            out.write(json.dumps({**self.alert, "delivered": how}) + "\n")

    def notify(self, context: Any) -> None:
        self._append("sync")

    async def async_notify(self, context: Any) -> None:
        self._append("async")


def to_file(alert: dict[str, Any]) -> AlertFileNotifier:
    """``BATCH_INFERENCE_ALERT_NOTIFIER=alert_sink.to_file``."""
    return AlertFileNotifier(alert)

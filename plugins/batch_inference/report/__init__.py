"""Cost report of a batch-inference run: ``report.json`` (schema ``report.schema.json``) + ``report.html``.

Public API:

* :func:`build_report` - aggregate markers/attempts/part files of a run, write both files, return the dict.
* :func:`asset_extra` - small JSON-safe dict of key figures for the Asset event extra.
* :func:`markdown_summary` - Markdown block (tables).
* :func:`text_summary` - plain aligned block for the task log and the terminal.
* :func:`validate_report` - check a report dict against ``report.schema.json``.

Never imports Airflow, torch or vLLM (matplotlib only when rendering HTML). See ``docs/cost-report.md``.
"""

from __future__ import annotations

from batch_inference.pricing import DEFAULT_PRICES, PRICES_TAKEN_ON, cost_params_from_dict
from batch_inference.report.build import REPORT_SCHEMA_VERSION, build_report
from batch_inference.report.schema import SCHEMA_PATH, load_schema, validate_report
from batch_inference.report.summary import asset_extra, markdown_summary, text_summary

__all__ = [
    "DEFAULT_PRICES",
    "PRICES_TAKEN_ON",
    "REPORT_SCHEMA_VERSION",
    "SCHEMA_PATH",
    "asset_extra",
    "build_report",
    "cost_params_from_dict",
    "load_schema",
    "markdown_summary",
    "text_summary",
    "validate_report",
]

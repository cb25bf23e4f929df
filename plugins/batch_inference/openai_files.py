"""OpenAI batch output and error files of a batch DAG run over an OpenAI batch input (``input_format:
openai_batch``), written beside the published table into ``<run_dir>/openai/``.

Every line of the input file ends in exactly one of the two files, in line order:

* an accepted request whose id has a committed result -> an output line
  (:func:`batch_contract.openai_output.output_line`);
* a dead letter of the row (a line refused at plan time, whose reason is the code the ``/v1/batches``
  API's error file uses, or an engine's dead letter such as ``too_long``) -> an error line with that
  code and its detail;
* a row with neither (only when the run did not finish: publish refuses a run that lacks one) ->
  ``batch_failed``.

Results are matched by id (accepted custom ids are unique), dead letters by their row in the converted
file, the run's one input file (which is the line number: refused lines may have no id). Built in memory: at most 50,000 lines.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from batch_contract import storage
from batch_contract.layout import RunLayout, join_uri
from batch_contract.openai_batch import LINE_KEY, REJECTION_KEY, iter_lines
from batch_contract.openai_output import error_line, jsonl, output_line
from batch_contract.runstore import RunStore

from batch_inference import openai_input
from batch_inference.openai_api.results import iter_results
from batch_inference.ui.deadletters import iter_dead_letters

OUTPUT_NAME = "output.jsonl"
ERRORS_NAME = "errors.jsonl"
NOT_RUN_CODE = "batch_failed"
"""Error code of a line with neither a result nor a dead letter (as the API's for a failed batch)."""


@dataclass(frozen=True)
class RunFiles:
    """The files written (URIs) and their line counts (``output_lines + error_lines`` = input lines)."""

    output_uri: str
    errors_uri: str
    output_lines: int
    error_lines: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: ``{"output", "errors", "output_lines", "error_lines"}``."""
        return {"output": self.output_uri, "errors": self.errors_uri, "output_lines": self.output_lines,
                "error_lines": self.error_lines}


def build_lines(batch_id: str, request: Mapping[str, Any], rows: Iterable[Mapping[str, Any]],
                results: Mapping[str, Mapping[str, Any]], dead: Mapping[int, Mapping[str, Any]],
                created: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The output and error objects of a run (module docstring), pure.

    Args:
        batch_id: the run id (the lines' derived ids).
        request: the run's ``request.json`` (``endpoint``, ``model``).
        rows: the converted input rows, in line order.
        results: committed result rows by id (part-file columns).
        dead: dead-letter rows by row number in the converted file (``reason``, ``detail``).
        created: Unix seconds for the response bodies' ``created``.

    Returns:
        ``(output objects, error objects)``; each row is in exactly one of the two lists.
    """
    outputs, errors = [], []
    for row in rows:
        line, cid = int(row[LINE_KEY]), row.get("id")
        refused = row.get(REJECTION_KEY)
        if refused is None and cid in results:
            outputs.append(output_line(batch_id, request["endpoint"], request["model"] or "", created, results[cid]))
        elif line in dead:
            d = dead[line]
            errors.append(error_line(batch_id, cid, line, str(d.get("reason")), str(d.get("detail"))))
        else:
            errors.append(error_line(batch_id, cid, line, NOT_RUN_CODE,
                                     "the request was not run: the run ended without a result or a dead letter for it"))
    return outputs, errors


def write_run_files(run_dir: str) -> RunFiles | None:
    """Write ``<run_dir>/openai/output.jsonl`` and ``errors.jsonl`` (replacing earlier ones: a retried
    publish writes the same lines) for a run over an OpenAI batch input; ``None`` for any other run.

    Raises:
        OSError / StorageError: a committed file or the converted input cannot be read or a file written.
    """
    request = openai_input.read_request(run_dir)
    if request is None:
        return None
    store = RunStore(RunLayout.from_run_dir(run_dir))
    base = openai_input.folder(run_dir)
    data = storage.read_bytes(join_uri(base, openai_input.INPUT_NAME))
    rows = [json.loads(x) for _n, x in iter_lines(data)]
    dead = {int(d["source_row"]): d for d in iter_dead_letters(store) if d.get("source_row") is not None}
    results = {r["id"]: r for r in iter_results(store)}
    outputs, errors = build_lines(store.manifest.run_id, request, rows, results, dead, int(time.time()))
    files = RunFiles(output_uri=join_uri(base, OUTPUT_NAME), errors_uri=join_uri(base, ERRORS_NAME),
                     output_lines=len(outputs), error_lines=len(errors))
    storage.write_replace(files.output_uri, jsonl(outputs))
    storage.write_replace(files.errors_uri, jsonl(errors))
    return files

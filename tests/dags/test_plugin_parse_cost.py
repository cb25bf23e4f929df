"""The Batch inference UI plugin does not slow DAG parsing: DAG files parse, and plugins load, in about the
same CPU time with the repository's plugins folder (the plugin registered) as with an empty one.

Method of ``test_parse_time.py``: a fresh interpreter per measurement that first imports what the DAG
processor has loaded before it parses a file (``airflow.sdk``, the DagBag, the plugins manager), then
times with ``time.process_time()``: loading the plugins (what the DAG processor does when it serializes
its first DAG: ``plugins_manager.ensure_plugins_loaded()``) and ``DagBag(dag_folder=<file>)``.
Each configuration is measured ``REPEATS`` times and the minimum kept (the machine is shared).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DAG_FILE = REPO / "dags" / "batch_inference_dags.py"
REPEATS = 3
PLUGIN_LOAD_BUDGET_CPU_S = 0.05
"""CPU the plugin may add to loading plugins (it imports only ``BaseOperatorLink``: ~3 ms)."""

MEASURE = textwrap.dedent("""
    import json, sys, time
    import airflow.sdk
    from airflow import plugins_manager
    from airflow.dag_processing.dagbag import DagBag
    start = time.process_time()
    plugins_manager.ensure_plugins_loaded()
    plugins_cpu = time.process_time() - start
    names = [p.name for p in plugins_manager._get_plugins()[0]]
    start = time.process_time()
    bag = DagBag(dag_folder=sys.argv[1])
    parse_cpu = time.process_time() - start
    print("RESULT " + json.dumps({"plugins_cpu": plugins_cpu, "parse_cpu": parse_cpu, "plugins": names,
                                  "errors": bag.import_errors, "dags": len(bag.dag_ids)}))
""")


def _measure(plugins_folder: Path) -> dict:
    env = {**os.environ, "BATCH_INFERENCE_RUNNERS": "local", "AIRFLOW__CORE__PLUGINS_FOLDER": str(plugins_folder),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "PYTHONPATH": os.pathsep.join([str(REPO / "plugins"), os.environ.get("PYTHONPATH", "")])}
    runs = []
    for _ in range(REPEATS):
        proc = subprocess.run([sys.executable, "-c", MEASURE, str(DAG_FILE)], env=env, capture_output=True,
                              text=True, timeout=180)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
        runs.append(json.loads(lines[-1][len("RESULT "):]))
    assert all(r["errors"] == {} and r["dags"] == 3 for r in runs), runs
    return {"plugins": runs[0]["plugins"], "plugins_cpu": min(r["plugins_cpu"] for r in runs),
            "parse_cpu": min(r["parse_cpu"] for r in runs)}


def test_plugin_adds_no_parse_cost(tmp_path: Path) -> None:
    empty = tmp_path / "no_plugins"
    empty.mkdir()
    without = _measure(empty)
    with_plugin = _measure(REPO / "plugins")
    print(f"\nplugins load CPU: {without['plugins_cpu']:.4f} s without, {with_plugin['plugins_cpu']:.4f} s with the "
          f"UI plugin; DAG file parse CPU: {without['parse_cpu']:.3f} s without, {with_plugin['parse_cpu']:.3f} s with")
    # installed providers' entry-point plugins (the OpenLineage provider's) load in both measurements
    assert "batch_inference" not in without["plugins"]
    assert sorted(with_plugin["plugins"]) == sorted([*without["plugins"], "batch_inference"])
    assert with_plugin["plugins_cpu"] - without["plugins_cpu"] <= PLUGIN_LOAD_BUDGET_CPU_S, (without, with_plugin)
    # the parse itself does not depend on the plugin (noise margin: the machine is shared)
    assert with_plugin["parse_cpu"] <= without["parse_cpu"] * 1.5 + 0.05, (without, with_plugin)

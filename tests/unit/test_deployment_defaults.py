"""Defaults a deployment sets through its environment: the runner the DAGs default to, and the DuckDB
file's default when the output root is a bucket."""

from __future__ import annotations

from pathlib import Path

import pytest
from batch_inference.params import default_duckdb_path
from hypothesis import given
from hypothesis import strategies as st

SEGMENT = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=12)


@given(scheme=st.sampled_from(["gs", "s3", "az", "abfs", "https"]), parts=st.lists(SEGMENT, min_size=1, max_size=4))
def test_a_remote_output_root_gives_a_local_duckdb_file(scheme: str, parts: list[str]) -> None:
    repo = Path("/srv/app")
    path = default_duckdb_path(f"{scheme}://" + "/".join(parts), repo)
    assert path == str(repo / "output" / "warehouse.duckdb")


@given(parts=st.lists(SEGMENT, min_size=1, max_size=4), file_uri=st.booleans())
def test_a_local_output_root_holds_the_duckdb_file(parts: list[str], file_uri: bool) -> None:
    root = "/" + "/".join(parts)
    path = default_duckdb_path(("file://" if file_uri else "") + root, Path("/srv/app"))
    assert path == str(Path(root) / "warehouse.duckdb") and "://" not in path


@pytest.mark.parametrize(("runners", "default"), [(("local", "kubernetes"), "local"),
                                                  (("kubernetes", "local"), "kubernetes"),
                                                  (("local",), "local")])
def test_the_first_enabled_runner_is_the_runner_params_default(runners: tuple[str, ...], default: str) -> None:
    from batch_inference.dag_factory import build_all
    from batch_inference.pod_spec import K8sSettings

    dags = build_all(K8sSettings(image="r/w@sha256:" + "a" * 64), runners)
    for dag_id in ("batch_inference_backfill", "batch_inference_nightly", "batch_inference_on_model_upgrade"):
        assert dags[dag_id].params.get_param("runner").value == default, dag_id

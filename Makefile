# Two commands on a fresh machine:  `make run`  (the main job end to end)  and  `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: venv test test-unit lint run render-k8s bench-encoder clean

venv:
	@bash scripts/setup_venv.sh

lint: venv
	$(VENV)/bin/ruff check plugins worker_image dags tests bench

test-unit: venv
	$(PY) -m pytest tests/unit -q

test: venv lint
	$(PY) -m pytest tests -q

bench-encoder: venv
	$(PY) bench/encoder.py

.PHONY: bench-storage
bench-storage: venv
	$(PY) bench/storage.py

clean:
	rm -rf build output airflow_home .pytest_cache

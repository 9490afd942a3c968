# The kit's entry points. `make test` builds its own CPU test environment (vLLM 0.34.0 on torch
# 2.13.0 CPU) once and reuses it; the pip cache keeps a second build from downloading again.

PYTHON ?= python3
PROFILE ?=
TEST_VENV := .venv
TEST_PY := $(TEST_VENV)/bin/python
TEST_STAMP := $(TEST_VENV)/.kit-test-env
KIT_VENV := .venv-kit
KIT_PY := $(KIT_VENV)/bin/python
KIT_STAMP := $(KIT_VENV)/.kit-env
CPU_ENV := VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 CUDA_VISIBLE_DEVICES=
PRISTINE_VLLM = $(shell $(TEST_PY) -c 'import importlib.util as u; print(u.find_spec("vllm").submodule_search_locations[0])')
PATCHED := $(TEST_VENV)/vllm-patched

.PHONY: help test lint plan configure doctor fetch capacity up down logs pin build build-cpu smoke bench compare demo \
	soak top bench-client patched-vllm patches-report lock e2e

help:
	@echo "make test                 build the CPU test environment and run every test"
	@echo "make plan PROFILE=name    print the exact command and environment a profile runs"
	@echo "make configure PROFILE=name   write compose/.env, then plain docker compose runs it"
	@echo "make fetch PROFILE=name   download and verify the profile's weights into the cache volume"
	@echo "make doctor PROFILE=name  check this host (driver, GPUs, IOMMU/ACS, disk...) first"
	@echo "make capacity PROFILE=name   the KV cache it will get (vLLM's sizing in its image, CPU)"
	@echo "make up PROFILE=name      configure, then docker compose up -d"
	@echo "make down / make logs     stop / follow what compose/.env runs"
	@echo "make demo                 no GPU: build what is missing, serve cpu-tiny, smoke it, leave it up"
	@echo "make e2e                  the whole user path on the CPU image, no GPU (Docker needed)"
	@echo "make smoke PROFILE=name   check a started server against its profile"
	@echo "make bench PROFILE=name   qualification bench against a started server (receipt in results/)"
	@echo "make compare A=a.json B=b.json   the seed-style A/B table of two receipts"
	@echo "make soak PROFILE=name DURATION=30m   mixed load on a started server, a line per minute"
	@echo "make top PROFILE=name     the started server(s), live from /metrics (one screen)"
	@echo "make bench-client         the bench client's own speed against vLLM's client"

# The Makefile is a prerequisite too: the torch and vLLM pins below live here.
$(TEST_STAMP): tests/env/requirements-cpu.txt pyproject.toml Makefile
	$(PYTHON) -m venv $(TEST_VENV)
	$(TEST_PY) -m pip install --quiet --upgrade pip
	$(TEST_PY) -m pip install --quiet torch==2.13.0
	$(TEST_PY) -m pip install --quiet --no-deps vllm==0.34.0
	$(TEST_PY) -m pip install --quiet -r tests/env/requirements-cpu.txt
	$(TEST_PY) -m pip install --quiet --no-deps -e .
	$(TEST_PY) -m pip download --quiet --no-deps lmcache==0.5.6 -d $(TEST_VENV)/wheels
	$(TEST_PY) -m pip download --quiet --no-deps vllm==0.33.0 -d $(TEST_VENV)/wheels
	touch $@

$(KIT_STAMP): pyproject.toml
	$(PYTHON) -m venv $(KIT_VENV)
	$(KIT_PY) -m pip install --quiet -e .
	touch $@

lint: $(TEST_STAMP)
	$(TEST_PY) -m ruff check launch smoke serving kvgeometry capacity tests patches docker

# The kit's tests (pristine vLLM where vLLM is used) spread over TEST_WORKERS processes (more
# than two cores: many tests wait on a server or a timeout; the Docker engine's tests go to one
# worker, tests/conftest.py), then the patched planner's invariants, then vLLM's own planner
# tests unpatched and patched side by side (one process cannot import two vLLMs).
TEST_WORKERS ?= 4
test: lint patched-vllm
	$(CPU_ENV) $(TEST_PY) -m pytest --numprocesses $(TEST_WORKERS) --dist loadgroup
	$(CPU_ENV) KIT_PATCHED_VLLM=1 PYTHONPATH=$(PATCHED) $(TEST_PY) -m pytest tests/planner
	$(CPU_ENV) $(TEST_PY) tests/upstream/run_upstream.py --patched $(PATCHED) --work $(TEST_VENV)/vllm-upstream

# A copy of the pristine installed vLLM with patches/vllm applied (the series fails loudly).
patched-vllm: $(TEST_STAMP)
	$(TEST_PY) patches/apply_series.py --copy-from $(PRISTINE_VLLM) --dest $(PATCHED)

# Planner-level evidence: tokens and blocks before and after each patch, seed-shaped specs.
patches-report: patched-vllm
	$(CPU_ENV) PYTHONPATH=$(PATCHED) $(TEST_PY) -m tests.planner.capacity_report

plan: $(KIT_STAMP)
	@test -n "$(PROFILE)" || { echo "usage: make plan PROFILE=<name>; profiles:"; $(KIT_PY) -m launch list; exit 2; }
	$(KIT_PY) -m launch render $(PROFILE) --predict

# compose/.env for a profile (REPLICAS=N for CPU profiles, GPU_SETS="0,1,2,3 4,5,6,7" for GPU
# ones): afterwards `docker compose up -d` / `down` / `logs -f` in compose/ run exactly it.
REPLICAS ?=
configure: $(KIT_STAMP)
	@test -n "$(PROFILE)" || { echo "usage: make configure PROFILE=<name> [REPLICAS=N]"; exit 2; }
	$(KIT_PY) -m launch configure $(PROFILE) $(if $(REPLICAS),--replicas $(REPLICAS)) $(if $(MONITORING),--monitoring)

# The profile's model (and draft) at their pinned revisions into the weights volume, verified,
# through compose's `fetch` service (the profile's image); run again to resume. CHECK=1 only asks
# (every file read against the digest recorded when it was verified).
fetch: $(KIT_STAMP)
	@test -n "$(PROFILE)" || { echo "usage: make fetch PROFILE=<name> [CHECK=1]"; exit 2; }
	$(KIT_PY) -m launch fetch $(PROFILE) $(if $(CHECK),--check)

# The host against the profile before `make up` (driver, GPUs, container toolkit, IOMMU and ACS,
# topology, memory, disk, port, HF_TOKEN); exit 2 on any fail. DOCTOR_ARGS e.g. "--lspci FILE".
DOCTOR_ARGS ?=
doctor: $(KIT_STAMP)
	@test -n "$(PROFILE)" || { echo "usage: make doctor PROFILE=<name> [DOCTOR_ARGS=...]"; exit 2; }
	$(KIT_PY) -m launch doctor $(PROFILE) $(DOCTOR_ARGS)

# The KV cache a profile will get, from vLLM's own sizing in the profile's image on the CPU
# (no GPU, no weights). CAPACITY_ARGS e.g. "--budget 16GiB --for 4x1048576 --largest-context --json".
CAPACITY_ARGS ?=
capacity: $(KIT_STAMP)
	@test -n "$(PROFILE)" || { echo "usage: make capacity PROFILE=<name> [CAPACITY_ARGS=...]"; exit 2; }
	$(KIT_PY) -m launch capacity $(PROFILE) $(CAPACITY_ARGS)

up: $(KIT_STAMP)
	@test -n "$(PROFILE)" || { echo "usage: make up PROFILE=<name>"; exit 2; }
	$(KIT_PY) -m launch up $(PROFILE) $(if $(REPLICAS),--replicas $(REPLICAS)) $(if $(MONITORING),--monitoring)

down:
	cd compose && docker compose down

logs:
	cd compose && docker compose logs --follow

# Build and tag the image from pinned inputs (needs a Docker engine and the base in the lock).
# BUILD_ARGS e.g. "--trust-host-ca --allow-dirty" for a test build.
BUILD_ARGS ?=
build: $(KIT_STAMP)
	$(KIT_PY) docker/build.py --engine cuda $(if $(TAG),--tag $(TAG)) $(BUILD_ARGS)

build-cpu: $(KIT_STAMP)
	$(KIT_PY) docker/build.py --engine cpu $(if $(TAG),--tag $(TAG)) $(BUILD_ARGS)

# No GPU needed: the Debian base and the CPU image when missing (pinned as this engine's image ID,
# no registry), cpu-tiny started with plain compose, healthy, `make smoke`; left running
# (launch/demo.py). A second run reuses all of it. BUILD_ARGS as for build-cpu.
demo: $(KIT_STAMP)
	$(KIT_PY) -m launch demo $(if $(BUILD_ARGS),--build-args "$(BUILD_ARGS)")

# The whole user path on a real Docker engine and vLLM's CPU build (tests/e2e/run.py): build,
# push, pin, compose up by digest, smoke, bench, router, failures, down. Needs dockerd, the
# compose plugin and a registry on 127.0.0.1 (E2E_REGISTRY); `.ci/run` starts them.
e2e: $(TEST_STAMP) $(KIT_STAMP)
	$(TEST_PY) tests/e2e/run.py

# Resolve a tag to its digest through the registry API and write it into compose/images.lock.
SOURCE ?= kit
pin: $(KIT_STAMP)
	@test -n "$(IMAGE)" || { echo "usage: make pin IMAGE=repo:tag [SOURCE=kit|qualified|qualified-split|cpu|base|cpu-base|prometheus|grafana|dcgm-exporter] [LOCAL=1]"; exit 2; }
	$(KIT_PY) -m launch pin $(IMAGE) --source $(SOURCE) $(if $(LOCAL),--local)

SMOKE_ARGS ?=
smoke: $(KIT_STAMP)
	@test -n "$(PROFILE)" || { echo "usage: make smoke PROFILE=<name> [LOG=server.log] [URL=http://127.0.0.1:8000]"; exit 2; }
	$(KIT_PY) -m smoke check --profile $(PROFILE) $(if $(URL),--url $(URL)) $(if $(LOG),--log $(LOG)) $(SMOKE_ARGS)

# docker/requirements*.lock: every Python package of each engine's image, hash-locked (pip
# --require-hashes; docker/requirements-overrides.txt says which pins are replaced and why); the CUDA
# lock is then audited against its wheels (docker/lock_audit.py: no
# path installed by two distributions, nvcc of torch's CUDA version). The CPU lock needs
# TORCH_CPU_FIND_LINKS: a directory or index page holding torch-2.13.0+cpu for CPython 3.11,
# which PyPI does not serve.
TORCH_CPU_FIND_LINKS ?=
lock: $(TEST_STAMP)
	@test -n "$(TORCH_CPU_FIND_LINKS)" || { echo "make lock: TORCH_CPU_FIND_LINKS is empty; set it to a directory or page with torch-2.13.0+cpu for CPython 3.11 (PyPI does not serve it), e.g. make lock TORCH_CPU_FIND_LINKS=/path/to/wheels"; exit 2; }
	$(TEST_VENV)/bin/uv pip compile docker/requirements.in --override docker/requirements-overrides.txt \
		--generate-hashes --python-version 3.13 \
		--python-platform x86_64-manylinux_2_28 --no-header --output-file docker/requirements.lock
	$(TEST_PY) docker/lock_audit.py docker/requirements.lock
	$(TEST_VENV)/bin/uv pip compile docker/requirements-cpu.in --generate-hashes \
		--python-version 3.11 --python-platform x86_64-manylinux_2_28 --no-header \
		--find-links $(TORCH_CPU_FIND_LINKS) --no-emit-package torchvision \
		--no-emit-package torchaudio --no-emit-package torchcodec --no-emit-package triton \
		--output-file docker/requirements-cpu.lock

# Qualification bench against a started server; BENCH_ARGS e.g. "--duration 30 --log server.log".
BENCH_ARGS ?=
bench: $(KIT_STAMP)
	@test -n "$(PROFILE)" || { echo "usage: make bench PROFILE=<name> [URL=...] [BENCH_ARGS=...]"; exit 2; }
	$(KIT_PY) -m serving bench --profile $(PROFILE) $(if $(URL),--url $(URL)) $(BENCH_ARGS)

# A soak against a started server: mixed load at max_num_seqs, a line per minute, a receipt in
# results/; fails on a failed request or RSS growth past the bound. SOAK_ARGS e.g. "--interval 5m".
SOAK_ARGS ?=
soak: $(KIT_STAMP)
	@test -n "$(PROFILE)" -a -n "$(DURATION)" || { echo "usage: make soak PROFILE=<name> DURATION=30m [URL=...] [SOAK_ARGS=...]"; exit 2; }
	$(KIT_PY) -m serving soak --profile $(PROFILE) --duration $(DURATION) $(if $(URL),--url $(URL)) $(SOAK_ARGS)

# `make top PROFILE=name`: the server (every replica when scaled out) from its /metrics, one
# screen redrawn each second until Ctrl-C; TOP_ARGS="--once --json" for one interval as JSON.
top: $(KIT_STAMP)
	$(KIT_PY) -m serving top $(if $(PROFILE),--profile $(PROFILE)) $(if $(URL),--url $(URL)) $(TOP_ARGS)

compare: $(KIT_STAMP)
	@test -n "$(A)" -a -n "$(B)" || { echo "usage: make compare A=control.json B=candidate.json"; exit 2; }
	$(KIT_PY) -m serving compare $(A) $(B)

# The client's own throughput and CPU cost against vLLM 0.33.0's bench client (a benchmark).
bench-client: $(TEST_STAMP)
	$(CPU_ENV) $(TEST_PY) -m tests.bench_client

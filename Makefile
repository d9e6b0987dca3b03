# Tidemark's two commands: `make demo` and `make test`. Everything else is a step of those.
SHELL := /bin/bash
PY ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: install demo docs docs-check test test-extended test-differential lint unit model integration faults faults-table soak mutants bench bench-small bench-quick bench-avro bench-plan kafka-up kafka-down clean lock
.PHONY: browser bench-view bench-observe airflow airflow-down airflow-celery airflow-celery-down differential

# uv (pinned; from PyPI, once per machine into ~/.cache/tidemark/uv-VERSION, else into the venv) creates the venv and
# installs the locked set; where no uv installs, the venv's pip does. Measured in fresh clones on 2 cores that other
# test runs kept at a load average of 15 to 30: 16 s with a warm uv cache (pip with a warm pip cache: 8 min 53 s);
# 6 min 8 s with no cache at all, most of it pyspark's 400 MB sdist downloaded and built. The cache is tried alone
# first (--offline: exact pins need no index), because the package index here answers uv's revalidation of that sdist
# as modified, so an online install with a warm cache fetches and builds it again (2 min); a cache that lacks anything
# fails that attempt at once and the online install runs.
UV_VERSION := 0.13.8
UV_HOME ?= $(HOME)/.cache/tidemark/uv-$(UV_VERSION)
$(STAMP):
	@$(PY) -c 'import sys; assert sys.version_info[:2] == (3, 11), f"Tidemark needs Python 3.11, found {sys.version.split()[0]}"'
	@test -x $(UV_HOME)/bin/uv || $(PY) -m pip install -q --disable-pip-version-check --target $(UV_HOME) uv==$(UV_VERSION) \
	  >/dev/null 2>&1 || true
	@test -x $(BIN)/python || { test -x $(UV_HOME)/bin/uv && $(UV_HOME)/bin/uv venv -q --seed --python $(PY) $(VENV); } || \
	  $(PY) -m venv $(VENV)
	@echo "installing pinned dependencies into $(VENV) ..."
	@time ( uv=$(UV_HOME)/bin/uv; \
	  test -x $$uv || { $(BIN)/pip install -q --disable-pip-version-check uv==$(UV_VERSION) && uv=$(BIN)/uv; } ; \
	  if $$uv --version 2>/dev/null | grep -qE "^uv $(UV_VERSION)( |$$)"; then \
	    pip="$$uv pip install -q --python $(BIN)/python"; \
	    { $$pip --offline -r requirements-dev.txt 2>/dev/null || $$pip -r requirements-dev.txt; } && \
	    { $$pip --offline --no-deps -e . 2>/dev/null || $$pip --no-deps -e . ; } ; \
	  else \
	    echo "uv $(UV_VERSION) did not install: pip installs instead"; \
	    $(BIN)/pip install -q --upgrade pip && $(BIN)/pip install -q -r requirements-dev.txt && \
	    $(BIN)/pip install -q --no-deps -e . ; \
	  fi )
	@rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)

demo: install
	$(BIN)/tidemark demo

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache
	$(BIN)/pytest -q -n 0 tests/unit/test_import_graph.py

# Three workers by default (TEST_WORKERS=0 runs in one process), sharing one Kafka cluster; tests
# that share another costly server (the fault suite, the e2e tests' Airflow, the secured cluster,
# the Spark clusters) each stay on one worker (tests/conftest.py, ONE_WORKER_GROUPS and its
# scheduler). On 2 cores the suite waits on brokers, JVMs and timeouts a third of the time: with
# those groups, a third worker took pytest from 19 min 54 s to 18 min 46 s in a fresh clone, and one
# Kafka cluster for the three instead of one each to 14 min 51 s.
TEST_WORKERS ?= 3
test: lint browser docs-check
	$(BIN)/pytest -v --durations=25 -m "not extended" $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS)) $(PYTEST_ARGS)

# The documentation site: the reference pages under docs/reference/ regenerated from the code (feed keys, CLI, event
# kinds, metrics), then MkDocs with --strict, so a link to a missing page or anchor fails. Re-run after adding a feed
# key, command, flag, event kind or metric, and commit docs/reference/. `make test` runs docs-check: the same build,
# failing (instead of rewriting) when a committed reference page differs from the code.
docs: install
	$(BIN)/python -m tests.support.docs_reference
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

docs-check: install
	$(BIN)/python -m tests.support.docs_reference --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# The slow variants `make test` leaves out (pytest marker `extended`): the benchmark harness's
# own tests, the fault scenarios on the S3 + PostgreSQL shape with local staging (and, for those
# the shapes share, on every shape but the embedded default), an Iceberg feed on a Spark cluster
# without a shared disk, the dev tool's retry of a taken Airflow port.
test-extended: install
	$(BIN)/pytest -v --durations=10 -m extended $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS)) $(PYTEST_ARGS)

# The Avro and Protobuf differential tests with many more examples than `make test` runs: Avro at the level of the
# decoding functions (tests/integration/spark/test_differential.py, 25 examples of up to 8 schemas each in `make test`)
# and end to end on the cluster and registry (tests/integration/job/test_avro_differential.py, 1), Protobuf at the
# level of the workers' decoding (tests/unit/spark/test_protobuf_differential.py, 200) and end to end
# (tests/integration/job/test_protobuf_differential.py, 1). Each prints the counts it generated and checked; the
# counts and time of a run are in docs/schemas.md. `make differential` runs the JSON Schema ones too.
DIFFERENTIAL_EXAMPLES ?= 600
DIFFERENTIAL_UNIT_EXAMPLES ?= 5000
DIFFERENTIAL_E2E_EXAMPLES ?= 15
test-differential: install
	TIDEMARK_DIFFERENTIAL_EXAMPLES=$(DIFFERENTIAL_EXAMPLES) TIDEMARK_DIFF_EXAMPLES=$(DIFFERENTIAL_UNIT_EXAMPLES) \
	  TIDEMARK_DIFF_E2E_EXAMPLES=$(DIFFERENTIAL_E2E_EXAMPLES) $(BIN)/pytest -v -n 0 --timeout 3600 --durations=10 \
	  tests/integration/spark/test_differential.py tests/unit/spark/test_protobuf_differential.py \
	  tests/integration/job/test_avro_differential.py tests/integration/job/test_protobuf_differential.py $(PYTEST_ARGS)

# The e2e browser test drives Debian's Chromium with Playwright (Playwright's own browser download is unreachable).
browser:
	@command -v chromium >/dev/null || { echo "installing Debian's chromium for the browser test ..."; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

unit: install
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

# The fault suite alone (it also runs in `make test`); faults-table regenerates docs/faults.md from its last run.
faults: install
	$(BIN)/pytest tests/faults $(PYTEST_ARGS)

faults-table: faults
	$(BIN)/python -m tests.faults.table

# The slow variant: many runs in a row with data arriving and failures injected (scenario 21).
soak: install
	TIDEMARK_SOAK_RUNS=$${TIDEMARK_SOAK_RUNS:-60} $(BIN)/pytest tests/faults -k soak -s --timeout 3600 $(PYTEST_ARGS)

# The commit protocol's model test over every interleaving with a crash at every point (make test runs a sample).
model: install
	TIDEMARK_MODEL_ALL=1 $(BIN)/pytest tests/unit/runs/test_protocol_model.py -s $(PYTEST_ARGS)

# The differential tests (tests named *differential*) with many more generated cases than `make test` runs; they
# print how many they generated and checked. TIDEMARK_DIFF_EXAMPLES: schemas at the level of the decoding
# functions; TIDEMARK_DIFF_E2E_EXAMPLES: schemas through whole runs on the cluster and registry.
differential: install
	TIDEMARK_DIFF_EXAMPLES=$${TIDEMARK_DIFF_EXAMPLES:-2000} TIDEMARK_DIFF_E2E_EXAMPLES=$${TIDEMARK_DIFF_E2E_EXAMPLES:-10} \
	TIDEMARK_DIFFERENTIAL_EXAMPLES=$${TIDEMARK_DIFFERENTIAL_EXAMPLES:-1000} \
	  $(BIN)/pytest tests/unit tests/integration -k differential -s --timeout 3600 $(PYTEST_ARGS)

# Each listed breakage applied in a scratch copy, with the tests that must catch it (tests/mutants/run.py);
# red when a mutant survives. Not part of `make test`. MUTANTS_ARGS: --only NAME..., --no-baseline, --keep. The unbroken baseline runs first.
mutants: install
	$(BIN)/python -m tests.mutants.run $(MUTANTS_ARGS)

# Generated mutants (mutmut) of the modules that decide what is shown, kept, deleted or masked, each against its own
# fast test selection (tests/mutants/generated.py), at most MUTATION_JOBS processes; red when a module kills fewer than
# 85 %. MUTATION_ARGS: module names, --all (also the modules listed later), --doc (the summary into docs/faults.md).
# mutation-diff: only the mutants on lines changed since BASE (the working tree included); red when one survives.
MUTATION_JOBS ?= 2
.PHONY: mutation mutation-diff
mutation: install
	$(BIN)/python -m tests.mutants.generated --jobs $(MUTATION_JOBS) $(MUTATION_ARGS)

mutation-diff: install
	@test -n "$(BASE)" || { echo "usage: make mutation-diff BASE=<git revision>"; exit 2; }
	$(BIN)/python -m tests.mutants.generated --all --jobs $(MUTATION_JOBS) --base $(BASE) $(MUTATION_ARGS)

# Benchmarks run on the embedded cluster (started if needed) unless TIDEMARK_BOOTSTRAP_SERVERS is set.
bench: install
	@test -n "$$TIDEMARK_BOOTSTRAP_SERVERS" || $(BIN)/tidemark kafka up
	$(BIN)/python -m tests.bench.read $(BENCH_ARGS)
	$(BIN)/python -m tests.bench.avro $(BENCH_AVRO_ARGS)
	$(BIN)/python -m tests.bench.small $(BENCH_SMALL_ARGS)

# The small-run table alone: `tidemark run` vs Spark's Kafka source, 0 / 1,000 / 100,000 records.
bench-small: install
	@test -n "$$TIDEMARK_BOOTSTRAP_SERVERS" || $(BIN)/tidemark kafka up
	$(BIN)/python -m tests.bench.small $(BENCH_SMALL_ARGS)

bench-quick: install
	@test -n "$$TIDEMARK_BOOTSTRAP_SERVERS" || $(BIN)/tidemark kafka up
	$(BIN)/python -m tests.bench.read --quick $(BENCH_ARGS)
	$(BIN)/python -m tests.bench.avro --quick $(BENCH_AVRO_ARGS)

# The Avro rows alone (5M records; BENCH_AVRO_ARGS='--quick' for 500k): needs a schema registry, started
# for the run unless TIDEMARK_SCHEMA_REGISTRY_URL names one.
bench-avro: install
	@test -n "$$TIDEMARK_BOOTSTRAP_SERVERS" || $(BIN)/tidemark kafka up
	$(BIN)/python -m tests.bench.avro $(BENCH_AVRO_ARGS)

# Planning benchmark: plans a 1,000-partition feed on the running cluster; prints median/p99 and requests.
bench-plan: install
	@test -n "$$TIDEMARK_BOOTSTRAP_SERVERS" || $(BIN)/tidemark kafka up
	$(BIN)/python -m tests.bench.plan $(BENCH_PLAN_ARGS)

# Maintenance benchmark: 1,000 plans of 1,000 records into an Iceberg table, then `maintain`: files, bytes, snapshots,
# scan planning and read time before and after (BENCH_MAINTAIN_ARGS='--plans 200' for a quicker run). No Kafka, no Spark.
.PHONY: bench-maintain
bench-maintain: install
	$(BIN)/python -m tests.bench.maintain --out docs/benchmarks/bench-maintain.json $(BENCH_MAINTAIN_ARGS)

# Verify benchmark: 10 million records produced to a fresh topic and published as a Parquet feed's output (no Spark),
# then `tidemark verify`'s wall and CPU time (BENCH_VERIFY_ARGS='--records 1000000' for a smaller run). Needs the cluster.
.PHONY: bench-verify
bench-verify: install
	$(BIN)/python -m tests.bench.verify --out docs/benchmarks/bench-verify.json $(BENCH_VERIFY_ARGS)

# Keyed-table merge: a plan of N changes over a table of M keys, Tidemark's merge against pyiceberg's Table.upsert,
# side by side (TIDEMARK_BENCH_CHANGES_N / _M / _ROUNDS; small by default). No Kafka, no Spark.
.PHONY: bench-changes
bench-changes: install
	$(BIN)/python -m tests.bench.changes $(BENCH_CHANGES_ARGS)

# View benchmark: renders a 200-partition feed's Tidemark view; prints the median.
bench-view: install
	@test -n "$$TIDEMARK_BOOTSTRAP_SERVERS" || $(BIN)/tidemark kafka up
	$(BIN)/python -m tests.bench.view $(BENCH_VIEW_ARGS)

# Dead-letter page benchmark: 10,000, 100,000 and 1,000,000 dead letters (Parquet quarantine), each size's page rendered
# in a fresh process: first render, then the kept counts; resident and Arrow memory (BENCH_DEADLETTERS_ARGS='--sizes
# 10000,100000' for a quicker run). No Kafka, no Spark. Writes docs/benchmarks/bench-deadletters-view.json.
.PHONY: bench-deadletters
bench-deadletters: install
	$(BIN)/python -m tests.bench.deadletters_view --out docs/benchmarks/bench-deadletters-view.json $(BENCH_DEADLETTERS_ARGS)

# Lag-trigger cost: triggerer CPU per idle lag-triggered feed per hour (20 feeds, 30 s checks) against an idle cron
# feed at */15 (4 runs an hour), on a local Airflow with its triggerer (BENCH_TRIGGER_ARGS='--feeds 20 --minutes 3').
.PHONY: bench-trigger
bench-trigger: install
	@test -n "$$TIDEMARK_BOOTSTRAP_SERVERS" || $(BIN)/tidemark kafka up
	$(BIN)/python -m tests.bench.trigger $(BENCH_TRIGGER_ARGS)

# DAG parse benchmark: Airflow parsing Tidemark's DAG files with 1, 10 and 100 feed files (BENCH_DAGPARSE_ARGS='--bad'
# adds a malformed one); prints medians and the network connections tried (must be 0). No Kafka needed.
.PHONY: bench-dagparse
bench-dagparse: install
	$(BIN)/python -m tests.bench.dagparse $(BENCH_DAGPARSE_ARGS)

# Hundred-feed benchmark on the Celery shape (two workers in namespaces of their own; root): each feed's DAG run once,
# all at once; prints total wall time, per-run overhead and metadata-DB rows written per run. Starts its own
# PostgreSQL and S3 server. BENCH_CELERY_ARGS='--feeds 10' for a quick one, '--records N' to start Spark in every run.
.PHONY: bench-celery
bench-celery: install
	$(BIN)/python -m tests.bench.celery $(BENCH_CELERY_ARGS)

# A 1,000-record feed DAG run with StatsD and OpenLineage off, on, and variants (--variants), rotating rounds, medians side by side.
bench-observe: install
	@test -n "$$TIDEMARK_BOOTSTRAP_SERVERS" || $(BIN)/tidemark kafka up
	$(BIN)/python -m tests.bench.observe $(BENCH_OBSERVE_ARGS)

kafka-up: install
	$(BIN)/tidemark kafka up

kafka-down: install
	$(BIN)/tidemark kafka down

.PHONY: debezium
# A real change stream: PostgreSQL (wal_level=logical), Kafka Connect and Debezium's PostgreSQL connector (from Maven
# Central) on a demo table, on the local cluster; prints the topic and a keyed feed for it. Ctrl-C stops them.
debezium: install
	@test -n "$$TIDEMARK_BOOTSTRAP_SERVERS" || $(BIN)/tidemark kafka up
	$(BIN)/python -m tests.support.servers.debezium $(DEBEZIUM_ARGS)

# requirements.txt: requirements.in resolved by uv for the venv's Python 3.11, the versions pinned now kept unless
# requirements.in asks otherwise (LOCK_ARGS=--upgrade takes the newest). requirements-dev.txt is pinned by hand.
LOCK_HEADER := \# Tidemark runtime dependencies: requirements.in resolved together by uv on Python 3.11 and pinned \
  (the Airflow constraints file is unreachable from our machines). Regenerate with make lock.
lock: install
	cp requirements.txt requirements.txt.new
	uv=$(UV_HOME)/bin/uv; test -x $$uv || uv=$(BIN)/uv; \
	  $$uv pip compile -q --python $(BIN)/python --no-header --no-annotate $(LOCK_ARGS) requirements.in -o requirements.txt.new
	{ echo "$(LOCK_HEADER)"; cat requirements.txt.new; } > requirements.txt && rm requirements.txt.new

clean:
	-$(BIN)/tidemark kafka down
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

# Airflow with Tidemark's DAGs, view and connections on the local cluster; Ctrl-C (or `make airflow-down`) stops it.
airflow: install
	$(BIN)/tidemark airflow up $(AIRFLOW_ARGS)

airflow-down: install
	$(BIN)/tidemark airflow down

# The distributed shape (docs/deploy.md "Airflow with Celery workers"): the CeleryExecutor, its broker and results on
# PostgreSQL, two Celery workers each in mount and UTS namespaces of its own (root). Needs a PostgreSQL database:
# make airflow-celery TIDEMARK_AIRFLOW_DATABASE_URL=postgresql://USER:PASSWORD@HOST:PORT/DB
airflow-celery: install
	@test -n "$$TIDEMARK_AIRFLOW_DATABASE_URL" || { echo "set TIDEMARK_AIRFLOW_DATABASE_URL=postgresql://USER:PASSWORD@HOST:PORT/DB (docs/deploy.md)"; exit 2; }
	$(BIN)/python -m tidemark.devtools.celery up $(AIRFLOW_CELERY_ARGS)

airflow-celery-down: install
	$(BIN)/python -m tidemark.devtools.celery down

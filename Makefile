# Tidemark's two commands: `make demo` and `make test`. Everything else is a step of those.
SHELL := /bin/bash
PY ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: install demo test test-extended test-differential lint unit model integration faults faults-table soak mutants bench bench-small bench-quick bench-avro bench-plan kafka-up kafka-down clean lock
.PHONY: browser bench-view bench-observe airflow airflow-down airflow-celery airflow-celery-down differential

$(STAMP):
	@$(PY) -c 'import sys; assert sys.version_info[:2] == (3, 11), f"Tidemark needs Python 3.11, found {sys.version.split()[0]}"'
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@echo "installing pinned dependencies into $(VENV) ..."
	@time ( $(BIN)/pip install -q --upgrade pip && \
	  $(BIN)/pip install -q -r requirements-dev.txt && \
	  $(BIN)/pip install -q --no-deps -e . )
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
test: lint browser
	$(BIN)/pytest -v --durations=25 -m "not extended" $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS)) $(PYTEST_ARGS)

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

# Keyed-table merge: a plan of N changes over a table of M keys, Tidemark's merge against pyiceberg's Table.upsert,
# side by side (TIDEMARK_BENCH_CHANGES_N / _M / _ROUNDS; small by default). No Kafka, no Spark.
.PHONY: bench-changes
bench-changes: install
	$(BIN)/python -m tests.bench.changes $(BENCH_CHANGES_ARGS)

# View benchmark: renders a 200-partition feed's Tidemark view; prints the median.
bench-view: install
	@test -n "$$TIDEMARK_BOOTSTRAP_SERVERS" || $(BIN)/tidemark kafka up
	$(BIN)/python -m tests.bench.view $(BENCH_VIEW_ARGS)

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

lock:
	rm -rf /tmp/tidemark-lock && $(PY) -m venv /tmp/tidemark-lock
	/tmp/tidemark-lock/bin/pip install -q -r requirements.in
	/tmp/tidemark-lock/bin/pip freeze > requirements.txt.new && mv requirements.txt.new requirements.txt

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

VENV := .venv
PY := $(VENV)/bin/python
# The project supports CPython 3.11 only (requires-python); fall back to python3 if it is 3.11.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
RMQ5_VENV := .venv-rmq5
PROXY_STUBS := broker/proxy/v2/service_pb2_grpc.py

.PHONY: install python peers up test bench fuzz lint airflow spark-cluster clean

install: python peers

# What mqlake itself runs on: the virtual environment and the generated gRPC stubs.
python: $(VENV)/.installed $(PROXY_STUBS)

# Re-runs only when the dependency declarations or the compiled twins' sources change; the package itself is
# editable (the Python modules are read in place, the Cython twins are built into the tree by setup.py).
TWIN_PYX := $(wildcard store/_*.pyx store/format/_*.pyx broker/remoting/_*.pyx pipelines/index_rebuild/_*.pyx)
TWIN_SOURCES := $(TWIN_PYX) $(wildcard store/_*.pxd store/format/_*.pxd broker/remoting/_*.pxd)
# pip prints each package it collects and installs (a first install takes minutes: Spark, Airflow, ...).
$(VENV)/.installed: pyproject.toml constraints.txt setup.py $(TWIN_SOURCES)
	@start=$$(date +%s); echo "==> $(VENV): Python packages (pip; a first install takes a few minutes)"; \
	test -x $(PY) || $(PYTHON) -m venv $(VENV) && \
	$(PY) -m pip install -q -c constraints.txt --upgrade pip && \
	$(PY) -m pip install --progress-bar off -c constraints.txt -e '.[dev,airflow]' && \
	echo "==> $(VENV) done in $$(( $$(date +%s) - start )) s"
	touch $@

# The RocketMQ 5.x gRPC client (PyPI rocketmq-python-client) in a virtual environment of its own: its top-level
# package `rocketmq` is also the 4.x C++ client's.  The tests drive it as a subprocess; its shipped protocol
# descriptors are what the broker's gRPC stubs are generated from (tools/gen_grpc_stubs.py, docs/grpc.md).
$(RMQ5_VENV)/.installed: constraints.txt
	@start=$$(date +%s); echo "==> $(RMQ5_VENV): the RocketMQ 5 Python client, for the gRPC stubs"; \
	test -x $(RMQ5_VENV)/bin/python || $(PYTHON) -m venv $(RMQ5_VENV) && \
	$(RMQ5_VENV)/bin/python -m pip install --progress-bar off -c constraints.txt rocketmq-python-client grpcio-tools && \
	echo "==> $(RMQ5_VENV) done in $$(( $$(date +%s) - start )) s"
	touch $@

$(PROXY_STUBS): tools/gen_grpc_stubs.py $(RMQ5_VENV)/.installed
	$(RMQ5_VENV)/bin/python tools/gen_grpc_stubs.py

# Jars pinned in tools/peers/<name>/pom.xml, fetched with their dependencies into .peers/<name>/lib once, through
# the machine's own Maven client and its default settings (Maven Central, the local repository in ~/.m2):
# - delta-spark: Delta Lake and S3A for every Spark session the pipelines start (`mqlake tier`, `sql`, ...);
# - the others: Apache RocketMQ itself, the reference implementation the tests and bench_peer run beside mqlake.
#   The broker needs none of them, so `make up` fetches only the Spark jars.
SPARK_JARS := delta-spark
PEERS := rocketmq-4 rocketmq-4-broker rocketmq-5 client-java-5 $(SPARK_JARS)
PEER_STAMPS := $(PEERS:%=.peers/%/.fetched)
MVN_DEPENDENCY := org.apache.maven.plugins:maven-dependency-plugin:3.6.1

peers: $(PEER_STAMPS)

.peers/%/.fetched: tools/peers/%/pom.xml
	@command -v java > /dev/null && command -v javac > /dev/null && command -v mvn > /dev/null || \
		{ echo "make peers: needs a JDK 17 (java, javac) and Maven (mvn) on PATH to fetch the jars of tools/peers/$*"; exit 1; }
	@echo "==> .peers/$*: jars pinned in tools/peers/$*/pom.xml (Maven)"
	rm -rf .peers/$*/lib
	mvn -B -q -f tools/peers/$*/pom.xml $(MVN_DEPENDENCY):copy-dependencies -DoutputDirectory=$(CURDIR)/.peers/$*/lib
	touch $@

# The broker keeps its store in .mqlake/store and tiers expired segments into the lake .mqlake/lake at deleteWhen.
# UP_ARGS: more options for `mqlake up` (e.g. UP_ARGS="--namesrv-port 19876 --broker-port 20911 --no-proxy").
UP_ARGS ?=
up: python $(SPARK_JARS:%=.peers/%/.fetched)
	@printf '%s\n' \
	  '+-------------------------------------------------------------------------------------+' \
	  '| mqlake is starting: a NameServer on 127.0.0.1:9876, a Broker on 127.0.0.1:10911 and |' \
	  '| RocketMQ 5 gRPC on 127.0.0.1:8081; it logs "Broker ready at ..." once it serves.    |' \
	  '|   store: ./.mqlake/store     lake (tiered history, Delta tables): ./.mqlake/lake    |' \
	  '| In another terminal, from this directory:                                           |' \
	  '|   .venv/bin/mqlake send -t Hello -p "first message"                                 |' \
	  '|   .venv/bin/mqlake consume -t Hello --from-beginning                                |' \
	  '|   .venv/bin/mqlake admin clusterList                                                |' \
	  '|   .venv/bin/mqlake demo          (tier, SQL and replay on a broker of its own)      |' \
	  '| or `source .venv/bin/activate` first, then plain `mqlake ...`.  Ctrl-C stops it.    |' \
	  '+-------------------------------------------------------------------------------------+'
	$(VENV)/bin/mqlake up --proxy --lake .mqlake/lake $(UP_ARGS)

# The static checks first (a few seconds), then the whole suite on TEST_WORKERS processes (pytest-xdist; auto: one
# per core). Tests sharing a JVM, a Spark session or Airflow stay on one worker each (their xdist group,
# tests/conftest.py), so the heavy ones do not all run at once; the heaviest groups are handed out first.  The
# slowest 25 are listed at the end.
TEST_WORKERS ?= auto
test: lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=25

# Every benchmark on the compiled codec twins, then the broker and store ones again on the Python twins.
bench: install
	$(PY) -m benchmarks
	MQLAKE_NO_EXTENSIONS=1 $(PY) -m benchmarks bench_broker bench_store

# Differential fuzzing of the compiled codec twins against the Python ones (atheris): a million inputs per
# target, a few minutes each (the dispatch loop's target 50,000: each of its inputs dispatches a whole segment).
# FUZZ_RUNS=n for another count; `make test` runs a short seeded smoke of it.
fuzz: install
	$(PY) tools/fuzz.py

# Local Airflow (API server and UI on http://127.0.0.1:8080 only, scheduler, DAG processor, triggerer: what
# `airflow standalone` runs) with the DAGs of airflow_dags/, its state in .airflow/ (docs/airflow.md).  The
# Variables start at `make up`'s store and .mqlake/lake; a value set before (UI or `airflow variables set`) is
# kept.  The components are started here rather than by `airflow standalone` because its scheduler and
# triggerer would serve task logs on every interface (ports 8793 and 8794; Airflow has no host setting for
# them): with --skip-serve-logs nothing listens there, and the API server reads the task logs from .airflow/logs.
AIRFLOW_ENV := PATH="$(CURDIR)/$(VENV)/bin:$$PATH" AIRFLOW_HOME="$(CURDIR)/.airflow" \
	AIRFLOW__CORE__DAGS_FOLDER="$(CURDIR)/airflow_dags" AIRFLOW__CORE__LOAD_EXAMPLES=False \
	AIRFLOW__API__HOST=127.0.0.1 AIRFLOW__CORE__EXECUTOR=LocalExecutor \
	AIRFLOW__CORE__AUTH_MANAGER=airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager

airflow: install
	$(AIRFLOW_ENV) $(VENV)/bin/airflow db migrate > /dev/null
	$(AIRFLOW_ENV) $(VENV)/bin/airflow variables get mqlake_store_dir > /dev/null 2>&1 || \
		$(AIRFLOW_ENV) $(VENV)/bin/airflow variables set mqlake_store_dir "$(CURDIR)/.mqlake/store"
	$(AIRFLOW_ENV) $(VENV)/bin/airflow variables get mqlake_lake > /dev/null 2>&1 || \
		$(AIRFLOW_ENV) $(VENV)/bin/airflow variables set mqlake_lake "$(CURDIR)/.mqlake/lake"
	@echo "Airflow on http://127.0.0.1:8080; the login: user admin, password in .airflow/simple_auth_manager_passwords.json.generated"
	$(AIRFLOW_ENV) sh -c 'trap "kill 0" INT TERM; airflow api-server --port 8080 & airflow scheduler --skip-serve-logs & \
		airflow dag-processor & airflow triggerer --skip-serve-logs & wait'

# A Spark standalone master and two workers (1 core, 1 GiB each) on 127.0.0.1 in the foreground, logs in
# .mqlake/spark; prints the spark:// URL for the pipelines' --master.  Ctrl-C stops them (docs/scaling.md).
spark-cluster: install
	$(PY) -m pipelines.spark_cluster --work-dir .mqlake/spark

# ruff; the import contracts of pyproject's [tool.importlinter]; no import cycle between two modules;
# mypy over store/, lake/ and broker/ (about 5 s from cold, the others under a second).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-logo --no-cache
	$(PY) tools/check_import_cycles.py
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) $(RMQ5_VENV) .peers build dist *.egg-info .mqlake .airflow .pytest_cache .ruff_cache .mypy_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
	rm -f broker/proxy/v2/*_pb2*.py broker/proxy/v2/*_pb2.pyi
	rm -f $(TWIN_PYX:.pyx=.c) $(wildcard store/_*.so store/format/_*.so broker/remoting/_*.so pipelines/index_rebuild/_*.so)

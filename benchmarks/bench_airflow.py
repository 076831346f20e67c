"""Airflow orchestration benchmark: what running a job through its DAG costs over running it directly.

Run: ``.venv/bin/python -m benchmarks bench_airflow`` (or ``make bench``).

Environment:
  BENCH_SCALE    multiplies the CommitLog size (default 1.0 = 256 MiB)
  BENCH_JSON     a path: also write the JSON results there

What is timed, exactly (each a fresh process, wall clock, the same verification of the same store):
  * baseline: ``python -m pipelines.index_rebuild --store-dir S --lake L --master local[*]`` — the job as a
    user runs it by hand: interpreter, JVM start, Spark scan, rebuild, compare, one Delta commit.
  * ``airflow dags test mqlake_verify_index`` with no ``mqlake_spark`` connection: the DAG's in-process
    runner (PythonOperator) runs the same module; includes the Airflow CLI start, DAG parsing, the run's
    metadata in SQLite, the four tasks and the report check.
  * the same with the connection ``mqlake_spark`` (``local[*]``): the ``spark_submit`` runner.
  The store is written first, untimed (``bench_verify.write_store``: 1 KiB messages, 4 queues), and a
  temporary AIRFLOW_HOME is migrated first, untimed.  Each path runs twice; the faster run is reported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench_verify import write_store
from benchmarks.report import emit, machine

SCALE = float(os.environ.get("BENCH_SCALE", "1") or 1)
TARGET_BYTES = 256 << 20
ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RUNS = 2


def _timed(cmd: list[str], env: dict[str, str], log: Path) -> float:
    t0 = time.perf_counter()
    with open(log, "wb") as f:
        proc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, timeout=3600)
    secs = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}; see {log}:\n" + log.read_text()[-3000:])
    return secs


def run_all(tmp: Path) -> dict:
    r: dict = {"machine": machine(), "scale": SCALE}
    store = tmp / "store"
    print(f"  [writing {TARGET_BYTES * SCALE / 2**20:,.0f} MiB of CommitLog]", flush=True)
    r["store"] = write_store(store, int(TARGET_BYTES * SCALE))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env |= {
        "AIRFLOW_HOME": str(tmp / "airflow"), "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "airflow_dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "AIRFLOW_VAR_MQLAKE_STORE_DIR": str(store), "AIRFLOW_VAR_MQLAKE_LAKE": str(tmp / "lake"),
    }  # fmt: skip
    subprocess.run([str(BIN / "airflow"), "db", "migrate"], env=env, check=True, capture_output=True, timeout=600)
    submit_env = env | {"AIRFLOW_CONN_MQLAKE_SPARK": json.dumps({"conn_type": "spark", "host": "local[*]"})}
    paths = {
        "direct": ([sys.executable, "-m", "pipelines.index_rebuild", "--store-dir", str(store), "--lake",
                    str(tmp / "lake"), "--master", "local[*]"], env),
        "dag_in_process": ([str(BIN / "airflow"), "dags", "test", "mqlake_verify_index"], env),
        "dag_spark_submit": ([str(BIN / "airflow"), "dags", "test", "mqlake_verify_index"], submit_env),
    }  # fmt: skip
    r["runs"] = {}
    for name, (cmd, run_env) in paths.items():
        secs = []
        for i in range(RUNS):
            print(f"  [{name} run {i + 1}]", flush=True)
            secs.append(_timed(cmd, run_env, tmp / f"{name}-{i}.log"))
        r["runs"][name] = {"seconds": min(secs), "all_seconds": secs}
    # every DAG run must have verified the store (a failed run makes `airflow dags test` exit 0 too)
    reports = sorted((tmp / "lake" / "_reports").glob("verify-airflow-index-*.json"))
    if len(reports) != 2 * RUNS or not all(json.loads(p.read_text())["summary"]["ok"] for p in reports):
        raise RuntimeError(f"expected {2 * RUNS} passing verification reports, found {[p.name for p in reports]}")
    return r


def print_report(r: dict) -> None:
    s, runs = r["store"], r["runs"]
    base = runs["direct"]["seconds"]
    print(f"store: {s['messages']:,} msgs x {s['record_bytes']} B = {s['commitlog_bytes'] / 1e6:,.1f} MB")
    print(f"{'path (fresh process each, best of ' + str(RUNS) + ')':<58}{'seconds':>9}{'ratio':>8}{'overhead s':>12}")
    names = {"direct": "python -m pipelines.index_rebuild (baseline)",
             "dag_in_process": "airflow dags test mqlake_verify_index, in-process",
             "dag_spark_submit": "airflow dags test mqlake_verify_index, spark-submit"}  # fmt: skip
    for key, label in names.items():
        secs = runs[key]["seconds"]
        print(f"{label:<58}{secs:>9.1f}{secs / base:>8.2f}{secs - base:>12.1f}")


def main() -> dict:
    with tempfile.TemporaryDirectory(prefix="mqlake-bench-", dir="/tmp") as tmpdir:
        t0 = time.perf_counter()
        results = run_all(Path(tmpdir))
        results["wall_seconds"] = time.perf_counter() - t0
    return emit("bench_airflow", results, print_report)

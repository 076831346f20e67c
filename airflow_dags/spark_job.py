"""One Spark job in a DAG: the same module and arguments through ``spark-submit`` or inside the task.

``spark_job(group_id, module, argv)`` is a TaskGroup of three tasks::

    choose_runner ──> spark_submit   (SparkSubmitOperator on the ``mqlake_spark`` connection)
                  └─> local          (PythonOperator: the module's __main__ in-process, on mqlake_spark_master)

Both run the module's own ``__main__`` (``python -m pipelines.compaction`` is ``mqlake tier``), so the
command, its output in the task log and its exit code are the same either way.  The jobs report through a
JSON file named in ``argv`` (``--report``); the task after the group judges that file, so a retried job task
never has to remember anything.  One of the two runners is always skipped, so the task after the group
takes the trigger rule ``none_failed_min_one_success``.

spark-submit runs the driver in client mode on the Airflow worker: the jobs read the store's files on the
driver and the executors, so the store directory (and the lake) must be mounted wherever they run.
``spark-submit`` must be on the worker's PATH (the venv's ``bin``; ``make airflow`` sets that up).
"""

from __future__ import annotations

import importlib.util
import runpy
import sys
from datetime import timedelta
from typing import Any

from airflow_dags import config

# Exit 2 is the jobs' "cannot be done as asked" (a usage error, an unreadable store): a retry would fail alike.
EXIT_USAGE = 2


def application(module: str) -> str:
    """The file spark-submit runs for ``module``: its ``__main__.py``."""
    spec = importlib.util.find_spec(f"{module}.__main__")
    if spec is None or spec.origin is None:
        raise ImportError(f"{module} has no __main__ module")
    return spec.origin


def choose_runner(group_id: str) -> str:
    """spark-submit when the ``mqlake_spark`` connection exists, else the in-process runner."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = BaseHook.get_connection(config.SPARK_CONN_ID)
    except AirflowNotFoundException:
        print(f"no connection {config.SPARK_CONN_ID}: running the job in this task on "
              f"{config.settings(need_store=False).spark_master}")  # fmt: skip
        return f"{group_id}.local"
    print(f"connection {config.SPARK_CONN_ID} ({conn.host}): running the job with spark-submit")
    return f"{group_id}.spark_submit"


def run_local(module: str, argv: list[str]) -> None:
    """Run ``python -m module argv --master <mqlake_spark_master>`` inside this task."""
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    argv = [*argv, "--master", config.settings(need_store=False).spark_master]
    print(f"python -m {module} {' '.join(argv)}")
    saved = sys.argv
    sys.argv = [module, *argv]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=False)
        code: Any = 0
    except SystemExit as e:
        code = e.code
    finally:
        sys.argv = saved
    if code in (0, None):
        return
    if code == EXIT_USAGE:
        raise AirflowFailException(f"python -m {module} exited {code}: see the log above (not retried)")
    raise AirflowException(f"python -m {module} exited {code}")


def spark_job(group_id: str, module: str, argv: Any, *, timeout: timedelta, retries: int):
    """The TaskGroup running ``module`` with ``argv`` (a list, or the XComArg of a task that builds it)."""
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
    from airflow.providers.standard.operators.python import BranchPythonOperator, PythonOperator
    from airflow.sdk import TaskGroup

    limits = {"execution_timeout": timeout, "retries": retries, "retry_delay": config.RETRY_DELAY}
    with TaskGroup(group_id, tooltip=f"python -m {module} (spark-submit or in-process)") as group:
        choose = BranchPythonOperator(
            task_id="choose_runner", python_callable=choose_runner, op_kwargs={"group_id": group_id},
            execution_timeout=config.SMALL_TASK_TIMEOUT,
        )  # fmt: skip
        submit = SparkSubmitOperator(
            task_id="spark_submit", conn_id=config.SPARK_CONN_ID, application=application(module),
            application_args=argv, name=f"mqlake-{group_id}",
            # the driver's and the workers' Python must be this venv's (it has pyarrow and mqlake)
            env_vars={"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable},
            conf=_classpath_conf(),  # Delta Lake and S3A: the driver's JVM needs them at its start
            **limits,
        )  # fmt: skip
        local = PythonOperator(
            task_id="local", python_callable=run_local, op_kwargs={"module": module, "argv": argv}, **limits
        )
        choose >> [submit, local]
    return group


def _classpath_conf() -> dict[str, str]:
    from pipelines.spark import DeltaJarsMissing, classpath_conf

    try:
        return classpath_conf()
    except DeltaJarsMissing:
        return {}  # the DAG still loads; the job then refuses its session with the same advice


def read_report(path: str) -> dict:
    """The JSON report a job wrote; a missing one means the job did not finish (the runner task said why)."""
    import json
    from pathlib import Path

    from airflow.sdk.exceptions import AirflowFailException

    p = Path(path)
    if not p.is_file():
        raise AirflowFailException(f"the job wrote no report at {p}")
    return json.loads(p.read_text(encoding="utf-8"))

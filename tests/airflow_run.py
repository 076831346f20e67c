"""Child process of tests/test_airflow_dags.py: load the DAG folder, or run one DAG with ``dag.test()``.

Airflow reads its configuration when first imported and keeps process-wide state (ORM session, logging),
so every use gets a fresh interpreter whose environment names the temporary AIRFLOW_HOME, the Variables
(``AIRFLOW_VAR_*``) and the Spark connection (``AIRFLOW_CONN_MQLAKE_SPARK``).

    python -m tests.airflow_run dagbag OUT.json
    python -m tests.airflow_run test DAG_ID CONF_JSON OUT.json

Retries are set to 0 before the run: a failing task then fails the run at once instead of waiting out its
retry delay (the DagBag output still shows the DAGs' own retries).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def _dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])


def describe() -> dict:
    bag = _dagbag()
    dags = {}
    for dag_id, dag in bag.dags.items():
        dags[dag_id] = {
            "cron": getattr(dag.timetable, "expression", None),  # None: triggered by hand only
            "timezone": str(getattr(dag.timetable, "timezone", "")),
            "catchup": dag.catchup,
            "max_active_runs": dag.max_active_runs,
            "params": {k: dag.params.get_param(k).schema for k in dag.params},
            "tasks": {
                t.task_id: {
                    "retries": t.retries,
                    "timeout_s": t.execution_timeout.total_seconds() if t.execution_timeout else None,
                    "trigger_rule": str(t.trigger_rule),
                    "upstream": sorted(t.upstream_task_ids),
                    "type": type(t).__name__,
                }
                for t in dag.tasks
            },
        }
    return {"import_errors": {str(k): v for k, v in bag.import_errors.items()}, "dags": dags}


def run(dag_id: str, conf: dict) -> dict:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    bag = _dagbag()
    assert not bag.import_errors, bag.import_errors
    dag = bag.get_dag(dag_id)
    for t in dag.tasks:
        t.retries = 0
    dr = dag.test(run_conf=conf)
    xcoms: dict[str, dict] = {}
    with create_session() as session:
        rows = session.scalars(select(XComModel).where(XComModel.dag_id == dag_id, XComModel.run_id == dr.run_id))
        for x in rows:
            xcoms.setdefault(x.task_id, {})[x.key] = XComModel.deserialize_value(x)
    return {
        "state": str(dr.state),
        "run_id": dr.run_id,
        "tasks": {ti.task_id: str(ti.state) for ti in dr.get_task_instances()},
        "xcoms": xcoms,
    }


def main() -> None:
    if sys.argv[1] == "dagbag":
        out, result = sys.argv[2], describe()
    else:
        out, result = sys.argv[4], run(sys.argv[2], json.loads(sys.argv[3]))
    Path(out).write_text(json.dumps(result, default=str), encoding="utf-8")


if __name__ == "__main__":
    main()

"""mqlake_verify_index: rebuild the broker's ConsumeQueue and IndexFile from its CommitLog and compare.

::

    verify_args ─> verify (spark-submit | in-process) ─> check_indexes

``verify`` runs ``mqlake verify-index --lake`` (``python -m pipelines.index_rebuild``): one row per queue and
index file lands in the Delta table ``index_verification`` under this run's id (a retried task replaces its
rows).  ``check_indexes`` fails the run on any mismatch, with the summary and the first problems (topic,
queue, offsets, file) in its log and the report's summary in its XCom.  Repair stays a human decision:
``mqlake verify-index --repair --out DIR`` then ``mqlake store adopt-index`` on the stopped broker.

Several brokers (``MQLAKE_BROKER_STORES``, see ``airflow_dags/config.py``): the three tasks are there once
per store, suffixed with the broker name (``verify_args_broker-a``, ``verify_broker-a.local``,
``check_indexes_broker-a``), each under its own run id (the Airflow run's, plus the broker name), so the
stores' rows of ``index_verification`` never replace each other.

Scheduled daily (``MQLAKE_VERIFY_SCHEDULE``, see ``airflow_dags/config.py``), away from the deletion hour.
"""

from __future__ import annotations

import json

from airflow.sdk import DAG, TriggerRule, get_current_context, task

from airflow_dags import config
from airflow_dags.spark_job import read_report, spark_job

SHOWN_PROBLEMS = 20

with DAG(
    dag_id="mqlake_verify_index",
    description="Verify ConsumeQueue and IndexFile against the CommitLog; results to index_verification",
    doc_md=__doc__,
    **config.scheduled_dag(config.verify_schedule(), config.VERIFY_TIMEOUT * 2),
) as dag:

    @task(multiple_outputs=True)
    def verify_args(store: dict | None = None, run_id: str | None = None) -> dict:
        s = config.settings(need_store=True, store=config.store_arg(store))
        key = config.run_key(f"{run_id}-{s.broker_name}" if s.broker_name else run_id)
        report = s.report("verify", f"index-{key}")
        argv = ["--store-dir", s.store_dir, *s.common_argv(), "--report", report, "--run-id", key, "--exit-zero"]
        if s.broker_conf:
            argv += ["--broker-conf", s.broker_conf]
        return {"argv": argv, "report": report}

    @task(trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS)
    def check_indexes(report_path: str) -> dict:
        from airflow.sdk.exceptions import AirflowFailException

        report = read_report(report_path)
        summary = report["summary"] | {"run_id": report["run_id"], "report": report_path}
        print("verification: " + json.dumps(summary))
        if summary["ok"]:
            return summary
        problems = []
        for q in report["consume_queues"]:
            if q["status"] != "ok":
                print(f"ConsumeQueue {q['topic']}/{q['queue_id']}: {q['status']} missing={q['missing']} "
                      f"mismatched={q['mismatched']} extra={q['extra']} first bad offset={q['first_bad_queue_offset']}"
                      f" files={q['files_differing'] + q['files_missing']}")  # fmt: skip
                problems += q["problems"]
        for r in report["index_files"]:
            if r["status"] != "ok":
                print(f"IndexFile {r['file']}: {r['status']} missing={r['missing']} mismatched={r['mismatched']} "
                      f"extra={r['extra']} unreachable={r['unreachable']}")  # fmt: skip
                problems += r["problems"]
        for p in problems[:SHOWN_PROBLEMS]:
            print("  " + json.dumps(p))
        get_current_context()["ti"].xcom_push(key="summary", value=summary)
        raise AirflowFailException(
            f"index mismatch: {summary['queues'] - summary['queues_ok']} of {summary['queues']} ConsumeQueues and "
            f"{summary['index_files'] - summary['index_files_ok']} of {summary['index_files']} IndexFiles differ "
            f"from the CommitLog. Report: {report_path}"
        )

    for store in config.broker_stores() or [None]:
        suffix = f"_{store.broker_name}" if store is not None else ""
        args = verify_args.override(task_id=f"verify_args{suffix}")(store=store.as_arg() if store else None)
        verify = spark_job(f"verify{suffix}", "pipelines.index_rebuild", args["argv"], timeout=config.VERIFY_TIMEOUT,
                           retries=config.VERIFY_RETRIES)  # fmt: skip
        args >> verify >> check_indexes.override(task_id=f"check_indexes{suffix}")(args["report"])

"""mqlake_tier: tier expired CommitLog segments into Delta at the broker's deletion hour; compact weekly.

::

    find_expired ─> tier_args ─> tier (spark-submit | in-process) ─> check_integrity ─> compaction_day ─> compact

- ``find_expired`` reads the store's segment manifest and skips the tiering tasks when nothing is due.
- ``tier`` runs ``mqlake tier`` (``python -m pipelines.compaction``); the job claims, validates, commits once
  per store and segment order, verifies and deletes, so a retry or a second run commits nothing twice.
- ``check_integrity`` fails the run when the job quarantined a segment; the JSON report is in its log and
  in its XCom ``report``.
- ``compact`` optimizes closed partitions and vacuums, on the ``mqlake_compact_weekday`` only (param
  ``compact``: weekly / always / never), after a tiering run that did not fail.

Airflow judges a run by its leaf tasks, and ``compact`` is the only leaf.  So ``compaction_day`` waits for
``check_integrity``: a failed check (or tier job) makes it, and so ``compact``, ``upstream_failed`` and the
run fails.  Were ``compaction_day`` a root, it would skip ``compact`` before the check ran on every day but
the compaction day, and the run would end ``success`` with a quarantined segment.

Several brokers (``MQLAKE_BROKER_STORES``, see ``airflow_dags/config.py``): the chain up to ``check_integrity``
is there once per store, its task ids suffixed with the broker name (``find_expired_broker-a``,
``tier_broker-a.local``, ``check_integrity_broker-a``, ...), every store into the one lake; the stores tier in
parallel, and ``compaction_day`` waits for every check (one failed store fails the run and skips compaction).

Scheduled daily at the broker's ``deleteWhen`` hours (see ``airflow_dags/config.py``): the broker's own clean
pass then deletes the tiered segments within the same hour.  Runs never overlap and are not backfilled:
each run works on the store as it is now.
"""

from __future__ import annotations

import json
from collections import Counter

import pendulum
from airflow.sdk import DAG, Param, TriggerRule, get_current_context, task

from airflow_dags import config
from airflow_dags.spark_job import read_report, spark_job

with DAG(
    dag_id="mqlake_tier",
    description="Tier expired CommitLog segments into Delta; compact closed partitions weekly",
    params={
        "file_reserved_time": Param(
            None, type=["null", "number"], minimum=0, title="File reserved time (hours)",
            description="Also tier sealed segments whose last message is older than this (0: every sealed "
                        "segment). Empty: only what the broker expired by its own fileReservedTime.",
        ),
        "max_segments": Param(None, type=["null", "integer"], minimum=1, title="Claim at most N segments"),
        "compact": Param("weekly", enum=["weekly", "always", "never"], title="Compact closed partitions"),
    },  # fmt: skip
    doc_md=__doc__,
    **config.scheduled_dag(config.tier_schedule(), config.TIER_TIMEOUT + config.COMPACT_TIMEOUT),
) as dag:

    @task.short_circuit(ignore_downstream_trigger_rules=False)
    def find_expired(store: dict | None = None, params: dict | None = None) -> bool:
        from pipelines.compaction.job import due_segments

        store_dir = config.settings(need_store=True, store=config.store_arg(store)).store_dir
        due = due_segments(store_dir, params["file_reserved_time"])
        for e in due:
            print(f"{e.file_name}  {e.state}  messages={e.message_count}  last_store_time={e.last_store_time}")
        print(f"{len(due)} segment(s) due for tiering in {store_dir}")
        return bool(due)

    @task(multiple_outputs=True)
    def tier_args(store: dict | None = None, params: dict | None = None, run_id: str | None = None) -> dict:
        s = config.settings(need_store=True, store=config.store_arg(store))
        name = f"{run_id}-{s.broker_name}" if s.broker_name else run_id
        report = s.report("tier", config.run_key(name))
        argv = ["--store-dir", s.store_dir, *s.common_argv(), "--report", report, "--exit-zero"]
        if s.broker_conf:
            argv += ["--broker-conf", s.broker_conf]
        if s.broker_name:
            argv += ["--broker-name", s.broker_name]
        if params["file_reserved_time"] is not None:
            argv += ["--file-reserved-time", str(params["file_reserved_time"])]
        if params["max_segments"] is not None:
            argv += ["--max-segments", str(params["max_segments"])]
        return {"argv": argv, "report": report}

    @task(trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS)
    def check_integrity(report_path: str) -> dict:
        from airflow.sdk.exceptions import AirflowFailException

        report = read_report(report_path)
        summary = {"report": report_path, "messages_version": report.get("messages_version"),
                   **Counter(s["state"] for s in report["segments"])}  # fmt: skip
        print("tiering: " + json.dumps(summary))
        if report.get("delete_error"):
            print(f"WARNING deleting tiered segments failed (the broker's clean pass retries): "
                  f"{report['delete_error']}")  # fmt: skip
        quarantined = [s for s in report["segments"] if s["state"] == "quarantined"]
        if quarantined:
            print(json.dumps(report, indent=2, sort_keys=True))
            get_current_context()["ti"].xcom_push(key="report", value=report)
            reasons = "; ".join(f"{s['segment']}: {s['reason']}" for s in quarantined)
            raise AirflowFailException(
                f"{len(quarantined)} segment(s) quarantined (kept in the store, not tiered): {reasons}. "
                f"Report: {report_path}"
            )
        return summary

    # after a tiering run that did not fail, or that had nothing to do (find_expired skipped the rest)
    @task.short_circuit(ignore_downstream_trigger_rules=True, trigger_rule=TriggerRule.NONE_FAILED)
    def compaction_day(params: dict | None = None, dag_run=None) -> bool:
        if params["compact"] != "weekly":
            return params["compact"] == "always"
        when = pendulum.instance(dag_run.run_after).in_timezone(config.local_timezone())
        return when.weekday() == config.compact_weekday()

    @task(execution_timeout=config.COMPACT_TIMEOUT)
    def compact() -> dict:
        from lake.objectstore import lake_location
        from pipelines.compaction.upkeep import compact as run_compact

        done = run_compact(lake_location(config.settings(need_store=False).lake))
        print("compaction: " + json.dumps(done))
        return done

    gates = []
    for store in config.broker_stores() or [None]:
        suffix = f"_{store.broker_name}" if store is not None else ""
        arg = store.as_arg() if store is not None else None
        args = tier_args.override(task_id=f"tier_args{suffix}")(store=arg)
        tier = spark_job(f"tier{suffix}", "pipelines.compaction", args["argv"], timeout=config.TIER_TIMEOUT,
                         retries=config.TIER_RETRIES)  # fmt: skip
        gate = check_integrity.override(task_id=f"check_integrity{suffix}")(args["report"])
        find_expired.override(task_id=f"find_expired{suffix}")(store=arg) >> args >> tier >> gate
        gates.append(gate)
    gates >> compaction_day() >> compact()

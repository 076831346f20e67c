"""mqlake_replay: replay tiered and live history into a topic, triggered by hand with typed parameters.

::

    replay_args ─> dry_run (spark-submit | in-process) ─> show_counts ─> replay (...) ─> final_report

- ``replay_args`` checks the parameters (the same checks as ``mqlake replay``) before any Spark starts.
- ``dry_run`` plans without sending; ``show_counts`` logs the selected messages per source queue and the
  target queues, and stops the run there when ``dry_run`` is set.
- ``replay`` runs ``mqlake replay`` (``python -m pipelines.replay``) under one replay id: the parameter, or
  ``airflow-<run id>``.  Progress is kept per replay id in the lake, so a retried task (or a new run with
  the same ``replay_id``) resumes and sends each message once.
- ``final_report`` pushes the report (the replay's, or the dry run's) to XCom as its return value.

Reads the Delta ``messages`` table under ``mqlake_lake`` (every broker's tiered rows), and when ``include_live``
is on the live CommitLog of every store in ``MQLAKE_BROKER_STORES`` (``--broker-store NAME=PATH`` each: the
rows carry their broker's name), or without that list the one under ``mqlake_store_dir`` when set; publishes
through ``mqlake_namesrv``.
"""

from __future__ import annotations

from airflow.sdk import DAG, Param, TriggerRule, get_current_context, task

from airflow_dags import config
from airflow_dags.spark_job import read_report, spark_job

TOPIC = r"^[%|a-zA-Z0-9_-]{1,127}$"  # RocketMQ's topic name rule
NAME_LIST = {"type": "string", "minLength": 1}

with DAG(
    dag_id="mqlake_replay",
    description="Replay history from the lake and the live CommitLog into a topic",
    schedule=None,
    start_date=config.START_DATE,
    catchup=False,
    default_args=config.DEFAULT_ARGS,
    params={
        "source_topics": Param(type="array", items={"type": "string", "pattern": TOPIC}, minItems=1,
                               title="Source topics"),
        "target_topic": Param(type="string", pattern=TOPIC, title="Target topic",
                              description="Created with the sources' queue count when missing"),
        "from": Param(None, type=["null", "string"], title="From (store time >=)",
                      description="ISO-8601 (no zone = UTC) or epoch milliseconds"),
        "to": Param(None, type=["null", "string"], title="To (store time <)"),
        "where": Param(None, type=["null", "string"], title="Spark SQL predicate over the messages columns"),
        "tags": Param(None, type=["null", "string"], title="Tag expression A||B"),
        "keys": Param(None, type=["null", "array"], items=NAME_LIST, title="Only messages with one of these keys"),
        "rate": Param(None, type=["null", "number"], exclusiveMinimum=0, title="Messages per second (empty: "
                      "unthrottled)"),
        "replay_id": Param(None, type=["null", "string"], pattern=r"^[A-Za-z0-9_-]{1,100}$", title="Replay id",
                           description="Resume this replay; empty: airflow-<run id>"),
        "dry_run": Param(False, type="boolean", title="Dry run: show the counts, send nothing"),
        "queue_map": Param("preserve", enum=["preserve", "hash"], title="Queue mapping"),
        "preserve_timestamps": Param(False, type="boolean", title="Send with the source born timestamps"),
        "include_live": Param(True, type="boolean", title="Also read the live CommitLog (every store of "
                              "MQLAKE_BROKER_STORES, else mqlake_store_dir)"),
    },  # fmt: skip
    tags=["mqlake"],
    doc_md=__doc__,
) as dag:

    @task(multiple_outputs=True)
    def replay_args(params: dict | None = None, run_id: str | None = None) -> dict:
        from pathlib import Path

        from airflow.sdk.exceptions import AirflowFailException

        from lake.objectstore import lake_location
        from pipelines.replay.spec import ReplaySpec, ReplaySpecError, parse_tags, parse_time

        p, stores = params, config.broker_stores()
        # several brokers: the first store's broker.conf may name the lake when mqlake_lake is not set
        s = config.settings(need_store=False, store=stores[0] if stores else None)
        live = [(b.broker_name, b.store_dir) for b in stores] if p["include_live"] else []
        store_dir = s.store_dir if p["include_live"] and not stores else None
        replay_id = p["replay_id"] or f"airflow-{config.run_key(run_id)}"
        try:  # the CLI checks the same; failing here saves a Spark start and a retry
            ReplaySpec(
                lake=lake_location(s.lake), source_topics=tuple(p["source_topics"]), target_topic=p["target_topic"],
                store_dir=Path(store_dir) if store_dir else None, from_ms=parse_time(p["from"], "from"),
                to_ms=parse_time(p["to"], "to"), tags=tuple(parse_tags(p["tags"]) or ()) or None,
                rate=p["rate"], namesrv=s.namesrv, replay_id=replay_id, queue_map=p["queue_map"],
                broker_stores=tuple((name, Path(path)) for name, path in live),
            )  # fmt: skip
        except ReplaySpecError as e:
            raise AirflowFailException(str(e)) from None
        argv = [*s.common_argv(), "--source-topic", ",".join(p["source_topics"]), "--target-topic",
                p["target_topic"], "--namesrv", s.namesrv, "--replay-id", replay_id, "--queue-map", p["queue_map"]]
        if store_dir:
            argv += ["--store-dir", store_dir]
        for name, path in live:
            argv += ["--broker-store", f"{name}={path}"]
        for name in ("from", "to", "where", "tags", "rate"):
            if p[name] is not None:
                argv += [f"--{name}", str(p[name])]
        if p["keys"]:
            argv += ["--keys", ",".join(p["keys"])]
        if p["preserve_timestamps"]:
            argv.append("--preserve-timestamps")
        key = config.run_key(run_id)
        dry_report, report = s.report("replay", f"{key}-dry-run"), s.report("replay", key)
        return {
            "dry_argv": [*argv, "--dry-run", "--report", dry_report], "argv": [*argv, "--report", report],
            "dry_report": dry_report, "report": report, "replay_id": replay_id,
        }  # fmt: skip

    @task.short_circuit(ignore_downstream_trigger_rules=False, trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS)
    def show_counts(report_path: str, params: dict | None = None) -> bool:
        report = read_report(report_path)
        for q in report["queues"]:
            print(f"{q['source_broker']}:{q['source_topic']}/{q['source_queue']} -> {report['target_topic']} "
                  f"queue(s) {q['target_queues']}: {q['selected']} selected, {q['already_done']} done before, "
                  f"offsets {q['min_offset']}..{q['max_offset']}")  # fmt: skip
        counts = {k: report[k] for k in ("replay_id", "target_topic", "selected", "already_done", "target_queues")}
        print(f"dry run: {counts}")
        get_current_context()["ti"].xcom_push(key="counts", value=counts)
        return not params["dry_run"]

    @task(trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS)
    def final_report(report_path: str, dry_report_path: str, params: dict | None = None) -> dict:
        report = read_report(dry_report_path if params["dry_run"] else report_path)
        print(f"replay {report['replay_id']} -> {report['target_topic']}: selected {report['selected']}, "
              f"sent {report['sent']}, done before {report['already_done']}, found in target "
              f"{report['found_in_target']}")  # fmt: skip
        return report

    args = replay_args()
    dry = spark_job("dry_run", "pipelines.replay", args["dry_argv"], timeout=config.DRY_RUN_TIMEOUT, retries=1)
    send = spark_job("replay", "pipelines.replay", args["argv"], timeout=config.REPLAY_TIMEOUT,
                     retries=config.REPLAY_RETRIES)  # fmt: skip
    args >> dry >> show_counts(args["dry_report"]) >> send >> final_report(args["report"], args["dry_report"])

"""The ``replay`` command, shared by ``mqlake replay`` and ``python -m pipelines.replay``.

Only typer is imported here: pyspark, delta-rs and the client load when the command runs.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated

import typer

from pipelines.objectstore_cli import lake_option
from pipelines.spark import ConfOption, MasterOption, add_spark_options
from store.console import console, print_error, run_app, table


def replay_command(
    lake: Annotated[
        str, typer.Option("--lake", help="Lake root (directory or s3://bucket/prefix): messages (read), "
                          "replay_progress/replay_runs.")
    ],
    source_topic: Annotated[str, typer.Option("--source-topic", help="Topic(s) to replay, comma-separated.")],
    target_topic: Annotated[str, typer.Option("--target-topic", help="Topic to publish into (created if missing).")],
    namesrv: Annotated[str, typer.Option("--namesrv", help="NameServer HOST:PORT of the target.")] = "",
    store_dir: Annotated[
        Path | None, typer.Option("--store-dir", help="Broker store root: also replay the live (untiered) CommitLog.")
    ] = None,
    broker_name: Annotated[
        str | None,
        typer.Option("--broker-name", help="brokerName of the --store-dir's broker (default broker-a)."),
    ] = None,
    broker_store: Annotated[
        list[str] | None,
        typer.Option("--broker-store", metavar="NAME=PATH", help="A broker's store root with its brokerName: also "
                     "replay its live CommitLog.  Repeat once per broker of the cluster."),
    ] = None,
    from_: Annotated[
        str | None, typer.Option("--from", help="Store time >= this (epoch ms or ISO-8601; no zone = UTC).")
    ] = None,
    to: Annotated[str | None, typer.Option("--to", help="Store time < this (epoch ms or ISO-8601).")] = None,
    where: Annotated[
        str | None, typer.Option("--where", help="Spark SQL predicate over the messages columns.")
    ] = None,
    tags: Annotated[str | None, typer.Option("--tags", help="Tag expression A||B (* = all).")] = None,
    keys: Annotated[str | None, typer.Option("--keys", help="Only messages carrying one of these keys: K1,K2.")] = None,
    rate: Annotated[
        float | None, typer.Option("--rate", help="Messages per second over the whole job (default: unthrottled).")
    ] = None,
    queue_map: Annotated[
        str, typer.Option("--queue-map", help="preserve: same queue id (modulo); hash: by the first key's hash.")
    ] = "preserve",
    preserve_timestamps: Annotated[
        bool, typer.Option("--preserve-timestamps", help="Send each message with its source born timestamp.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show counts per source queue and the mapping only.")
    ] = False,
    replay_id: Annotated[
        str | None, typer.Option("--replay-id", help="Resume this replay (default: a new id, printed).")
    ] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Messages per batch send.", min=1)] = 128,
    commit_every: Annotated[
        int, typer.Option("--commit-every", help="Record progress after this many messages per task.", min=1)
    ] = 5000,
    commit_seconds: Annotated[
        float, typer.Option("--commit-seconds", help="... or after this many seconds.", min=0.01)
    ] = 2.0,
    engine: Annotated[
        str | None,
        typer.Option("--engine", show_default=False,
                     help="Read and send 'local'ly (this process, no JVM; the selection held in memory) or with "
                          "'spark' (executors read and send). Default: spark when --where is given or the master "
                          "is not local (--master, spark-submit's, $MQLAKE_SPARK_MASTER), else local."),
    ] = None,
    master: MasterOption = None,
    conf: ConfOption = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    report_path: Annotated[
        Path | None, typer.Option("--report", help="Also write the JSON report here (dry runs too).")
    ] = None,
) -> None:
    """Replay tiered and live history into a topic: ordered per queue, rate limited, resumable, no duplicates."""
    from pipelines.replay.spec import (
        ReplaySpec,
        ReplaySpecError,
        new_replay_id,
        parse_broker_stores,
        parse_list,
        parse_tags,
        parse_time,
    )

    out = console()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        spec = ReplaySpec(
            lake=lake_option(lake), source_topics=tuple(parse_list(source_topic, "--source-topic") or ()),
            target_topic=target_topic, store_dir=store_dir, from_ms=parse_time(from_, "--from"),
            to_ms=parse_time(to, "--to"), where=where, tags=_tuple(parse_tags(tags)),
            keys=_tuple(parse_list(keys, "--keys")), queue_map=queue_map, preserve_timestamps=preserve_timestamps,
            rate=rate, namesrv=namesrv, dry_run=dry_run, replay_id=replay_id or new_replay_id(),
            batch_size=batch_size, commit_every=commit_every, commit_seconds=commit_seconds, broker_name=broker_name,
            broker_stores=parse_broker_stores(broker_store),
        )  # fmt: skip
    except ReplaySpecError as e:
        raise typer.BadParameter(str(e)) from None
    spark_kwargs = add_spark_options(master, conf)

    from pipelines.job_progress import JobProgress
    from pipelines.replay.job import replay
    from pipelines.replay.sender import ReplayError

    if not dry_run and not json_out:
        out.print(f"replay id: {spec.replay_id}  (rerun with --replay-id {spec.replay_id} to resume)")
    try:
        with JobProgress("replay", console(stderr=True)):
            report = replay(spec, engine=engine, report_path=report_path, **spark_kwargs)
    except ReplaySpecError as e:
        raise typer.BadParameter(str(e)) from None
    except ReplayError as e:
        print_error(e)
        raise typer.Exit(1) from None
    if json_out:
        print(json.dumps(report.to_json(), default=str))
        return
    _print(out, report)


def _tuple(items: list[str] | None) -> tuple[str, ...] | None:
    return tuple(items) if items else None


def _print(out, report) -> None:
    if report.dry_run:
        title = f"dry run: nothing sent; {report.target_topic} queues by source queue"
        cols = {"broker": "source_broker", "source": "source_topic", "queue": "source_queue",
                "target queue": "target_queues", "selected": "selected", "min offset": "min_offset",
                "max offset": "max_offset", "done before": "already_done"}  # fmt: skip
    else:
        title = f"replay {report.replay_id} -> {report.target_topic}"
        cols = {"broker": "source_broker", "source": "source_topic", "queue": "source_queue",
                "target queue": "target_queues", "selected": "selected", "done before": "already_done",
                "found in target": "found_in_target",
                "sent": "sent", "first sent": "first_offset", "last sent": "last_offset"}  # fmt: skip
    queues = table(*cols, title=title)
    for q in report.queues:
        queues.add_row(*("-" if q[k] is None else str(q[k]) for k in cols.values()))
    out.print(queues)
    if not report.dry_run:
        out.print(f"sent {report.sent:,} in {report.send_seconds:.2f} s ({report.rate:,.0f} msgs/s) by the "
                  f"{report.engine} engine over {report.tasks} task(s); report: {report.report_path}")  # fmt: skip


def main() -> None:
    """``python -m pipelines.replay``: the same command as ``mqlake replay``."""
    app = typer.Typer(add_completion=False)
    app.command()(replay_command)
    run_app(app)

"""The ``tier`` command, shared by ``mqlake tier`` and ``python -m pipelines.compaction``.

Only typer is imported here: pyspark, delta-rs and Great Expectations load when the command runs.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated

import typer

from pipelines.objectstore_cli import lake_option
from pipelines.spark import ConfOption, MasterOption, add_spark_options
from store.console import console, print_error, run_app, styled


def tier_command(
    store_dir: Annotated[Path, typer.Option("--store-dir", help="The broker's store root.")],
    lake: Annotated[
        str | None,
        typer.Option(
            "--lake",
            help="Lake root, a directory or s3://bucket/prefix: messages, segments, quality_results tables "
            "(default: lakePath of --broker-conf).",
        ),
    ] = None,
    file_reserved_time: Annotated[
        float | None,
        typer.Option(
            "--file-reserved-time",
            help="Hours: also tier sealed segments whose last message is older (0: every sealed segment). "
            "Default: only what the store expired by its own fileReservedTime.",
            min=0,
        ),
    ] = None,
    master: MasterOption = None,
    conf: ConfOption = None,
    max_segments: Annotated[int | None, typer.Option("--max-segments", help="Claim at most N.", min=1)] = None,
    compact: Annotated[
        bool, typer.Option("--compact", help="Then compact closed partitions and vacuum old files.")
    ] = False,
    report: Annotated[
        Path | None, typer.Option("--report", help="JSON report path (default LAKE/_reports/tier-RUN.json).")
    ] = None,
    broker_conf: Annotated[
        Path | None,
        typer.Option("--broker-conf", help="broker.conf of the store (sizes to open it for deletion)."),
    ] = None,
    broker_name: Annotated[
        str | None,
        typer.Option(
            "--broker-name",
            help="The store's broker group (the broker_name column and partition). Default: brokerName of the "
            "store's mqlake.json (its broker writes it; a flag that contradicts it is refused), else of "
            "--broker-conf, else the name the store was tiered under before, else broker-a.",
        ),
    ] = None,
    exit_zero: Annotated[
        bool, typer.Option("--exit-zero", help="Exit 0 even when a segment was quarantined (the report says so).")
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON instead of lines.")] = False,
) -> None:
    """Tier expired CommitLog segments into Delta: validate, commit once, verify, then delete."""
    from pipelines.compaction.job import tier
    from pipelines.compaction.upkeep import compact as run_compact
    from pipelines.job_progress import JobProgress

    # the job's own records at INFO; the libraries' (Great Expectations logs hundreds) only from WARNING
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("pipelines").setLevel(logging.INFO)
    out = console()
    if not (store_dir / "commitlog").is_dir():
        raise typer.BadParameter(f"{store_dir} has no commitlog directory", param_hint="--store-dir")
    store_config = None
    if broker_conf is not None:
        from broker.config import BrokerConfigError, load_broker_conf

        try:
            broker_config, store_config = load_broker_conf(broker_conf, {"lakePath": lake, "brokerName": broker_name})
        except BrokerConfigError as e:
            raise typer.BadParameter(str(e), param_hint="--broker-conf") from None
        lake, broker_name = broker_config.lake_path, broker_config.broker_name
    if lake is None:
        raise typer.BadParameter("give --lake, or a --broker-conf that sets lakePath", param_hint="--lake")
    lake = lake_option(lake)
    from lake.broker_names import BrokerNameError

    with JobProgress("tier", console(stderr=True)):
        try:
            result = tier(
                store_dir, lake, file_reserved_time=file_reserved_time, max_segments=max_segments, report=report,
                store_config=store_config, broker_name=broker_name, **add_spark_options(master, conf),
            )  # fmt: skip
        except BrokerNameError as e:
            print_error(str(e))
            raise typer.Exit(2) from None
    if not json_out:
        _print(out, result)
        if not result.segments:
            out.print(waiting_segments_note(store_dir, store_config), highlight=False)
    compacted = run_compact(lake) if compact else None
    if json_out:
        print(json.dumps({**result.to_json(), "report_path": result.report_path, "compaction": compacted}))
    else:
        if compacted is not None:
            out.print("compaction: " + json.dumps(compacted))
        out.print(f"report: {result.report_path}")
    if result.by_state("quarantined") and not exit_zero:
        raise typer.Exit(1)


def _print(out, result) -> None:
    for s in result.segments:
        style = "green" if s.state == "tiered" else "red" if s.state == "quarantined" else "yellow"
        out.print(styled((f"{s.state:12}", style), f" {s.segment}  rows={s.rows}  {s.reason}"))
    if not result.segments:
        out.print("no expired segments to tier")
    if result.delete_error:
        out.print(styled(("deleting tiered segments failed", "red"), f": {result.delete_error}"))
    elif result.deleted is None:
        out.print("a broker holds the store: it deletes the tiered segments in its clean pass")
    elif result.deleted:
        out.print(f"deleted {len(result.deleted)} tiered segment(s)")
    for t in result.typed:
        if t.get("error"):
            out.print(styled(("typed table not written", "red"), f" {t['topic']}: {t['error']}"))
        else:
            out.print(f"typed {t['topic']}: rows={t['rows']} decode_errors={t['errors']}")
    out.print("phases (s): " + json.dumps({k: round(v, 2) for k, v in result.phases.items()}))


def waiting_segments_note(store_dir: Path, store_config=None) -> str:
    """Why nothing was tiered: how many sealed segments wait, when the first expires, and how to take them now."""
    import time

    from store.config import MessageStoreConfig
    from store.console import time_text
    from store.retention import SegmentManifest, SegmentState

    hours = (store_config or MessageStoreConfig()).file_reserved_time
    sealed = [e for e in SegmentManifest(store_dir).entries() if e.state == SegmentState.SEALED]
    if not sealed:
        return ("no sealed segment waits either: a segment is sealed when the next one starts (mappedFileSizeCommitLog "
                "sets their size), and the broker records it at its next clean pass (every cleanResourceInterval "
                "ms, 10,000 by default)")  # fmt: skip
    last = [e.last_store_time for e in sealed if e.last_store_time]
    first_expiry = f", the first at {time_text(int(min(last) + hours * 3_600_000))}" if last else ""
    oldest_h = (time.time() * 1000 - min(last)) / 3_600_000 if last else 0.0
    return (f"{len(sealed)} sealed segment(s) wait to expire after fileReservedTime={hours:g} h{first_expiry}; "
            f"--file-reserved-time H tiers those whose last message is older than H hours now (the oldest is "
            f"{oldest_h:.2f} h old), --file-reserved-time 0 every sealed one")  # fmt: skip


def main() -> None:
    """``python -m pipelines.compaction``: the same command as ``mqlake tier``."""
    app = typer.Typer(add_completion=False)
    app.command()(tier_command)
    run_app(app)

"""The ``tier`` command, shared by ``mqlake tier`` and ``python -m pipelines.compaction``.

Only typer is imported here: pyspark, delta-rs and Great Expectations load when the command runs.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated

import typer

from pipelines.spark import ConfOption, MasterOption, add_spark_options


def tier_command(
    store_dir: Annotated[Path, typer.Option("--store-dir", help="The broker's store root.")],
    lake: Annotated[Path, typer.Option("--lake", help="Lake root: messages, segments, quality_results tables.")],
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
    exit_zero: Annotated[
        bool, typer.Option("--exit-zero", help="Exit 0 even when a segment was quarantined (the report says so).")
    ] = False,
) -> None:
    """Tier expired CommitLog segments into Delta: validate, commit once, verify, then delete."""
    from rich.console import Console

    from pipelines.compaction.job import tier
    from pipelines.compaction.upkeep import compact as run_compact

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    console = Console()
    if not (store_dir / "commitlog").is_dir():
        raise typer.BadParameter(f"{store_dir} has no commitlog directory", param_hint="--store-dir")
    store_config = None
    if broker_conf is not None:
        from broker.config import load_broker_conf

        store_config = load_broker_conf(broker_conf)[1]
    result = tier(
        store_dir, lake, file_reserved_time=file_reserved_time, max_segments=max_segments, report=report,
        store_config=store_config, **add_spark_options(master, conf),
    )  # fmt: skip
    for s in result.segments:
        style = "green" if s.state == "tiered" else "red" if s.state == "quarantined" else "yellow"
        console.print(f"[{style}]{s.state:12}[/] {s.segment}  rows={s.rows}  {s.reason}")
    if not result.segments:
        console.print("no expired segments to tier")
    if result.delete_error:
        console.print(f"[red]deleting tiered segments failed[/]: {result.delete_error}")
    elif result.deleted is None:
        console.print("a broker holds the store: it deletes the tiered segments in its clean pass")
    elif result.deleted:
        console.print(f"deleted {len(result.deleted)} tiered segment(s)")
    console.print("phases (s): " + json.dumps({k: round(v, 2) for k, v in result.phases.items()}))
    if compact:
        console.print("compaction: " + json.dumps(run_compact(lake)))
    console.print(f"report: {result.report_path}")
    if result.by_state("quarantined") and not exit_zero:
        raise typer.Exit(1)


def main() -> None:
    app = typer.Typer(add_completion=False)
    app.command()(tier_command)
    app()

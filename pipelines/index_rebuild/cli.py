"""``mqlake verify-index`` and ``mqlake store adopt-index`` (also ``python -m pipelines.index_rebuild``).

Only typer is imported here: pyspark, numpy and delta-rs load when a command runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from pipelines.objectstore_cli import lake_option
from pipelines.spark import ConfOption, MasterOption, add_spark_options
from store.console import console, print_error, run_app


def verify_index_command(
    store_dir: Annotated[Path, typer.Option("--store-dir", help="The broker's store root.")],
    report: Annotated[Path | None, typer.Option("--report", help="Write the JSON report here.")] = None,
    lake: Annotated[
        str | None, typer.Option("--lake", help="Lake root: append one row per queue / index file to "
                                                 "the Delta table index_verification."),
    ] = None,
    repair: Annotated[bool, typer.Option("--repair", help="Write the rebuilt files (needs --out).")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="Empty directory for the rebuilt files.")] = None,
    master: MasterOption = None,
    conf: ConfOption = None,
    engine: Annotated[
        str | None,
        typer.Option("--engine", show_default=False,
                     help="Scan the CommitLog 'local'ly (this process, every core) or with 'spark' (the executors "
                          "read it). Default: spark when the master is not local (--master, spark-submit's, "
                          "$MQLAKE_SPARK_MASTER), else local."),
    ] = None,
    broker_conf: Annotated[
        Path | None, typer.Option("--broker-conf", help="broker.conf of the store (file sizes, delay levels).")
    ] = None,
    run_id: Annotated[
        str | None,
        typer.Option("--run-id", help="Name this verification ([A-Za-z0-9_-]); a rerun under the same id replaces "
                                      "its rows in index_verification instead of adding more."),
    ] = None,
    exit_zero: Annotated[
        bool, typer.Option("--exit-zero", help="Exit 0 even on a mismatch (the report says so); 2 still means "
                                               "the store could not be verified."),
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the JSON report instead of the table.")] = False,
) -> None:
    """Rebuild ConsumeQueue and IndexFile from the CommitLog and compare them with the live files.

    Exit 0 when everything matches, 1 on any mismatch (each named by topic, queue, offsets and file),
    2 when the store cannot be verified.
    """
    from pipelines.index_rebuild.job import verify_index
    from pipelines.index_rebuild.report import print_summary
    from pipelines.job_progress import JobProgress
    from store.errors import MQLakeError

    if repair != (out is not None):
        raise typer.BadParameter("--repair and --out go together", param_hint="--out")
    spark_kwargs = add_spark_options(master, conf)
    store_config = None
    if broker_conf is not None:
        from broker.config import BrokerConfigError, load_broker_conf

        try:
            store_config = load_broker_conf(broker_conf, {"storePathRootDir": store_dir})[1]
        except BrokerConfigError as e:
            raise typer.BadParameter(str(e), param_hint="--broker-conf") from None
    try:
        with JobProgress("verify-index", console(stderr=True)):
            result = verify_index(store_dir, report_path=report, lake=lake and lake_option(lake), repair_out=out,
                                  store_config=store_config, run_id=run_id, engine=engine, **spark_kwargs)  # fmt: skip
    except MQLakeError as e:  # VerifyError, or the store's own (a file of a size it cannot open, ...)
        print_error(e)
        raise typer.Exit(2) from None
    except OSError as e:  # unreadable (permissions), vanished, a name the file system refuses
        print_error(f"{e.filename or store_dir}: cannot read: {e.strerror or e}")
        raise typer.Exit(2) from None
    if json_out:
        print(json.dumps(result, default=str))
    else:
        print_summary(result, console())
    raise typer.Exit(0 if result["summary"]["ok"] or exit_zero else 1)


def adopt_index_command(
    store_dir: Annotated[Path, typer.Option("--store-dir", help="The stopped broker's store root.")],
    from_dir: Annotated[Path, typer.Option("--from", help="The --out directory of `verify-index --repair`.")],
) -> None:
    """Install rebuilt ConsumeQueue/IndexFile files into a STOPPED broker's store; replaced files are backed up."""
    from pipelines.index_rebuild.adopt import adopt_index
    from store.errors import MQLakeError

    try:
        res = adopt_index(store_dir, from_dir)
    except (MQLakeError, OSError) as e:
        print_error(e)
        raise typer.Exit(1) from None
    console().print(f"installed {len(res.queues)} ConsumeQueue(s) and {len(res.index_files)} IndexFile(s); "
                  f"replaced files are in {res.backup}")  # fmt: skip


def main() -> None:
    """``python -m pipelines.index_rebuild``: the same command as ``mqlake verify-index``."""
    app = typer.Typer(add_completion=False)
    app.command()(verify_index_command)
    run_app(app)

"""A lake tiered before several brokers (``messages`` partitioned by topic and store date, ``segments`` and
``replay_progress`` without a broker column): refused by the tier, the replay and a named broker reader with the
migration to run, then ``mqlake tier-migrate`` gives it the column in one commit per table, keeping its rows
and its transaction ids."""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from typer.testing import CliRunner

from lake import tables
from lake.schema import SEGMENTS_SCHEMA
from lake.tables import STORE_DATE
from tests.fixtures_spark import WrittenStore, write_store

pytestmark = pytest.mark.unit

OLD_STORE = "0123456789abcdef"  # the store id an earlier tier run recorded
OLD_VERSION = 1234  # the txn version it recorded


def _old_lake(written: WrittenStore, root: Path | str) -> int:
    """The tables as mqlake wrote them before the broker column (``root`` local or ``s3://``); returns the rows of
    ``messages``."""
    from deltalake import CommitProperties, Transaction
    from deltalake import write_deltalake as write_local

    from lake.objectstore import storage_options
    from pipelines.replay import progress
    from pipelines.segment_reader import read_segment

    def write_deltalake(uri: str, *args, **kwargs) -> None:
        write_local(uri, *args, storage_options=storage_options(uri), **kwargs)

    rows = pa.Table.from_batches([b for n in written.segment_names()[:-1] for b in read_segment(written.commitlog / n)])
    day = pc.cast(pc.divide(rows["store_timestamp"], 86_400_000), pa.int32()).cast(pa.date32())
    rows = rows.append_column(STORE_DATE, day)
    txn = CommitProperties(app_transactions=[Transaction(f"mqlake-tier:{OLD_STORE}", OLD_VERSION)])
    write_deltalake(tables.table_uri(root, tables.MESSAGES), rows, partition_by=["topic", STORE_DATE],
                    commit_properties=txn)  # fmt: skip
    old_segments = pa.schema([f for f in SEGMENTS_SCHEMA if f.name != tables.BROKER_NAME])
    segment = {f.name: None for f in old_segments} | {
        "store_id": OLD_STORE, "segment": "0" * 20, "base_offset": 0, "file_size": 1, "record_count": 1,
        "valid_bytes": 1, "file_crc32c": 0, "body_crc_sum": 0, "run_id": "r", "messages_version": 0,
        "tiered_at": pa.scalar(0, pa.timestamp("us", tz="UTC")).as_py(),
        "queue_ranges": [{"topic": "Orders", "queue_id": 0, "first_offset": 0, "last_offset": 9, "count": 10}],
    }  # fmt: skip
    write_deltalake(tables.table_uri(root, tables.SEGMENTS), pa.Table.from_pylist([segment], old_segments),
                    commit_properties=txn)  # fmt: skip
    old_progress = pa.schema([f for f in progress.PROGRESS_SCHEMA if f.name != "source_broker"])
    mark = {"replay_id": "old-1", "source_topic": "Orders", "source_queue": 0, "last_offset": 5, "watermarks": [],
            "sent": 6, "spec_hash": "h", "run_id": "r", "seq": 1, "updated_at": segment["tiered_at"]}  # fmt: skip
    write_deltalake(progress.table_uri(root, progress.PROGRESS), pa.Table.from_pylist([mark], old_progress))
    return rows.num_rows


def assert_migrated(dt, lake: Path | str, count: int, before: dict[int, bytes]) -> None:
    """The old lake of :func:`_old_lake`, migrated to ``broker-a``: same rows, partitioned by broker, with the
    transaction id and replay progress it had."""
    from lake.broker_names import resolve
    from pipelines.replay import progress
    from store.identity import StoreIdentity

    assert list(dt.metadata().partition_columns) == tables.MESSAGES_PARTITION_BY
    after = dt.to_pyarrow_table().to_pylist()
    assert len(after) == count and {r["broker_name"] for r in after} == {"broker-a"}
    assert {r["commitlog_offset"]: r["body"] for r in after} == before
    # a re-run of the store tiered before still skips what it committed before the migration
    assert dt.transaction_version(f"mqlake-tier:{OLD_STORE}") == OLD_VERSION
    # the store's mqlake.json names no broker and no flag does: the name the lake recorded for the store
    assert resolve(lake, "old-store", StoreIdentity(OLD_STORE), None) == "broker-a"
    assert progress.read_progress(lake, "old-1")[("broker-a", "Orders", 0)].last_offset == 5


def test_an_old_lake_is_refused_then_migrated_once_keeping_rows_and_transaction_ids(tmp_path, caplog):
    from deltalake import DeltaTable

    from cli.main import app
    from lake.broker_names import BrokerNameError
    from lake.reader import LakeReader
    from pipelines.compaction.job import TierJob
    from pipelines.replay import progress

    written = write_store(tmp_path / "store", 300)
    lake = tmp_path / "lake"
    count = _old_lake(written, lake)
    messages = tables.table_uri(lake, tables.MESSAGES)
    before = {r["commitlog_offset"]: r["body"] for r in DeltaTable(messages).to_pyarrow_table().to_pylist()}
    runner = CliRunner()

    # the tier names the tables and the command to run, before it claims anything
    with pytest.raises(BrokerNameError, match=r"messages.*segments.*mqlake tier-migrate --lake"):
        TierJob(written.root, lake, broker_name="broker-a")
    refused = runner.invoke(app, ["tier", "--store-dir", str(written.root), "--lake", str(lake)])
    assert refused.exit_code == 2 and "tier-migrate" in refused.output
    with pytest.raises(progress.ReplaySpecError, match="tier-migrate"):
        progress.read_progress(lake, "old-1")
    # a broker reading its own rows cannot tell whose these are: it serves local data only, and says why
    with caplog.at_level(logging.WARNING):
        assert LakeReader(lake, broker_name="broker-a").pull("Orders", 0, 0, 10, 10, 1 << 20) is None
    assert "tier-migrate" in caplog.text

    migrated = runner.invoke(app, ["tier-migrate", "--lake", str(lake), "--broker-name", "broker-a"])
    assert migrated.exit_code == 0, migrated.output
    dt = DeltaTable(messages)
    assert_migrated(dt, lake, count, before)

    mine = LakeReader(lake, broker_name="broker-a").pull("Orders", 0, 0, 1 << 40, 32, 1 << 30)
    assert mine is not None and mine.queue_offsets[0] == 0
    assert LakeReader(lake, broker_name="broker-b").pull("Orders", 0, 0, 1 << 40, 32, 1 << 30) is None
    version = dt.version()
    again = runner.invoke(app, ["tier-migrate", "--lake", str(lake), "--broker-name", "broker-a"])
    assert again.exit_code == 0 and '"migrated": true' not in again.output
    assert DeltaTable(messages).version() == version

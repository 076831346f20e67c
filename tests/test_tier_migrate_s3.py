"""``mqlake tier-migrate --lake s3://...``: a lake on S3-compatible storage (moto's server on loopback,
tests/s3_server.py) written in the layout before the broker column is refused, then migrated in place through
the conditional-put commits delta-rs makes there, keeping its rows and transaction ids; with the endpoint down
the command fails naming it."""

from __future__ import annotations

import uuid

import pytest
from typer.testing import CliRunner

from lake import tables
from tests.fixtures_spark import write_store
from tests.s3_server import BUCKET, running_s3
from tests.test_tier_migrate import _old_lake, assert_migrated

pytestmark = pytest.mark.integration  # moto's server in a child process


@pytest.fixture
def s3(tmp_path):
    with running_s3(tmp_path) as server:
        yield server


def test_an_old_lake_on_s3_is_refused_then_migrated_once_in_place(tmp_path, s3):
    from deltalake import DeltaTable

    from cli.main import app
    from lake.broker_names import BrokerNameError
    from lake.objectstore import storage_options
    from pipelines.compaction.job import TierJob

    written = write_store(tmp_path / "store", 300)
    lake = f"s3://{BUCKET}/old-{uuid.uuid4().hex[:8]}"
    count = _old_lake(written, lake)
    messages = tables.table_uri(lake, tables.MESSAGES)

    def table(uri: str) -> DeltaTable:
        return DeltaTable(uri, storage_options=storage_options(uri))

    before = {r["commitlog_offset"]: r["body"] for r in table(messages).to_pyarrow_table().to_pylist()}
    assert list(table(messages).metadata().partition_columns) == ["topic", tables.STORE_DATE]
    with pytest.raises(BrokerNameError, match="mqlake tier-migrate --lake s3://"):
        TierJob(written.root, lake, broker_name="broker-a")
    runner = CliRunner()

    migrated = runner.invoke(app, ["tier-migrate", "--lake", lake, "--broker-name", "broker-a"])
    assert migrated.exit_code == 0, migrated.output
    dt = table(messages)
    assert_migrated(dt, lake, count, before)
    # the new files are in the bucket under the broker's partition
    key = lake[len(f"s3://{BUCKET}/") :]
    assert any("/broker_name=broker-a/" in k for k in s3.keys(BUCKET, f"{key}/{tables.MESSAGES}/"))

    version = dt.version()
    again = runner.invoke(app, ["tier-migrate", "--lake", lake, "--broker-name", "broker-a"])
    assert again.exit_code == 0 and '"migrated": true' not in again.output, again.output
    assert table(messages).version() == version

    missing = runner.invoke(app, ["tier-migrate", "--lake", f"s3://{BUCKET}/no-lake-here", "--broker-name", "b"])
    assert missing.exit_code == 2 and "no-lake-here" in missing.output

    s3.down()
    down = runner.invoke(app, ["tier-migrate", "--lake", lake, "--broker-name", "broker-a"])
    assert down.exit_code == 1 and s3.endpoint in down.output, down.output

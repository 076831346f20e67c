"""The lake on S3-compatible object storage (moto's server on loopback, tests/s3_server.py), end to end: a real
``mqlake up`` with ``lakePath=s3://...`` and 64 KiB segments, the real tier job (local Spark) committing to
the bucket, with the endpoint taken down between staging and commit on its first run; then ``mqlake sql``,
replay and the broker's fall-through pulls, all reading the tier from the bucket.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest

from lake.objectstore import ObjectStoreError, S3Settings, lake_location
from store.retention import SegmentManifest, SegmentState
from tests.fixtures_broker import MqlakeServer, read_topic, stop_servers
from tests.harness import expect_errors
from tests.helpers import wait_until
from tests.s3_server import BUCKET, S3Server, running_s3
from tests.tiering_broker import (
    Sent,
    in_queue,
    min_offset,
    produce,
    start_tiering_broker,
    wait_deleted,
    wait_sealed,
    walk,
)

TOPIC = "S3Tiered"
QUEUES = 4
COUNT = 480


@dataclass
class Run:
    server: MqlakeServer
    s3: S3Server
    lake: str
    sent: list[Sent]
    fault: str  # the first run's error
    after_fault: dict[int, SegmentState]  # the claimed segments' states after it
    files_after_fault: list[str]  # the segment files on disk after it
    claimed: list[int]
    tiered: list[int]  # base offsets tiered once the endpoint was back (by the second run or the broker's own)
    tiered_rows: int

    def queue(self, queue_id: int) -> list[Sent]:
        return in_queue(self.sent, queue_id)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with running_s3(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture(scope="module")
def run(spark, s3, tmp_path_factory) -> Run:
    from lake.tables import MESSAGES, table_uri
    from pipelines.compaction import staging
    from pipelines.compaction.job import tier
    from pipelines.spark_tables import read_table

    work = tmp_path_factory.mktemp("s3_lake")
    lake = f"s3://{BUCKET}/lake"
    server = start_tiering_broker(work / "server", lake, QUEUES)
    try:
        sent = asyncio.run(produce(server.namesrv_addr, TOPIC, COUNT, "s3"))
        manifest = SegmentManifest(server.store_dir)
        wait_sealed(server.store_dir, 2)

        # First run: the endpoint goes down once the segments are staged (before anything is written to it)
        real_stage = staging.stage

        def stage_then_endpoint_down(*args, **kwargs):
            staged = real_stage(*args, **kwargs)
            s3.down()
            return staged

        # the broker's own scheduled tier run may fall into the outage (the endpoint refusing connections, or back
        # without its bucket until it is made again) and log that it failed
        expect_errors(rf"tier run failed .*S3 endpoint {re.escape(s3.endpoint)}, s3://{BUCKET}/lake/")
        staging.stage = stage_then_endpoint_down
        try:
            with pytest.raises(ObjectStoreError) as failed:
                tier(server.store_dir, lake, spark=spark, file_reserved_time=0)
        finally:
            staging.stage = real_stage
        claimed = [e.base_offset for e in manifest.entries() if e.state != SegmentState.ACTIVE]
        after = {e.base_offset: e.state for e in manifest.entries() if e.base_offset in claimed}
        files = sorted(p.name for p in (server.store_dir / "commitlog").iterdir())

        s3.up()  # the endpoint is back (moto comes back empty: nothing was in the bucket before this run)
        tier(server.store_dir, lake, spark=spark, file_reserved_time=0)

        # the broker's own scheduled run may claim some of them first (the claims serialise the two): whichever
        # tiers them, every segment the failed run had claimed must reach the lake
        def tiered_now() -> set[int]:
            return {e.base_offset for e in manifest.entries() if e.state in (SegmentState.TIERED,
                                                                             SegmentState.DELETED)}  # fmt: skip

        wait_until(lambda: set(claimed) <= tiered_now(), 120, what="the claimed segments to be tiered")
        tiered = sorted(tiered_now())
        rows = read_table(spark, table_uri(lake, MESSAGES)).count()
        yield Run(server, s3, lake, sent, str(failed.value), after, files, claimed, tiered, rows)
    finally:
        stop_servers([server])


@pytest.mark.spark
def test_endpoint_down_at_commit_deletes_nothing_and_the_next_run_commits(run):
    assert f"S3 endpoint {run.s3.endpoint}, s3://{BUCKET}/lake/" in run.fault and "Connection refused" in run.fault
    assert run.claimed
    # nothing tiered or deleted: the claims went back, every segment file is still there, nothing committed
    assert all(s in (SegmentState.SEALED, SegmentState.EXPIRED) for s in run.after_fault.values()), run.after_fault
    assert {f"{b:020d}" for b in run.claimed} <= set(run.files_after_fault)
    # once the endpoint was back, what the first run had claimed was tiered
    assert set(run.claimed) <= set(run.tiered) and run.tiered_rows > 0
    keys = run.s3.keys(BUCKET, "lake/messages/")
    assert any(k.endswith(".parquet") for k in keys) and any(k.endswith("00000000000000000000.json") for k in keys)


def _tiered_prefixes(run: Run, rows: list[dict]) -> None:
    """``rows`` (queue_id, queue_offset, body) are exactly the first messages of each queue as sent."""
    by_queue: dict[int, list[tuple[int, bytes]]] = {}
    for r in rows:
        by_queue.setdefault(r["queue_id"], []).append((r["queue_offset"], bytes(r["body"])))
    assert sum(len(v) for v in by_queue.values()) == run.tiered_rows
    for q, got in by_queue.items():
        want = [(s.queue_offset, s.body) for s in run.queue(q)][: len(got)]
        assert sorted(got) == want, f"queue {q}"


@pytest.mark.spark
def test_sql_reads_the_tier_from_the_bucket(run):
    import base64

    from pipelines.sql_cli import run_sql

    out, err = io.StringIO(), io.StringIO()
    query = f"SELECT queue_id, queue_offset, body FROM messages WHERE topic = '{TOPIC}'"
    code = run_sql(lake_location(run.lake), query, output="json", out=out, err=err)
    assert code == 0, err.getvalue()
    rows = [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]
    for r in rows:
        r["body"] = base64.b64decode(r["body"])
    _tiered_prefixes(run, rows)


@pytest.mark.spark
def test_replay_reads_the_tier_from_the_bucket_into_a_new_topic(spark, run):
    from pipelines.replay.job import replay
    from pipelines.replay.spec import ReplaySpec

    # batch_size: a batch request is one message to the broker, and must fit its 64 KiB segments (128 replayed
    # messages of this size, with their REPLAY_SOURCE_* properties, come within a few KiB of it)
    spec = ReplaySpec(lake=lake_location(run.lake), source_topics=(TOPIC,), target_topic="S3Replayed",
                      namesrv=run.server.namesrv_addr, replay_id="s3-1", batch_size=32)  # fmt: skip
    report = replay(spec, spark=spark)
    assert report.sent == run.tiered_rows
    got = read_topic(run.server.namesrv_addr, "S3Replayed", run.tiered_rows)
    rows = [{"queue_id": q, "queue_offset": i, "body": m.body} for q, msgs in got.items() for i, m in enumerate(msgs)]
    _tiered_prefixes(run, rows)  # queues are preserved, and in source order
    assert Path(report.report_path).is_file()  # run reports of a lake on S3 stay on local disk


@pytest.mark.spark
def test_the_broker_serves_deleted_segments_from_the_bucket(run):
    wait_deleted(run.server.store_dir, run.tiered)
    assert not {f"{b:020d}" for b in run.tiered} & {p.name for p in (run.server.store_dir / "commitlog").iterdir()}
    for queue_id in range(QUEUES):
        bodies = asyncio.run(walk(run.server.namesrv_addr, TOPIC, queue_id, max_nums=16))
        assert min_offset(run.server, TOPIC, queue_id) == 0, f"queue {queue_id}"
        assert bodies == [s.body for s in run.queue(queue_id)], f"queue {queue_id}"
    assert "cannot read the tier" not in run.server.log_text()


# --------------------------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_concurrent_commits_to_one_table_on_s3_lose_none(s3, tmp_path):
    """Writers racing for the same table versions: each commit lands once (conditional puts), none replaces
    another's."""
    import pyarrow.parquet as pq

    from lake import delta as lk
    from lake.delta import append_arrow

    uri = f"s3://{BUCKET}/race"
    schema = pa.schema([pa.field("writer", pa.int64(), nullable=False)])
    append_arrow(uri, pa.table({"writer": [0]}, schema=schema), app_id="w0", version=1)
    writers = 6
    barrier = threading.Barrier(writers)
    versions: dict[int, int | None] = {}
    errors: list[str] = []

    def write(i: int) -> None:
        root = tmp_path / f"w{i}"
        root.mkdir()
        pq.write_table(pa.table({"writer": [i]}, schema=schema), root / f"part-{i}.parquet")
        adds = lk.add_actions(root, [root / f"part-{i}.parquet"])
        from lake.objectstore import upload

        upload([root / f"part-{i}.parquet"], root, uri)
        barrier.wait()
        try:
            versions[i] = lk.commit_files(uri, adds, schema=schema, partition_by=[], app_id=f"w{i}", version=1)
        except Exception as e:  # asserted below
            errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=write, args=(i,)) for i in range(1, writers + 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert sorted(versions.values()) == list(range(1, writers + 1))  # one version each, none shared
    assert sorted(lk.to_arrow(uri)["writer"].to_pylist()) == list(range(writers + 1))
    assert all(lk.transaction_version(uri, f"w{i}") == 1 for i in range(writers + 1))


@pytest.mark.unit
def test_unsafe_rename_and_other_schemes_are_refused():
    with pytest.raises(ObjectStoreError, match="AWS_S3_ALLOW_UNSAFE_RENAME"):
        S3Settings.from_env({"AWS_S3_ALLOW_UNSAFE_RENAME": "true"})
    with pytest.raises(ObjectStoreError, match="gs://b/lake"):
        lake_location("gs://b/lake")
    with pytest.raises(ObjectStoreError, match="no bucket"):
        lake_location("s3:///lake")
    assert lake_location("s3://b/lake/") == "s3://b/lake" and lake_location("rel/lake") == Path("rel/lake")
    opts = S3Settings.from_env({"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ALLOW_HTTP": "true"}).storage_options()
    assert opts["conditional_put"] == "etag" and opts["AWS_ALLOW_HTTP"] == "true"
    assert "AWS_S3_ALLOW_UNSAFE_RENAME" not in opts


@pytest.mark.unit
def test_lake_path_in_broker_conf_keeps_an_s3_uri_and_the_embedded_tier_passes_it_on(tmp_path):
    from broker.config import BrokerConfigError, load_broker_conf
    from cli.servers import _tier_command

    conf = tmp_path / "broker.conf"
    conf.write_text(f"storePathRootDir={tmp_path / 'store'}\nlakePath=s3://{BUCKET}/lake/\n")
    broker_cfg, store_cfg = load_broker_conf(conf)
    assert broker_cfg.lake_path == f"s3://{BUCKET}/lake"
    argv = _tier_command(broker_cfg, store_cfg, conf)
    assert argv[argv.index("--lake") + 1] == f"s3://{BUCKET}/lake"
    conf.write_text("lakePath=relative/lake\n")
    assert load_broker_conf(conf)[0].lake_path == Path("relative/lake")
    conf.write_text("lakePath=gs://bucket/lake\n")
    with pytest.raises(BrokerConfigError, match="gs://bucket/lake"):
        load_broker_conf(conf)


@pytest.mark.spark
def test_verify_index_appends_its_rows_to_the_bucket_once_per_run_id(spark, s3, spark_store, tmp_path):
    from typer.testing import CliRunner

    from cli.main import app
    from lake import delta as lk

    lake = f"s3://{BUCKET}/verify-lake"

    def verify() -> int:
        result = CliRunner().invoke(app, ["verify-index", "--store-dir", str(spark_store.root), "--lake", lake,
                                          "--run-id", "s3-nightly", "--report", str(tmp_path / "r.json")])  # fmt: skip
        assert result.exit_code == 0, result.output
        return lk.to_arrow(f"{lake}/index_verification").num_rows

    once = verify()
    assert once > 0 and verify() == once  # a rerun under its run id replaces its rows

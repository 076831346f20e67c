"""Spark fixtures: one session-scoped SparkSession for the whole suite, and a small written store and lake.

- ``spark``: the session (``local[2]``, commitlog source registered).  Never stop it in a test.
- ``spark_store``: a store written by the real MessageStore with 64 KiB segments (several sealed,
  BLANK-ended segments and an active tail), many topics / queues / keys / tags / properties, V2
  (long-topic) records; carries the rows each message must decode to.
- ``spark_lake``: a lake directory whose Delta table ``messages`` holds that store's sealed segments,
  committed one segment per commit through ``lake.delta``.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest

from store.format import msgid, properties, records, units
from tests.helpers import SMALL_COMMITLOG, make_config, make_message

LONG_TOPIC = "Long" + "x" * 150  # over 127 bytes: stored as a V2 record
TOPICS = ["Orders", "Payments", "Audit", LONG_TOPIC]
MESSAGE_COUNT = 700


@pytest.fixture(scope="session")
def spark():
    from pipelines.spark import get_spark

    # C1-only JIT starts the JVM about 2 s faster; tests are small, so peak speed does not matter.
    saved = os.environ.get("JAVA_TOOL_OPTIONS")
    os.environ["JAVA_TOOL_OPTIONS"] = f"{saved} -XX:TieredStopAtLevel=1" if saved else "-XX:TieredStopAtLevel=1"
    try:
        session = get_spark(
            master="local[2]",
            app_name="mqlake-tests",
            conf={"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "1g"},
        )
    finally:
        if saved is None:
            os.environ.pop("JAVA_TOOL_OPTIONS", None)
        else:
            os.environ["JAVA_TOOL_OPTIONS"] = saved
    yield session
    session.stop()


@dataclass
class WrittenStore:
    root: Path  # the store root
    segment_size: int
    expected: dict[int, dict]  # commitlog offset -> the row the source must produce

    @property
    def commitlog(self) -> Path:
        return self.root / "commitlog"

    def segment_names(self) -> list[str]:
        return sorted(p.name for p in self.commitlog.iterdir())

    def rows_in(self, segment: str) -> list[dict]:
        return [r for r in self.expected.values() if r["segment"] == segment]

    def sealed_rows(self) -> dict[int, dict]:
        """The rows of every segment but the active (last) one, by commitlog offset: what ``spark_lake`` holds."""
        sealed = set(self.segment_names()[:-1])
        return {o: r for o, r in sorted(self.expected.items()) if r["segment"] in sealed}


def _body(i: int) -> bytes:
    if i % 11 == 0:
        return bytes(range(256))[: 50 + i % 200]  # not UTF-8
    return (f"message {i} " + "é" * (i % 5) + "·" * (i % 90)).encode()


def write_store(root: Path, count: int = MESSAGE_COUNT) -> WrittenStore:
    """Write ``count`` varied messages with the real store and return the rows they must decode to."""
    from store.message_store import MessageStore

    config = make_config(root)
    expected: dict[int, dict] = {}
    with MessageStore(config) as store:
        for i in range(count):
            topic = TOPICS[i % len(TOPICS)]
            extra = {"color": ["red", "green", "blå"][i % 3]} if i % 4 else {}
            msg = make_message(
                topic, i % 4, _body(i), tags=f"tag{i % 5}" if i % 7 else None, keys=[f"k{i}", f"g{i % 10}"],
                uniq_key=(i % 9 != 0), born_timestamp=1_795_000_000_000 + i, **extra,
            )  # fmt: skip
            msg.flag = i % 3
            res = store.put_message(msg)
            assert res.ok, res
            a = res.append
            props = properties.decode_properties(msg.properties)
            expected[a.wrote_offset] = {
                "topic": topic, "queue_id": i % 4, "queue_offset": a.queue_offset,
                "commitlog_offset": a.wrote_offset, "msg_size": a.wrote_bytes,
                "magic": records.MESSAGE_MAGIC_V2 if topic == LONG_TOPIC else records.MESSAGE_MAGIC_V1,
                "body_crc": zlib.crc32(msg.body) & 0x7FFFFFFF, "crc_ok": True, "flag": i % 3, "sys_flag": 0,
                "born_timestamp": msg.born_timestamp, "born_host": msgid.host_string(msg.born_host),
                "store_timestamp": a.store_timestamp, "store_host": config.store_host, "reconsume_times": 0,
                "prepared_txn_offset": 0, "tags": props.get("TAGS"), "keys": props.get("KEYS"),
                "uniq_key": props.get("UNIQ_KEY"), "msg_id": res.msg_ids[0], "properties": props,
                "body": msg.body,
                "segment": units.offset_to_file_name(a.wrote_offset - a.wrote_offset % SMALL_COMMITLOG),
                "position": a.wrote_offset % SMALL_COMMITLOG,
            }  # fmt: skip
    return WrittenStore(Path(config.store_path_root_dir), SMALL_COMMITLOG, expected)


@pytest.fixture(scope="session")
def spark_store(tmp_path_factory) -> WrittenStore:
    return write_store(tmp_path_factory.mktemp("spark_store"))


def spark_row(row) -> dict:
    """A Spark Row as plain Python values comparable with ``WrittenStore.expected`` rows."""
    d = row.asDict()
    for k, v in d.items():
        if isinstance(v, bytearray):
            d[k] = bytes(v)
    return d


@pytest.fixture(scope="session")
def spark_lake(spark, spark_store, tmp_path_factory) -> Path:
    """A lake with a ``messages`` Delta table of the store's sealed segments, one commit per segment."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    from lake import delta as lake
    from lake.schema import MESSAGE_SCHEMA

    root = tmp_path_factory.mktemp("lake")
    table = root / "messages"
    schema = pa.schema(list(MESSAGE_SCHEMA) + [pa.field("store_date", pa.date32(), nullable=False)])
    sealed = spark_store.segment_names()[:-1]
    for n, seg in enumerate(sealed):
        staging = table / f"run-{n}"  # one directory per batch: its files are exactly this batch's
        df = spark.read.format("commitlog").option("segments", str(int(seg))).load(str(spark_store.root))
        df = df.withColumn("store_date", F.to_date(F.timestamp_millis("store_timestamp")))
        df.write.partitionBy("topic", "store_date").parquet(str(staging))
        files = sorted(staging.rglob("*.parquet"))
        adds = lake.add_actions(table, files, ["topic", "store_date"])
        version = lake.commit_files(
            table, adds, schema=schema, partition_by=["topic", "store_date"], app_id=f"test:{int(seg)}", version=1
        )
        assert version == n
    return root

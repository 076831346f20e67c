"""The commitlog Spark source over segments written by the real store: rows, segment facts, splits, bad bytes."""

from __future__ import annotations

import shutil
import struct

import pytest

from lake.schema import MESSAGE_COLUMNS, SEGMENT_FACTS_SCHEMA
from pipelines import segment_reader
from pipelines import segments as seg
from store.errors import MQLakeError
from store.format import msgid, properties, records, units
from tests.fixtures_spark import LONG_TOPIC, TOPICS, spark_row


def read_rows(spark, path, **options) -> dict[int, dict]:
    reader = spark.read.format("commitlog")
    for k, v in options.items():
        reader = reader.option(k, v)
    rows = [spark_row(r) for r in reader.load(str(path)).collect()]
    by_offset = {r["commitlog_offset"]: r for r in rows}
    assert len(by_offset) == len(rows), "a record came out twice"
    return by_offset


def segment_facts(spark, path, **options) -> dict[str, dict]:
    reader = spark.read.format("commitlog").option("view", "segments")
    for k, v in options.items():
        reader = reader.option(k, v)
    return {r["segment"]: r.asDict() for r in reader.load(str(path)).collect()}


def copy_store(spark_store, tmp_path):
    dst = tmp_path / "store"
    shutil.copytree(spark_store.root, dst)
    return dst


@pytest.mark.spark
def test_rows_equal_what_was_written(spark, spark_store):
    rows = read_rows(spark, spark_store.root)
    assert set(rows) == set(spark_store.expected)
    for offset, want in spark_store.expected.items():
        got = rows[offset]
        assert list(got) == MESSAGE_COLUMNS
        assert got == want, f"record at {offset} differs"
    # the data is as varied as it claims: every topic, a V2 record, non-UTF-8 bodies, absent tags/uniq keys
    assert {r["topic"] for r in rows.values()} == set(TOPICS)
    assert {r["magic"] for r in rows.values() if r["topic"] == LONG_TOPIC} == {records.MESSAGE_MAGIC_V2}
    assert any(r["tags"] is None for r in rows.values()) and any(r["uniq_key"] is None for r in rows.values())
    assert len(spark_store.segment_names()) >= 4


@pytest.mark.spark
def test_segments_view_facts(spark, spark_store):
    names = spark_store.segment_names()
    facts = segment_facts(spark, spark_store.root)
    assert sorted(facts) == names
    assert list(next(iter(facts.values()))) == SEGMENT_FACTS_SCHEMA.names
    last_with_data = max(r["segment"] for r in spark_store.expected.values())
    for name in names:
        f = facts[name]
        rows = spark_store.rows_in(name)
        assert f["record_count"] == len(rows)
        assert f["base_offset"] == int(name) and f["file_size"] == spark_store.segment_size
        assert f["valid_bytes"] == sum(r["msg_size"] for r in rows)
        assert f["ends_with_blank"] is (name < last_with_data), name  # sealed ones end in BLANK, the tail not
        assert (f["torn_tail"], f["torn_tail_bytes"], f["crc_errors"], f["error"]) == (False, 0, 0, None)
        if rows:
            assert f["first_store_timestamp"] == min(r["store_timestamp"] for r in rows)
            assert f["last_store_timestamp"] == max(r["store_timestamp"] for r in rows)
            assert f["min_commitlog_offset"] == min(r["commitlog_offset"] for r in rows)
            assert f["max_commitlog_offset"] == max(r["commitlog_offset"] for r in rows)
        # the driver-side helper gives the same facts
        assert segment_reader.scan_segment(spark_store.commitlog / name).as_row() == f


@pytest.mark.spark
def test_splits_give_the_same_rows(spark, spark_store):
    whole = read_rows(spark, spark_store.root)
    # 4 splits per 64 KiB segment, most starting mid-record, and batches of 7 records
    df = spark.read.format("commitlog").option("splitSize", "20000").option("batchRecords", "7")
    df = df.load(str(spark_store.root))
    assert df.rdd.getNumPartitions() == 4 * len(spark_store.segment_names())
    split = {r["commitlog_offset"]: r for r in map(spark_row, df.collect())}
    assert split == whole


@pytest.mark.unit
def test_any_split_point_loses_and_repeats_nothing(spark_store):
    """Cut a segment in three around each record start, to the byte: each record is read by one split."""
    name = spark_store.segment_names()[0]
    path = spark_store.commitlog / name
    starts = sorted(r["position"] for r in spark_store.rows_in(name))

    def positions(lo, hi=None):
        return [r["position"] for b in segment_reader.read_segment(path, lo, hi) for r in b.to_pylist()]

    for i in range(1, 13):
        a = starts[i - 1] + 1  # the middle split's first record is starts[i] (or none)
        for b in range(max(a + 1, starts[i] - 9), starts[i] + 10):
            assert positions(0, a) + positions(a, b) + positions(b) == starts, f"splits at {a} and {b}"


@pytest.mark.spark
def test_select_segments_and_file_lists(spark, spark_store):
    names = spark_store.segment_names()
    picked = [names[1], names[2]]
    by_option = read_rows(spark, spark_store.root, segments=",".join(str(int(n)) for n in picked))
    assert {r["segment"] for r in by_option.values()} == set(picked)
    assert len(by_option) == sum(len(spark_store.rows_in(n)) for n in picked)
    files = ",".join(str(spark_store.commitlog / n) for n in picked)
    assert read_rows(spark, files) == by_option
    assert segment_reader.segment_files(files) == [spark_store.commitlog / n for n in picked]
    assert segment_reader.segment_files(spark_store.commitlog) == segment_reader.segment_files(spark_store.root)
    # from SQL, options included
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW live USING commitlog OPTIONS (path '{spark_store.root}', "
              f"segments '{int(picked[0])}')")  # fmt: skip
    assert spark.sql("SELECT count(*) FROM live").collect()[0][0] == len(spark_store.rows_in(picked[0]))


def _record_at(store_root, offset: int, size: int):
    name = units.offset_to_file_name(offset - offset % size)
    return store_root / "commitlog" / name, offset % size


@pytest.mark.spark
def test_flipped_body_byte_is_crc_not_ok(spark, spark_store, tmp_path):
    root = copy_store(spark_store, tmp_path)
    victim = sorted(spark_store.expected)[17]
    path, pos = _record_at(root, victim, spark_store.segment_size)
    rec = records.decode_record(path.read_bytes(), pos)
    body_at = pos + rec.total_size - len(rec.body) - (2 if rec.magic == records.MESSAGE_MAGIC_V2 else 1) - len(
        rec.topic.encode()) - 2 - len(rec.properties)  # fmt: skip
    data = bytearray(path.read_bytes())
    data[body_at + 3] ^= 0x40
    path.write_bytes(data)

    rows = read_rows(spark, root)
    assert len(rows) == len(spark_store.expected)  # nothing vanished
    assert [o for o, r in rows.items() if not r["crc_ok"]] == [victim]
    assert rows[victim]["body"] != spark_store.expected[victim]["body"]
    facts = segment_facts(spark, root)[path.name]
    assert (facts["crc_errors"], facts["error"], facts["record_count"]) == (
        1, None, len(spark_store.rows_in(path.name)))  # fmt: skip


@pytest.mark.spark
def test_broken_size_field_is_named_not_dropped(spark, spark_store, tmp_path):
    root = copy_store(spark_store, tmp_path)
    first = spark_store.segment_names()[0]
    offsets = sorted(o for o, r in spark_store.expected.items() if r["segment"] == first)
    victim = offsets[5]
    path, pos = _record_at(root, victim, spark_store.segment_size)
    data = bytearray(path.read_bytes())
    struct.pack_into(">i", data, pos, spark_store.expected[victim]["msg_size"] + 3)
    path.write_bytes(data)

    # default: the messages view fails, naming the file and the position
    with pytest.raises(Exception) as err:
        read_rows(spark, root)
    assert f"{path} at offset {pos}" in str(err.value)

    # onError=stop: the rows before it are there, the segment stops at it, other segments are whole
    rows = read_rows(spark, root, onError="stop")
    assert sorted(o for o in rows if rows[o]["segment"] == first) == offsets[:5]
    assert len(rows) == len(spark_store.expected) - (len(offsets) - 5)

    facts = segment_facts(spark, root)[first]
    assert facts["error"] is not None and f"{path} at offset {pos}" in facts["error"]
    assert "differs from" in facts["error"]  # the reason: size vs. what its fields add up to
    assert (facts["record_count"], facts["valid_bytes"], facts["torn_tail"]) == (5, pos, False)
    assert segment_reader.scan_segment(path).error == facts["error"]


@pytest.mark.spark
def test_torn_tail_of_the_active_segment(spark, spark_store, tmp_path):
    root = copy_store(spark_store, tmp_path)
    tail = max(r["segment"] for r in spark_store.expected.values())
    path = root / "commitlog" / tail
    end = sum(r["msg_size"] for r in spark_store.rows_in(tail))
    # a torn append: the record's bytes after its size and magic landed, those two (written last) did not
    props = properties.encode_properties({"TAGS": "t"})  # the record's last byte is not zero
    rec = records.encode_record(records.MessageRecord(topic="Orders", queue_id=0, body=b"torn" * 10, properties=props))
    data = bytearray(path.read_bytes())
    data[end + 8 : end + len(rec)] = rec[8:]
    path.write_bytes(data)

    facts = segment_facts(spark, root)[tail]
    assert (facts["torn_tail"], facts["torn_tail_bytes"], facts["error"]) == (True, len(rec), None)
    assert facts["valid_bytes"] == end and facts["record_count"] == len(spark_store.rows_in(tail))
    rows = read_rows(spark, root, segments=str(int(tail)))  # the valid records read as usual
    assert sorted(rows) == sorted(r["commitlog_offset"] for r in spark_store.rows_in(tail))

    # a file cut inside a record: torn, and an error naming where
    cut = root / "commitlog" / "cut"
    cut.mkdir()
    short = cut / tail
    short.write_bytes(bytes(data[: end - 10]))
    last = max(r["position"] for r in spark_store.rows_in(tail))
    f = segment_reader.scan_segment(short)
    assert f.torn_tail and f.valid_bytes == last and f"{short} at offset {last}" in f.error


@pytest.mark.spark
def test_bad_paths_and_options_are_clear_errors(spark, spark_store, tmp_path):
    with pytest.raises(FileNotFoundError, match="no CommitLog store"):
        segment_reader.segment_files(tmp_path / "nope")
    odd = tmp_path / "notasegment"
    odd.write_bytes(b"x")
    with pytest.raises(ValueError, match="20-digit base offset"):
        segment_reader.segment_files(odd)
    with pytest.raises(Exception, match="use 'messages' or 'segments'"):
        spark.read.format("commitlog").option("view", "rows").load(str(spark_store.root)).collect()
    with pytest.raises(Exception, match="splitsize"):
        spark.read.format("commitlog").option("splitSize", "-1").load(str(spark_store.root)).collect()
    # an empty store directory reads as no rows
    (tmp_path / "empty" / "commitlog").mkdir(parents=True)
    assert spark.read.format("commitlog").load(str(tmp_path / "empty")).count() == 0


@pytest.mark.unit
@pytest.mark.parametrize("options,error", [
    ({}, "needs a path"),
    ({"segments": "0,x"}, "expected base offsets"),
    ({"splitsize": "big"}, "splitsize='big' is not an integer"),
    ({"batchrecords": "0"}, "batchrecords='0' must be positive"),
    ({"onerror": "skip"}, "use 'fail' or 'stop'"),
])  # fmt: skip
def test_the_sources_option_errors_are_mqlake_errors(tmp_path, options, error):
    (tmp_path / "commitlog").mkdir()
    if options:
        options = {"path": str(tmp_path), **options}
    with pytest.raises(segment_reader.CommitLogSourceError, match=error) as e:
        seg.CommitLogReader(options, "messages")
    assert isinstance(e.value, MQLakeError) and isinstance(e.value, ValueError)  # callers catching ValueError
    with pytest.raises(segment_reader.CommitLogSourceError, match="onError"):
        next(segment_reader.read_segment(tmp_path / "commitlog" / ("0" * 20), on_error="skip"))
    with pytest.raises(segment_reader.CommitLogNotFoundError) as e:
        segment_reader.segment_files(tmp_path / "nope")
    assert isinstance(e.value, MQLakeError) and isinstance(e.value, FileNotFoundError)


@pytest.mark.spark
def test_reading_while_the_store_appends(spark, tmp_path):
    from store.message_store import MessageStore
    from tests.helpers import make_config, make_message

    with MessageStore(make_config(tmp_path)) as store:
        for i in range(150):
            assert store.put_message(make_message("Live", i % 2, f"live {i}")).ok
        seen = spark.read.format("commitlog").load(str(tmp_path / "store")).count()
        for i in range(150, 200):
            assert store.put_message(make_message("Live", i % 2, f"live {i}")).ok
        again = spark.read.format("commitlog").load(str(tmp_path / "store"))
        assert seen == 150 and again.count() == 200
        assert again.filter("crc_ok").count() == 200


@pytest.mark.unit
def test_columnar_decode_matches_the_record_decoder_for_ipv6_and_odd_properties(tmp_path):
    """Records the store never writes in the fixture: IPv6 hosts, odd property strings, empty body."""
    raw_props = [
        b"", b"A\x01b\x02", b"A\x01b\x02C\x01\x02\x01x\x02noeq\x02D\x01e\x01f", b"\x02\x02K\x01v",
        "TAGS\x01ü\x02KEYS\x01a b\x02".encode(), b"TAGS\x01x\x02TAGS\x01y", b"bad\xff\x01v\x02",
        b"0123456789abcdef\x01a value longer than twelve",
    ]  # fmt: skip
    data = bytearray()
    for i, props in enumerate(raw_props):
        rec = records.MessageRecord(
            topic="V6" if i % 2 else "T" * 200, queue_id=i, body=b"" if i == 3 else bytes([i]) * (i * 5),
            properties=props, born_host=("::1", 4000 + i) if i % 3 else ("10.1.2.3", 9),
            store_host=("fe80::1", 10911) if i % 2 else ("127.0.0.1", 10911), physical_offset=len(data),
            store_timestamp=1_000 + i,
        )  # fmt: skip
        data += records.encode_record(rec)
    path = tmp_path / units.offset_to_file_name(0)
    path.write_bytes(bytes(data) + bytes(64))
    rows = [r for b in segment_reader.read_segment(path, batch_records=3) for r in b.to_pylist()]
    assert len(rows) == len(raw_props)
    for row in rows:
        rec = records.decode_record(data, row["position"], check_crc=True)
        assert row["topic"] == rec.topic and row["body"] == rec.body and row["queue_id"] == rec.queue_id
        assert dict(row["properties"]) == rec.property_map
        assert (row["tags"], row["keys"], row["uniq_key"]) == (rec.tags, rec.keys, rec.uniq_key)
        assert row["born_host"] == msgid.host_string(rec.born_host)
        assert row["store_host"] == msgid.host_string(rec.store_host)
        assert row["msg_id"] == rec.offset_msg_id and row["crc_ok"]
        assert row["store_timestamp"] == rec.store_timestamp and row["msg_size"] == rec.total_size
    facts = segment_reader.scan_segment(path)
    assert (facts.record_count, facts.valid_bytes, facts.error, facts.torn_tail) == (len(raw_props), len(data),
                                                                                   None, False)  # fmt: skip


@pytest.mark.spark
def test_get_spark_settings_and_env(spark, monkeypatch):
    import sys

    from pipelines.spark import get_spark, parse_conf

    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.parquet.outputTimestampType") == "TIMESTAMP_MICROS"
    assert spark.sparkContext.getConf().get("spark.pyspark.python") == sys.executable
    assert parse_conf("a=1, b = x=y") == {"a": "1", "b": "x=y"}
    with pytest.raises(ValueError, match="not k=v") as e:
        parse_conf(["novalue"])
    assert isinstance(e.value, MQLakeError)
    # $MQLAKE_SPARK_CONF applies, explicit conf wins over it; the same (session-scoped) session comes back
    monkeypatch.setenv("MQLAKE_SPARK_CONF", "spark.sql.shuffle.partitions=3,spark.sql.ansi.enabled=false")
    try:
        again = get_spark(conf={"spark.sql.ansi.enabled": "true"})
        assert again is spark
        assert spark.conf.get("spark.sql.shuffle.partitions") == "3"
        assert spark.conf.get("spark.sql.ansi.enabled") == "true"
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", "2")


@pytest.mark.spark
def test_get_spark_keeps_the_master_spark_submit_was_given(tmp_path):
    """Under spark-submit (the Airflow DAGs' spark_submit runner) the submitted --master stands, even over
    $MQLAKE_SPARK_MASTER; elsewhere get_spark picks the master itself.  The Delta jars go on the command line, as
    the DAGs pass them: the driver's JVM starts before get_spark runs."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from pipelines.spark import classpath_conf

    script = tmp_path / "which_master.py"
    script.write_text("from pipelines.spark import get_spark\nprint('MASTER', get_spark().sparkContext.master)\n")
    bin_dir = Path(sys.executable).parent
    env = os.environ | {
        "MQLAKE_SPARK_MASTER": "local[2]", "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
        "JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1",
    }  # fmt: skip
    jars = [arg for key, value in classpath_conf().items() for arg in ("--conf", f"{key}={value}")]
    res = subprocess.run([str(bin_dir / "spark-submit"), "--master", "local[1]", *jars, str(script)], env=env,
                         capture_output=True, text=True, timeout=180, cwd=Path(__file__).parent.parent)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert "MASTER local[1]" in res.stdout

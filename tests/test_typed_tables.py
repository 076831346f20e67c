"""Typed per-topic tables: declared body schemas (JSON Schema, Avro, Protobuf) decoded by the tier into a Delta table
per topic, undecodable bodies kept in ``decode_errors``, schema evolution, rebuild from ``messages``, Spark SQL.

The expected values come from each kind's own library reading the bodies one by one (json, fastavro, protobuf),
not from the decoder under test."""

from __future__ import annotations

import io
import json
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from lake import delta as lk
from lake import tables, typed
from lake.schema import DECODE_ERRORS_SCHEMA, TYPED_FIXED_SCHEMA

ORDERS_V1 = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "item": {"type": "string"},
        "amount": {"type": "number"},
        "lines": {"type": "array", "items": {"type": "object", "properties": {"sku": {"type": "string"},
                                                                              "qty": {"type": "integer"}}}},
        "paid": {"type": ["boolean", "null"]},
    },
    "required": ["id", "item"],
}  # fmt: skip
PAYMENT = {
    "type": "record", "name": "Payment", "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "currency", "type": {"type": "enum", "name": "Currency", "symbols": ["EUR", "USD"]}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "extra", "type": {"type": "map", "values": "int"}},
    ],
}  # fmt: skip


def _rows(bodies: list[bytes], topic: str = "T") -> pa.Table:
    n = len(bodies)
    return pa.table(
        {
            "topic": [topic] * n, "queue_id": pa.array([i % 2 for i in range(n)], pa.int32()),
            "queue_offset": pa.array(range(n), pa.int64()), "keys": [f"k{i}" for i in range(n)],
            "tags": [None] * n, "store_timestamp": pa.array([1_795_000_000_000 + i for i in range(n)], pa.int64()),
            "msg_id": [f"ID{i}" for i in range(n)], tables.BROKER_NAME: ["broker-a"] * n,
            "body": pa.array(bodies, pa.binary()),
        }
    )  # fmt: skip


def _avro(record: dict) -> bytes:
    import fastavro

    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(PAYMENT), record)
    return buf.getvalue()


def _descriptor_set() -> bytes:
    """A FileDescriptorSet as ``protoc --include_imports --descriptor_set_out`` writes it, for ``audit.Event``."""
    from google.protobuf import descriptor_pb2 as d

    f = d.FileDescriptorProto(name="audit.proto", package="audit", syntax="proto3")
    state = f.enum_type.add(name="State")
    state.value.add(name="NEW", number=0)
    state.value.add(name="DONE", number=1)
    actor = f.message_type.add(name="Actor")
    F = d.FieldDescriptorProto
    actor.field.add(name="name", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    event = f.message_type.add(name="Event")
    event.field.add(name="id", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    event.field.add(name="actor", number=2, type=F.TYPE_MESSAGE, type_name=".audit.Actor", label=F.LABEL_OPTIONAL)
    event.field.add(name="labels", number=3, type=F.TYPE_STRING, label=F.LABEL_REPEATED)
    event.field.add(name="state", number=4, type=F.TYPE_ENUM, type_name=".audit.State", label=F.LABEL_OPTIONAL)
    event.field.add(name="big", number=5, type=F.TYPE_UINT64, label=F.LABEL_OPTIONAL)
    return d.FileDescriptorSet(file=[f]).SerializeToString()


def _event_class():
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()
    for fp in descriptor_pb2.FileDescriptorSet.FromString(_descriptor_set()).file:
        pool.Add(fp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("audit.Event"))


def _split(schema: typed.BodySchema, bodies: list[bytes]) -> tuple[list[dict], dict[int, str]]:
    good, bad = typed.decode_batch(schema, _rows(bodies))
    assert good.schema == schema.table_schema and bad.schema == DECODE_ERRORS_SCHEMA
    # every row lands once, in one of the two, its fixed columns carried along
    assert sorted(good.column("queue_offset").to_pylist() + bad.column("queue_offset").to_pylist()) == list(
        range(len(bodies))
    )
    for r in bad.to_pylist():
        assert r["body"] == bodies[r["queue_offset"]] and r["msg_id"] == f"ID{r['queue_offset']}"
    return good.to_pylist(), {r["queue_offset"]: r["reason"] for r in bad.to_pylist()}


@pytest.mark.unit
def test_json_bodies_become_columns_and_undecodable_ones_errors_with_their_reason():
    schema = typed.parse("Orders", typed.JSON, json.dumps(ORDERS_V1).encode())
    good_values = [
        {"id": 1, "item": "pen", "amount": 2.5, "lines": [{"sku": "a", "qty": 2}], "paid": True, "unknown": 1},
        {"id": 2, "item": "ink", "amount": 3},  # an integer where a number goes; the rest absent
    ]
    bodies = [json.dumps(v).encode() for v in good_values] + [
        b'{"id": 3,\n "item": "pretty\\nprinted", "paid": null}',  # a newline between tokens, one in a string
        b"not json", b'{"item": "no id"}', b'{"id": "4", "item": "x"}', b"", b"[1, 2]", b'{"id": 5, "item": "x"} {}',
        b"\xff\xfe", b'{"id": 1.5, "item": "x"}',
    ]  # fmt: skip
    good, bad = _split(schema, bodies)
    assert [(r["queue_offset"], r["id"], r["item"], r["amount"], r["lines"], r["paid"]) for r in good] == [
        (0, 1, "pen", 2.5, [{"sku": "a", "qty": 2}], True),
        (1, 2, "ink", 3.0, None, None),
        (2, 3, "pretty\nprinted", None, None, None),
    ]
    assert good[0]["keys"] == "k0" and good[0]["msg_id"] == "ID0" and good[0]["store_timestamp"] == 1_795_000_000_000
    assert sorted(bad) == list(range(3, len(bodies)))
    assert bad[4] == "required field 'id' is missing or null"
    assert "id" in bad[5] and "string" in bad[5]
    assert "empty" in bad[6]


@pytest.mark.unit
def test_avro_bodies_become_columns_and_undecodable_ones_errors():
    schema = typed.parse("Payments", typed.AVRO, json.dumps(PAYMENT).encode())
    assert schema.table_schema.field("amount").type == pa.decimal128(12, 2)
    assert schema.table_schema.field("extra").type == pa.map_(pa.string(), pa.int32())
    records = [
        {"id": 1, "amount": Decimal("12.34"), "currency": "USD", "note": "first", "extra": {"a": 1}},
        {"id": 2, "amount": Decimal("0.01"), "currency": "EUR", "note": None, "extra": {}},
    ]
    whole = _avro(records[0])
    bodies = [_avro(r) for r in records] + [whole[:3], whole + b"\x00", b""]
    good, bad = _split(schema, bodies)
    assert [(r["id"], r["amount"], r["currency"], r["note"], dict(r["extra"])) for r in good] == [
        (r["id"], r["amount"], r["currency"], r["note"], r["extra"]) for r in records
    ]
    assert sorted(bad) == [2, 3, 4]
    assert "1 byte(s) after the record" in bad[3]


@pytest.mark.unit
def test_protobuf_bodies_become_columns_and_undecodable_ones_errors():
    schema = typed.parse("Audit", typed.PROTOBUF, _descriptor_set(), "audit.Event")
    assert schema.table_schema.field("big").type == pa.decimal128(20, 0)  # no unsigned types in Delta
    Event = _event_class()
    events = [
        Event(id=7, actor={"name": "ann"}, labels=["x", "y"], state=1, big=2**64 - 1),
        Event(id=8),  # nothing else set: proto3 defaults, and no actor
    ]
    bodies = [e.SerializeToString() for e in events] + [b"\xff\xff\xff", events[0].SerializeToString()[:-3]]
    good, bad = _split(schema, bodies)
    assert [(r["id"], r["actor"], r["labels"], r["state"], r["big"]) for r in good] == [
        (7, {"name": "ann"}, ["x", "y"], "DONE", Decimal(2**64 - 1)),
        (8, None, [], "NEW", Decimal(0)),
    ]
    assert sorted(bad) == [2, 3] and all("DecodeError" in r for r in bad.values())


@pytest.mark.unit
def test_declarations_that_cannot_make_columns_are_refused_naming_why():
    bad_json = {"type": "object", "properties": {"tags": {"type": "string"}}}  # a fixed column's name
    with pytest.raises(typed.SchemaError, match="tags.*clash"):
        typed.parse("T", typed.JSON, json.dumps(bad_json).encode())
    one_of = {"type": "object", "properties": {"a": {"oneOf": [{"type": "string"}]}}}
    with pytest.raises(typed.SchemaError, match="oneOf"):
        typed.parse("T", typed.JSON, json.dumps(one_of).encode())
    two = {**PAYMENT, "fields": [{"name": "x", "type": ["null", "int", "string"]}]}
    with pytest.raises(typed.SchemaError, match="only unions of null and one type"):
        typed.parse("T", typed.AVRO, json.dumps(two).encode())
    with pytest.raises(typed.SchemaError, match="no message 'audit.Nope'"):
        typed.parse("T", typed.PROTOBUF, _descriptor_set(), "audit.Nope")
    with pytest.raises(typed.SchemaError, match="not a JSON Schema"):
        typed.parse("T", typed.JSON, b"{")
    with pytest.raises(typed.SchemaError, match=r"\.json .*\.avsc .*\.desc"):
        typed.kind_of("orders.yaml")


# =====================================================================================================
# Through the tier, mqlake sql and mqlake lake schema
# =====================================================================================================

JSON_TOPIC, AVRO_TOPIC, PROTO_TOPIC, LATE_TOPIC, PLAIN_TOPIC = "Orders", "Payments", "Audit", "Late", "Plain"


def _order(i: int) -> bytes:
    if i % 13 == 0:
        return b"not json %d" % i
    value = {"id": i, "item": f"item{i}", "amount": i / 4, "lines": [{"sku": f"s{i}", "qty": i % 3}]}
    if i % 2 == 0:
        value["coupon"] = f"C{i}"  # a field the first declaration does not know (ignored), the second adds
    return json.dumps(value).encode()


def _body(topic: str, i: int) -> bytes:
    if topic in (JSON_TOPIC, LATE_TOPIC):
        return _order(i)
    if topic == AVRO_TOPIC:
        body = _avro({"id": i, "amount": Decimal(i) / 100, "currency": "EUR", "note": None, "extra": {"n": i}})
        return body[:2] if i % 11 == 0 else body
    if topic == PROTO_TOPIC:
        return b"\xff\xff" if i % 7 == 0 else _event_class()(id=i, labels=[f"l{i}"]).SerializeToString()
    return b"plain %d" % i


def _write(store_root: Path, start: int, count: int) -> dict[tuple[str, int, int], bytes]:
    """Put ``count`` messages round the five topics; returns (topic, queue, queue offset) -> body."""
    from store.message_store import MessageStore
    from tests.helpers import make_config, make_message

    topics = [JSON_TOPIC, AVRO_TOPIC, PROTO_TOPIC, LATE_TOPIC, PLAIN_TOPIC]
    sent = {}
    with MessageStore(make_config(store_root)) as store:
        for i in range(start, start + count):
            topic = topics[i % len(topics)]
            res = store.put_message(make_message(topic, i % 2, _body(topic, i), keys=f"k{i}", tags="t"))
            assert res.ok, res
            sent[(topic, i % 2, res.append.queue_offset)] = _body(topic, i)
    return sent


def _expected(topic: str, sent: dict, tiered: set[tuple[str, int, int]]) -> tuple[dict, set]:
    """Each kind's own library over the tiered bodies of ``topic``: (key -> decoded value, keys that fail)."""
    import fastavro

    good, bad = {}, set()
    for key, body in sent.items():
        if key[0] != topic or key not in tiered:
            continue
        try:
            if topic in (JSON_TOPIC, LATE_TOPIC):
                good[key] = json.loads(body)["id"]
            elif topic == AVRO_TOPIC:
                buf = io.BytesIO(body)
                good[key] = fastavro.schemaless_reader(buf, fastavro.parse_schema(PAYMENT), None)["id"]
            else:
                msg = _event_class()()
                msg.ParseFromString(body)
                good[key] = msg.id
        except Exception:  # noqa: BLE001 - whatever the library refuses is a decode error
            bad.add(key)
    return good, bad


def _typed(lake: Path, topic: str) -> pa.Table:
    return lk.to_arrow(tables.typed_table_uri(lake, topic))


def _keys(t: pa.Table) -> list[tuple[str, int, int]]:
    return list(zip(t["topic"].to_pylist(), t["queue_id"].to_pylist(), t["queue_offset"].to_pylist(), strict=True))


def _errors(lake: Path, topic: str) -> pa.Table:
    return lk.to_arrow(tables.table_uri(lake, tables.DECODE_ERRORS), [("topic", "=", topic)])


def _cli(*args: str):
    from typer.testing import CliRunner

    from cli.main import app

    return CliRunner().invoke(app, list(args))


def _tiered_keys(lake: Path) -> set[tuple[str, int, int]]:
    return set(_keys(lk.to_arrow(tables.table_uri(lake, tables.MESSAGES))))


def _assert_typed_is(lake: Path, topic: str, sent: dict) -> None:
    """The typed table and decode_errors hold exactly the topic's tiered messages, each once, each in its place."""
    want_good, want_bad = _expected(topic, sent, _tiered_keys(lake))
    got = _typed(lake, topic)
    keys = _keys(got)
    assert len(keys) == len(set(keys)), f"{topic}: a typed row was written twice"
    assert dict(zip(keys, got["id"].to_pylist(), strict=True)) == want_good and want_good
    errors = _errors(lake, topic)
    assert sorted(_keys(errors)) == sorted(want_bad) and want_bad
    assert [bytes(b) for b in errors["body"].to_pylist()] == [sent[k] for k in _keys(errors)]


@pytest.mark.spark
@pytest.mark.timeout(900)  # three tier runs and a SQL session on a shared machine
def test_tier_types_each_declared_topic_evolves_refuses_and_rebuilds(spark, tmp_path):
    from pipelines import spark_tables
    from pipelines.compaction.job import tier

    lake, store = tmp_path / "lake", tmp_path / "s"
    sent = _write(store, 0, 900)
    files = {JSON_TOPIC: tmp_path / "orders.json", AVRO_TOPIC: tmp_path / "payment.avsc",
             PROTO_TOPIC: tmp_path / "audit.desc"}  # fmt: skip
    files[JSON_TOPIC].write_text(json.dumps(ORDERS_V1))
    files[AVRO_TOPIC].write_text(json.dumps(PAYMENT))
    files[PROTO_TOPIC].write_bytes(_descriptor_set())
    for topic, f in files.items():
        message = ["--message", "audit.Event"] if topic == PROTO_TOPIC else []
        result = _cli("lake", "schema", "set", topic, str(f), "--lake", str(lake), *message)
        assert result.exit_code == 0, result.output
    assert (lake / tables.SCHEMAS_DIR / f"{PROTO_TOPIC}.message").read_text().strip() == "audit.Event"

    report = tier(store / "store", lake, spark=spark, file_reserved_time=0)
    assert report.by_state("tiered") and not report.by_state("quarantined"), report.to_json()
    assert {t["topic"]: t["error"] for t in report.typed} == dict.fromkeys(files)
    for topic in files:
        _assert_typed_is(lake, topic, sent)
    assert not lk.is_table(tables.typed_table_uri(lake, LATE_TOPIC))  # declared nowhere: no typed table
    assert set(_typed(lake, JSON_TOPIC).schema.names) == {*TYPED_FIXED_SCHEMA.names, "id", "item", "amount",
                                                          "lines", "paid"}  # fmt: skip

    # mqlake sql registers each typed table under its topic's name, beside messages and decode_errors
    names = spark_tables.register(spark, lake)
    assert {JSON_TOPIC, AVRO_TOPIC, PROTO_TOPIC, tables.DECODE_ERRORS, tables.MESSAGES} <= set(names)
    row = spark.sql(f"SELECT count(*) AS n, sum(lines[0].qty) AS q FROM {JSON_TOPIC} WHERE amount > 10").first()
    want = [i for i in range(900) if i % 5 == 0 and i % 13 and i / 4 > 10]
    good_ids = set(_typed(lake, JSON_TOPIC)["id"].to_pylist())
    assert row["n"] == len([i for i in want if i in good_ids]) > 0
    assert row["q"] == sum(i % 3 for i in want if i in good_ids)

    # a compatible change (an added optional field) adds the column; the next tier run fills it
    v2 = {**ORDERS_V1, "properties": {**ORDERS_V1["properties"], "coupon": {"type": "string"}}}
    files[JSON_TOPIC].write_text(json.dumps(v2))
    result = _cli("lake", "schema", "set", JSON_TOPIC, str(files[JSON_TOPIC]), "--lake", str(lake))
    assert result.exit_code == 0 and "coupon" in result.output, result.output
    before = _typed(lake, JSON_TOPIC)
    assert before["coupon"].null_count == before.num_rows  # older rows: the field was not read then
    sent |= _write(store, 900, 500)
    tier(store / "store", lake, spark=spark, file_reserved_time=0)
    _assert_typed_is(lake, JSON_TOPIC, sent)
    new = _typed(lake, JSON_TOPIC).filter(pa.compute.greater_equal(pa.compute.field("id"), 900))
    coupons = {r["id"]: r["coupon"] for r in new.to_pylist()}
    assert coupons and all(c == (f"C{i}" if i % 2 == 0 else None) for i, c in coupons.items())

    # an incompatible change is refused with a clear error, and leaves table and declaration as they were
    version = lk.open_table(tables.typed_table_uri(lake, JSON_TOPIC)).version()
    v3 = {**v2, "properties": {**v2["properties"], "amount": {"type": "string"}}}
    v3["properties"].pop("paid")
    bad = tmp_path / "orders-v3.json"
    bad.write_text(json.dumps(v3))
    result = _cli("lake", "schema", "set", JSON_TOPIC, str(bad), "--lake", str(lake))
    assert result.exit_code == 1
    assert "incompatible" in result.output and "'paid' is removed" in result.output
    assert "'amount' changes type from double to string" in result.output
    assert lk.open_table(tables.typed_table_uri(lake, JSON_TOPIC)).version() == version
    assert json.loads((lake / tables.SCHEMAS_DIR / f"{JSON_TOPIC}.json").read_text()) == v2

    # declared late: rebuild types what is tiered already, and the next tier run adds only what follows
    late = tmp_path / "late.json"
    late.write_text(json.dumps(ORDERS_V1))
    assert _cli("lake", "schema", "set", LATE_TOPIC, str(late), "--lake", str(lake)).exit_code == 0
    result = _cli("lake", "schema", "rebuild", LATE_TOPIC, "--lake", str(lake))
    assert result.exit_code == 0, result.output
    _assert_typed_is(lake, LATE_TOPIC, sent)
    # a rebuild of a topic the tier typed all along gives the same rows and errors, not twice
    typed_before = sorted(_keys(_typed(lake, AVRO_TOPIC)))
    assert _cli("lake", "schema", "rebuild", AVRO_TOPIC, "--lake", str(lake)).exit_code == 0
    assert sorted(_keys(_typed(lake, AVRO_TOPIC))) == typed_before
    _assert_typed_is(lake, AVRO_TOPIC, sent)
    sent |= _write(store, 1400, 400)
    tier(store / "store", lake, spark=spark, file_reserved_time=0)
    for topic in (LATE_TOPIC, AVRO_TOPIC, JSON_TOPIC, PROTO_TOPIC):
        _assert_typed_is(lake, topic, sent)
    shown = _cli("lake", "schema", "show", PROTO_TOPIC, "--lake", str(lake))
    assert shown.exit_code == 0 and "message: audit.Event" in shown.output and "big: decimal128(20, 0)" in shown.output


@pytest.mark.spark
@pytest.mark.timeout(900)  # a tier run and a SQL session on a shared machine
def test_a_declared_topics_all_view_holds_its_tiered_and_live_rows_decoded_once(spark, tmp_path):
    """``mqlake sql --store-dir``: ``<topic>_all`` of each declared topic is its typed table's rows UNION the live
    records not yet tiered, decoded with the declaration, each once; a body that does not decode is absent from
    it and present in ``messages_all``."""
    from pipelines.compaction.job import tier
    from pipelines.sql_cli import live_stores, run_sql

    lake, store = tmp_path / "lake", tmp_path / "s"
    sent = _write(store, 0, 400)
    typed.declare(lake, JSON_TOPIC, typed.JSON, json.dumps(ORDERS_V1).encode())
    typed.declare(lake, PROTO_TOPIC, typed.PROTOBUF, _descriptor_set(), "audit.Event")
    report = tier(store / "store", lake, spark=spark, file_reserved_time=0)
    assert report.by_state("tiered"), report.to_json()
    tiered = _tiered_keys(lake)
    stores = live_stores(lake, [store / "store"])

    def rows(query: str) -> list[dict]:
        out, err = io.StringIO(), io.StringIO()
        assert run_sql(lake, query, output="json", stores=stores, out=out, err=err) == 0, err.getvalue()
        return [json.loads(line) for line in out.getvalue().splitlines()]

    def key(r: dict) -> tuple[str, int, int]:
        return r["topic"], r["queue_id"], r["queue_offset"]

    got = rows(f"SELECT * FROM {JSON_TOPIC}_all")
    assert len(got) == len({key(r) for r in got})  # each record once
    orders = {k: b for k, b in sent.items() if k[0] == JSON_TOPIC}
    good = {k: json.loads(b) for k, b in orders.items() if not b.startswith(b"not json")}
    assert {key(r): (r["id"], r["item"], r["amount"], r["lines"]) for r in got} == {
        k: (v["id"], v["item"], v["amount"], v["lines"]) for k, v in good.items()}  # fmt: skip
    assert set(good) & tiered and set(good) - tiered  # typed rows from the table and decoded live ones
    assert {r["broker_name"] for r in got} == {stores[0][0]}
    bad = set(orders) - set(good)
    assert bad and not bad & {key(r) for r in got}
    everything = rows(f"SELECT topic, queue_id, queue_offset FROM messages_all WHERE topic = '{JSON_TOPIC}'")
    assert {key(r) for r in everything} == set(orders)  # the undecodable bodies too

    # a Protobuf declaration decodes on Spark's workers as well; an undeclared topic has no view
    want_audit, _ = _expected(PROTO_TOPIC, sent, set(sent))
    audit = rows(f"SELECT topic, queue_id, queue_offset, id FROM {PROTO_TOPIC}_all")
    assert {key(r): r["id"] for r in audit} == want_audit and set(want_audit) - tiered
    out, err = io.StringIO(), io.StringIO()
    assert run_sql(lake, f"SELECT * FROM {PLAIN_TOPIC}_all", stores=stores, out=out, err=err) == 1
    assert f"{PLAIN_TOPIC}_all" in err.getvalue()


@pytest.mark.spark
@pytest.mark.timeout(900)  # two cold Spark subprocesses: minutes when the shared machine is busy
def test_sigkill_after_the_commit_and_after_verify_then_rerun_types_each_row_once(spark, tmp_path):
    from pipelines.compaction.job import tier
    from store.retention import SegmentManifest, SegmentState
    from tests.test_tier import _run_tier_process

    lake, store = tmp_path / "lake", tmp_path / "s"
    sent = _write(store, 0, 1800)
    schema = tmp_path / "orders.json"
    schema.write_text(json.dumps(ORDERS_V1))
    assert _cli("lake", "schema", "set", JSON_TOPIC, str(schema), "--lake", str(lake)).exit_code == 0
    sealed = [e.file_name for e in SegmentManifest(store / "store").entries() if e.state == SegmentState.SEALED]
    assert len(sealed) > 4

    # killed right after the messages commit: nothing typed yet; then after verify: typed, not marked tiered
    proc = _run_tier_process(store / "store", lake, "after_commit", 2)
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert not lk.is_table(tables.typed_table_uri(lake, JSON_TOPIC))
    proc = _run_tier_process(store / "store", lake, "after_verify", 4)
    assert proc.returncode == -9, proc.stderr[-3000:]
    _assert_typed_is(lake, JSON_TOPIC, sent)
    typed_version = lk.open_table(tables.typed_table_uri(lake, JSON_TOPIC)).version()

    report = tier(store / "store", lake, spark=spark, file_reserved_time=0)
    assert not report.by_state("quarantined"), report.to_json()
    _assert_typed_is(lake, JSON_TOPIC, sent)  # the rerun's segments are typed once: the killed ones not again
    assert lk.open_table(tables.typed_table_uri(lake, JSON_TOPIC)).version() == typed_version + 1

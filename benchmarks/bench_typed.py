"""Typed-table decoding: MB/s of bodies through ``lake.typed.decode_batch``, one thread, per schema kind.

Run: ``.venv/bin/python -m benchmarks bench_typed`` (a minute; BENCH_SCALE scales the body count).

Inputs: 100,000 order bodies of about 1 KiB (an id, strings, a number, a list of 8 line structs, a free-text note)
as JSON, Avro and Protobuf, built outside any timing, in rows as the tier reads them from ``messages`` (batches
of 8,192 rows).  MB/s counts body bytes (MB = 10^6 bytes); each figure is the best of 3 passes over every batch.
The decode runs on one thread (pyarrow's reader is told not to use threads), so MB/s of the process's CPU time is
MB/s per core, whatever else the machine runs; MB/s of wall time is given beside it.  The target for JSON is
100 MB/s per core.
"""

from __future__ import annotations

import io
import json
import os
import time
from typing import Any

import pyarrow as pa

from benchmarks.report import emit, machine
from lake import tables, typed

SCALE = float(os.environ.get("BENCH_SCALE", "1") or 1)
COUNT = max(1_000, int(100_000 * SCALE))
BATCH = 8_192
REPEATS = 3
TARGET_JSON_MB_S = 100.0

ORDER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"}, "customer": {"type": "string"}, "amount": {"type": "number"},
        "paid": {"type": "boolean"}, "note": {"type": "string"},
        "lines": {"type": "array", "items": {"type": "object", "properties": {
            "sku": {"type": "string"}, "qty": {"type": "integer"}, "price": {"type": "number"}}}},
    },
    "required": ["id", "customer"],
}  # fmt: skip
ORDER_AVRO: dict[str, Any] = {
    "type": "record", "name": "Order", "fields": [
        {"name": "id", "type": "long"}, {"name": "customer", "type": "string"}, {"name": "amount", "type": "double"},
        {"name": "paid", "type": "boolean"}, {"name": "note", "type": "string"},
        {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line", "fields": [
            {"name": "sku", "type": "string"}, {"name": "qty", "type": "long"}, {"name": "price", "type": "double"}]}}},
    ],
}  # fmt: skip


def order(i: int) -> dict[str, Any]:
    """An order whose JSON text is about 1 KiB."""
    lines = [{"sku": f"SKU-{(i * 7 + k) % 10_000:05d}", "qty": 1 + (i + k) % 5, "price": round(1.5 + k * 0.25, 2)}
             for k in range(8)]  # fmt: skip
    return {"id": i, "customer": f"customer-{i % 50_000:06d}", "amount": round(i * 0.37 % 1000, 2),
            "paid": i % 3 != 0, "note": ("delivery window morning; leave at the door " * 10)[: 300 + i % 64],
            "lines": lines}  # fmt: skip


def order_json_schema() -> bytes:
    return json.dumps(ORDER_SCHEMA).encode()


def _proto_descriptor() -> bytes:
    from google.protobuf import descriptor_pb2 as d

    F = d.FieldDescriptorProto
    f = d.FileDescriptorProto(name="order.proto", package="bench", syntax="proto3")
    line = f.message_type.add(name="Line")
    for n, (name, t) in enumerate([("sku", F.TYPE_STRING), ("qty", F.TYPE_INT64), ("price", F.TYPE_DOUBLE)], 1):
        line.field.add(name=name, number=n, type=t, label=F.LABEL_OPTIONAL)
    o = f.message_type.add(name="Order")
    for n, (name, t) in enumerate([("id", F.TYPE_INT64), ("customer", F.TYPE_STRING), ("amount", F.TYPE_DOUBLE),
                                   ("paid", F.TYPE_BOOL), ("note", F.TYPE_STRING)], 1):  # fmt: skip
        o.field.add(name=name, number=n, type=t, label=F.LABEL_OPTIONAL)
    o.field.add(name="lines", number=6, type=F.TYPE_MESSAGE, type_name=".bench.Line", label=F.LABEL_REPEATED)
    return d.FileDescriptorSet(file=[f]).SerializeToString()


def _bodies(kind: str, n: int) -> list[bytes]:
    orders = [order(i) for i in range(n)]
    if kind == typed.JSON:
        return [json.dumps(o).encode() for o in orders]
    if kind == typed.AVRO:
        import fastavro

        parsed = fastavro.parse_schema(ORDER_AVRO)
        out = []
        for o in orders:
            buf = io.BytesIO()
            fastavro.schemaless_writer(buf, parsed, o)
            out.append(buf.getvalue())
        return out
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()
    pool.Add(descriptor_pb2.FileDescriptorSet.FromString(_proto_descriptor()).file[0])
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("bench.Order"))
    return [cls(**o).SerializeToString() for o in orders]


def _batches(bodies: list[bytes]) -> list[pa.Table]:
    out = []
    for s in range(0, len(bodies), BATCH):
        chunk = bodies[s : s + BATCH]
        n = len(chunk)
        out.append(pa.table({
            "topic": ["Orders"] * n, "queue_id": pa.array([i % 4 for i in range(n)], pa.int32()),
            "queue_offset": pa.array(range(s, s + n), pa.int64()), "keys": [f"k{i}" for i in range(n)],
            "tags": ["TagA"] * n, "store_timestamp": pa.array([1_795_000_000_000] * n, pa.int64()),
            "msg_id": ["0A00000100002A9F0000000000000000"] * n, tables.BROKER_NAME: ["broker-a"] * n,
            "body": pa.array(chunk, pa.binary()),
        }))  # fmt: skip
    return out


def bench_kind(kind: str, source: bytes, message: str | None = None) -> dict[str, float]:
    schema = typed.parse("Orders", kind, source, message)
    bodies = _bodies(kind, COUNT)
    batches = _batches(bodies)
    size = sum(map(len, bodies))
    best = best_cpu = float("inf")
    rows = 0
    for _ in range(REPEATS):
        t0, c0 = time.perf_counter(), time.process_time()
        rows = sum(typed.decode_batch(schema, b)[0].num_rows for b in batches)
        best, best_cpu = min(best, time.perf_counter() - t0), min(best_cpu, time.process_time() - c0)
    assert rows == COUNT, (kind, rows)
    return {"bodies": COUNT, "mean_body_bytes": size / COUNT, "seconds": best, "mb_per_s": size / best / 1e6,
            "cpu_seconds": best_cpu, "mb_per_cpu_s": size / best_cpu / 1e6}  # fmt: skip


def main() -> dict:
    t0 = time.perf_counter()
    results: dict[str, Any] = {"machine": machine(), "loadavg_before": os.getloadavg()[0]}
    results["json"] = bench_kind(typed.JSON, order_json_schema())
    results["avro"] = bench_kind(typed.AVRO, json.dumps(ORDER_AVRO).encode())
    results["protobuf"] = bench_kind(typed.PROTOBUF, _proto_descriptor(), "bench.Order")
    results["target_json_mb_per_s"] = TARGET_JSON_MB_S
    results["loadavg_after"] = os.getloadavg()[0]
    results["wall_seconds"] = time.perf_counter() - t0
    return emit("bench_typed", results, print_report)


def print_report(r: dict) -> None:
    for kind in ("json", "avro", "protobuf"):
        k = r[kind]
        print(f"{kind:9} {k['bodies']:,} bodies of {k['mean_body_bytes']:.0f} B: {k['mb_per_cpu_s']:7.1f} MB/s per "
              f"core (CPU time {k['cpu_seconds']:.2f} s), {k['mb_per_s']:7.1f} MB/s of wall time")  # fmt: skip
    print(f"JSON target: >= {r['target_json_mb_per_s']:.0f} MB/s per core")
    print(f"load average before/after: {r['loadavg_before']:.2f} / {r['loadavg_after']:.2f}")


if __name__ == "__main__":
    main()

"""Typed per-topic tables: a topic's declared body schema, the decoding of bodies into columns, and the evolution
of the typed table when the declaration changes (docs/lake.md, "Typed tables").

A declaration is one file under ``<lake>/_schemas/``: ``<topic>.json`` (JSON Schema), ``<topic>.avsc`` (Avro) or
``<topic>.desc`` (a Protobuf ``FileDescriptorSet``, ``protoc --include_imports --descriptor_set_out``) with
``<topic>.message`` holding the message's full name.  :class:`BodySchema` turns it into Arrow fields (one mapping
per kind, below) and decodes bodies with the kind's own library: pyarrow's JSON reader (vectorised, a whole batch
per call), fastavro and protobuf (a body at a time; neither decodes a column at once).

:func:`decode_batch` is the one entry point from records to rows: Arrow in (the ``messages`` columns), Arrow out
(the typed rows, and the ``decode_errors`` rows of the bodies that did not decode, with the reason).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lake import objectstore, tables
from lake.schema import DECODE_ERRORS_SCHEMA, TYPED_FIXED_FIELDS, TYPED_FIXED_SCHEMA
from store.errors import MQLakeError

JSON, AVRO, PROTOBUF = "json", "avro", "protobuf"
SUFFIXES = {JSON: ".json", AVRO: ".avsc", PROTOBUF: ".desc"}
MESSAGE_SUFFIX = ".message"  # beside a .desc: the full name of the topic's message type
FIXED_NAMES = frozenset(TYPED_FIXED_SCHEMA.names)


# bodies -> (indices of those that decoded, their values in that order, reason by index of those that did not)
Decoder = Callable[[pa.Array], tuple[np.ndarray, pa.Table, dict[int, str]]]


class SchemaError(MQLakeError, ValueError):
    """A declaration that cannot be used (unreadable, unsupported type, a change the typed table cannot take)."""


def _all_nullable(t: pa.DataType) -> pa.DataType:
    """``t`` with every nested field nullable: a typed table's columns may be absent from older rows."""
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _all_nullable(f.type)) for f in t])
    if pa.types.is_list(t):
        return pa.list_(_all_nullable(t.value_type))
    if pa.types.is_map(t):
        return pa.map_(t.key_type, _all_nullable(t.item_type))
    return t


# =====================================================================================================
# Kinds: declaration -> Arrow fields, and the body decoder
# =====================================================================================================

_JSON_TYPES = {"string": pa.string(), "integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_()}


def _json_type(where: str, spec: Any) -> tuple[pa.DataType, bool]:
    """(Arrow type, may be null) of a JSON Schema subschema."""
    if not isinstance(spec, dict):
        raise SchemaError(f"{where}: not a JSON Schema object")
    if "$ref" in spec or any(k in spec for k in ("oneOf", "anyOf", "allOf")):
        raise SchemaError(f"{where}: $ref/oneOf/anyOf/allOf are not supported (give the field one 'type')")
    kind = spec.get("type")
    types = kind if isinstance(kind, list) else [kind]
    null = "null" in types
    types = [t for t in types if t != "null"]
    if len(types) != 1:
        raise SchemaError(f"{where}: needs exactly one 'type' besides null, has {kind!r}")
    t = types[0]
    if t in _JSON_TYPES:
        return _JSON_TYPES[t], null
    if t == "array":
        item, _ = _json_type(f"{where}[]", spec.get("items"))
        return pa.list_(item), null
    if t == "object":
        props = spec.get("properties")
        if not props:
            raise SchemaError(f"{where}: an object needs 'properties' (free-form objects have no columns)")
        return pa.struct(_json_fields(where, spec)), null
    raise SchemaError(f"{where}: type {t!r} is not supported")


def _json_fields(where: str, spec: dict) -> list[pa.Field]:
    required = set(spec.get("required", []))
    out = []
    for name, sub in spec.get("properties", {}).items():
        t, null = _json_type(f"{where}.{name}", sub)
        out.append(pa.field(name, t, nullable=null or name not in required))
    return out


_AVRO_PRIMITIVES = {
    "boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(), "double": pa.float64(),
    "bytes": pa.binary(), "string": pa.string(),
}  # fmt: skip
_AVRO_LOGICAL = {
    "date": pa.date32(), "timestamp-millis": pa.timestamp("ms", tz="UTC"),
    "timestamp-micros": pa.timestamp("us", tz="UTC"), "time-millis": pa.time32("ms"), "time-micros": pa.time64("us"),
    "uuid": pa.string(),
}  # fmt: skip


def _avro_type(where: str, spec: Any) -> tuple[pa.DataType, bool]:
    """(Arrow type, may be null) of a parsed (fastavro.parse_schema) Avro type."""
    if isinstance(spec, list):  # a union: only [null, T] has a column type
        rest = [s for s in spec if s != "null"]
        if len(rest) != 1:
            raise SchemaError(f"{where}: only unions of null and one type are supported, not {spec!r}")
        t, _ = _avro_type(where, rest[0])
        return t, len(rest) < len(spec)
    if isinstance(spec, str):
        if spec in _AVRO_PRIMITIVES:
            return _AVRO_PRIMITIVES[spec], False
        raise SchemaError(f"{where}: type {spec!r} is not supported")
    logical = spec.get("logicalType")
    if logical == "decimal":
        return pa.decimal128(spec["precision"], spec.get("scale", 0)), False
    if logical in _AVRO_LOGICAL:
        return _AVRO_LOGICAL[logical], False
    t = spec["type"]
    if t == "record":
        return pa.struct(_avro_fields(spec)), False
    if t == "enum":
        return pa.string(), False
    if t == "fixed":
        return pa.binary(), False
    if t == "array":
        return pa.list_(_avro_type(f"{where}[]", spec["items"])[0]), False
    if t == "map":
        return pa.map_(pa.string(), _avro_type(f"{where}{{}}", spec["values"])[0]), False
    return _avro_type(where, t)


def _avro_fields(record: dict) -> list[pa.Field]:
    out = []
    for f in record["fields"]:
        t, null = _avro_type(f"{record['name']}.{f['name']}", f["type"])
        # a field with a default is optional: Avro's reader fills it in for data written without it
        out.append(pa.field(f["name"], t, nullable=null or "default" in f))
    return out


def _proto_type(fd: Any) -> pa.DataType:
    from google.protobuf.descriptor import FieldDescriptor as F

    scalar = {
        F.TYPE_INT32: pa.int32(), F.TYPE_SINT32: pa.int32(), F.TYPE_SFIXED32: pa.int32(),
        F.TYPE_INT64: pa.int64(), F.TYPE_SINT64: pa.int64(), F.TYPE_SFIXED64: pa.int64(),
        F.TYPE_UINT32: pa.int64(), F.TYPE_FIXED32: pa.int64(),  # no unsigned types in Delta
        F.TYPE_UINT64: pa.decimal128(20, 0), F.TYPE_FIXED64: pa.decimal128(20, 0),
        F.TYPE_FLOAT: pa.float32(), F.TYPE_DOUBLE: pa.float64(), F.TYPE_BOOL: pa.bool_(),
        F.TYPE_STRING: pa.string(), F.TYPE_BYTES: pa.binary(), F.TYPE_ENUM: pa.string(),
    }  # fmt: skip
    if fd.type == F.TYPE_MESSAGE:
        m = fd.message_type
        if m.GetOptions().map_entry:
            return pa.map_(_proto_type(m.fields_by_name["key"]), _proto_type(m.fields_by_name["value"]))
        return pa.struct([pa.field(f.name, _proto_field_type(f)) for f in m.fields])
    if fd.type == F.TYPE_GROUP:
        raise SchemaError(f"{fd.full_name}: proto2 groups are not supported")
    return scalar[fd.type]


def _proto_field_type(fd: Any) -> pa.DataType:
    t = _proto_type(fd)
    is_map = fd.type == fd.TYPE_MESSAGE and fd.message_type.GetOptions().map_entry
    return pa.list_(t) if _repeated(fd) and not is_map else t


def _repeated(fd: Any) -> bool:
    return bool(fd.is_repeated) if hasattr(fd, "is_repeated") else fd.label == fd.LABEL_REPEATED


def _proto_value(fd: Any, value: Any) -> Any:
    """A parsed field's value as its Arrow column takes it (enums by name, uint64 as decimal, messages as dicts)."""
    from google.protobuf.descriptor import FieldDescriptor as F

    if fd.type == F.TYPE_MESSAGE:
        if fd.message_type.GetOptions().map_entry:
            vfd = fd.message_type.fields_by_name["value"]
            return [(k, _proto_value(vfd, v)) for k, v in value.items()]
        if _repeated(fd):
            return [_proto_dict(v) for v in value]
        return _proto_dict(value)
    if _repeated(fd):
        return [_proto_scalar(fd, v) for v in value]
    return _proto_scalar(fd, value)


def _proto_scalar(fd: Any, value: Any) -> Any:
    from google.protobuf.descriptor import FieldDescriptor as F

    if fd.type == F.TYPE_ENUM:
        ev = fd.enum_type.values_by_number.get(value)
        return ev.name if ev is not None else str(value)  # an open enum's unknown number, as its number
    if fd.type in (F.TYPE_UINT64, F.TYPE_FIXED64):
        return Decimal(value)
    return value


def _proto_dict(msg: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for fd in msg.DESCRIPTOR.fields:
        if fd.has_presence and not msg.HasField(fd.name):
            out[fd.name] = None  # set nowhere (proto3 optional, a message field, proto2): null, not a default
        else:
            out[fd.name] = _proto_value(fd, getattr(msg, fd.name))
    return out


# =====================================================================================================
# The declaration
# =====================================================================================================


@dataclass(frozen=True)
class BodySchema:
    """A topic's declared body schema: its kind, the declaration's bytes, and the Arrow fields it maps to
    (``nullable`` False only for a field every body must have)."""

    topic: str
    kind: str
    source: bytes
    message: str | None = None  # protobuf: the message type's full name
    fields: pa.Schema = field(default_factory=lambda: pa.schema([]))
    _decoder: Decoder | None = field(
        default=None, compare=False, repr=False
    )

    @property
    def table_schema(self) -> pa.Schema:
        """The typed table's columns: the fixed ones, then a nullable column per declared field."""
        return pa.schema([*TYPED_FIXED_FIELDS, *(pa.field(f.name, _all_nullable(f.type)) for f in self.fields)])

    @property
    def value_schema(self) -> pa.Schema:
        return pa.schema([pa.field(f.name, _all_nullable(f.type)) for f in self.fields])

    def decode(self, bodies: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, pa.Table, dict[int, str]]:
        """(indices of the bodies that decoded, their values in that order, reason by index of those that did
        not)."""
        arr = bodies.combine_chunks() if isinstance(bodies, pa.ChunkedArray) else bodies
        assert self._decoder is not None
        good, values, bad = self._decoder(arr)
        required = [f.name for f in self.fields if not f.nullable]
        if required and len(good):
            missing = np.zeros(len(good), bool)
            why = np.full(len(good), None, object)
            for name in required:
                nulls = values.column(name).is_null().to_numpy(zero_copy_only=False)
                why[nulls & ~missing] = f"required field {name!r} is missing or null"
                missing |= nulls
            if missing.any():
                bad.update({int(i): str(r) for i, r in zip(good[missing], why[missing], strict=True)})
                values = values.filter(pa.array(~missing))
                good = good[~missing]
        return good, values, bad


def parse(topic: str, kind: str, source: bytes, message: str | None = None) -> BodySchema:
    """The declaration ``source`` of ``kind`` for ``topic``; SchemaError naming what is wrong with it."""
    if kind == JSON:
        schema = _parse_json(topic, source)
    elif kind == AVRO:
        schema = _parse_avro(topic, source)
    elif kind == PROTOBUF:
        schema = _parse_protobuf(topic, source, message)
    else:
        raise SchemaError(f"{topic}: unknown schema kind {kind!r} (json, avro or protobuf)")
    clash = sorted(FIXED_NAMES & set(schema.fields.names))
    if clash:
        raise SchemaError(f"{topic}: field(s) {', '.join(clash)} clash with the typed table's fixed columns")
    if not schema.fields.names:
        raise SchemaError(f"{topic}: the schema declares no field")
    return schema


def kind_of(path: str | Path) -> str:
    suffix = Path(path).suffix
    for kind, s in SUFFIXES.items():
        if s == suffix:
            return kind
    raise SchemaError(f"{path}: a schema file ends in .json (JSON Schema), .avsc (Avro) or .desc (Protobuf)")


def _parse_json(topic: str, source: bytes) -> BodySchema:
    import jsonschema

    try:
        spec = json.loads(source)
        jsonschema.validators.validator_for(spec).check_schema(spec)
    except (ValueError, jsonschema.SchemaError) as e:
        raise SchemaError(f"{topic}: not a JSON Schema: {str(e).splitlines()[0]}") from None
    if spec.get("type") != "object":
        raise SchemaError(f"{topic}: the JSON Schema of a body must be of type object")
    fields = pa.schema(_json_fields(topic, spec))
    value_schema = pa.schema([pa.field(f.name, _all_nullable(f.type)) for f in fields])
    return BodySchema(topic, JSON, source, None, fields, _JsonDecoder(value_schema))


def _parse_avro(topic: str, source: bytes) -> BodySchema:
    import fastavro

    try:
        parsed = fastavro.parse_schema(json.loads(source))
    except (ValueError, fastavro.schema.SchemaParseException) as e:
        raise SchemaError(f"{topic}: not an Avro schema: {e}") from None
    if not isinstance(parsed, dict) or parsed.get("type") != "record":
        raise SchemaError(f"{topic}: the Avro schema of a body must be a record")
    fields = pa.schema(_avro_fields(parsed))
    value_schema = pa.schema([pa.field(f.name, _all_nullable(f.type)) for f in fields])

    def one(body: bytes) -> dict[str, Any]:
        buf = io.BytesIO(body)
        row = fastavro.schemaless_reader(buf, parsed, None)
        if buf.tell() != len(body):
            raise ValueError(f"{len(body) - buf.tell()} byte(s) after the record")
        assert isinstance(row, dict)
        return row

    return BodySchema(topic, AVRO, source, None, fields, _row_decoder(one, value_schema))


def _parse_protobuf(topic: str, source: bytes, message: str | None) -> BodySchema:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from google.protobuf.message import DecodeError

    try:
        fds = descriptor_pb2.FileDescriptorSet.FromString(source)
        pool = descriptor_pool.DescriptorPool()
        for fp in fds.file:
            pool.Add(fp)
    except (DecodeError, TypeError, KeyError, ValueError) as e:
        raise SchemaError(f"{topic}: not a Protobuf descriptor set (protoc --include_imports "
                          f"--descriptor_set_out): {e}") from None  # fmt: skip
    if not message:
        names = [f"{fp.package}.{m.name}".lstrip(".") for fp in fds.file for m in fp.message_type]
        if len(names) != 1:
            raise SchemaError(f"{topic}: name the message type (--message); the set has {', '.join(names) or 'none'}")
        message = names[0]
    try:
        desc = pool.FindMessageTypeByName(message)
    except KeyError:
        raise SchemaError(f"{topic}: the descriptor set has no message {message!r}") from None
    cls = message_factory.GetMessageClass(desc)
    fields = pa.schema(
        [pa.field(f.name, _proto_field_type(f), nullable=not getattr(f, "is_required", False)) for f in desc.fields]
    )
    value_schema = pa.schema([pa.field(f.name, _all_nullable(f.type)) for f in fields])

    def one(body: bytes) -> dict[str, Any]:
        msg = cls()
        msg.ParseFromString(body)
        return _proto_dict(msg)

    return BodySchema(topic, PROTOBUF, source, message, fields, _row_decoder(one, value_schema))


# =====================================================================================================
# Decoders: Arrow binary array -> (good indices, values, reasons)
# =====================================================================================================


def _row_decoder(one: Callable[[bytes], dict[str, Any]], value_schema: pa.Schema) -> Decoder:
    """A decoder calling ``one`` per body (libraries that parse one datum at a time)."""

    def decode(bodies: pa.Array) -> tuple[np.ndarray, pa.Table, dict[int, str]]:
        good: list[int] = []
        rows: list[dict[str, Any]] = []
        bad: dict[int, str] = {}
        for i, body in enumerate(bodies.to_pylist()):
            try:
                rows.append(one(body))
                good.append(i)
            except Exception as e:  # noqa: BLE001 - any failure of the library on a body is that body's reason
                bad[i] = f"{type(e).__name__}: {e}" if str(e) else f"{type(e).__name__} ({len(body)}-byte body)"
        try:
            values = pa.Table.from_pylist(rows, schema=value_schema)
        except (pa.ArrowException, TypeError, ValueError):  # a value Arrow refuses: find its row
            values, keep = _rows_one_by_one(rows, value_schema, good, bad)
            good = keep
        return np.asarray(good, np.int64), values, bad

    return decode


def _rows_one_by_one(
    rows: list[dict[str, Any]], value_schema: pa.Schema, good: list[int], bad: dict[int, str]
) -> tuple[pa.Table, list[int]]:
    pieces, keep = [], []
    for i, row in zip(good, rows, strict=True):
        try:
            pieces.append(pa.Table.from_pylist([row], schema=value_schema))
            keep.append(i)
        except (pa.ArrowException, TypeError, ValueError) as e:
            bad[i] = f"{type(e).__name__}: {e}"
    return (pa.concat_tables(pieces) if pieces else value_schema.empty_table()), keep


_NEWLINE = pa.scalar(b"\n", pa.binary())
_NOTHING = pa.scalar(b"", pa.binary())
_MAX_BLOCK = 1 << 30  # pyarrow's JSON block size is an int32


class _JsonDecoder:
    """Bodies as newline-delimited JSON through pyarrow's reader, a batch per call.

    A body read on a line of its own must be exactly one object: it starts with ``{``, ends with ``}`` and holds
    no line break, so a string (no raw line break in JSON) or an object (``}`` then ``{`` is no JSON) cannot run
    from one body into the next, and the reader's row count then says each line gave one row.  Other bodies are
    read one at a time.  A batch that fails is halved until the failing bodies stand alone, so one bad body costs
    a few re-reads, not the batch."""

    def __init__(self, value_schema: pa.Schema) -> None:
        import pyarrow.json as pj

        self.value_schema = value_schema
        self.options = pj.ParseOptions(explicit_schema=value_schema, unexpected_field_behavior="ignore")
        self.one_options = pj.ParseOptions(
            explicit_schema=value_schema, unexpected_field_behavior="ignore", newlines_in_values=True
        )

    def _read(self, data: pa.Buffer | bytes, rows: int, options: Any) -> pa.Table:
        import pyarrow.json as pj

        if rows == 1 and not bytes(data).strip():
            raise ValueError("empty body: no JSON value")
        block = min(_MAX_BLOCK, max(1 << 20, len(data) + 1))  # one block: the reader never splits a batch
        t = pj.read_json(
            pa.BufferReader(data), parse_options=options,
            read_options=pj.ReadOptions(use_threads=False, block_size=block),
        )  # fmt: skip
        if t.num_rows != rows:
            raise ValueError(f"{t.num_rows} JSON values where {rows} were expected")
        return t

    def __call__(self, bodies: pa.Array) -> tuple[np.ndarray, pa.Table, dict[int, str]]:
        n = len(bodies)
        if not (pa.types.is_binary(bodies.type) or pa.types.is_string(bodies.type)):
            bodies = bodies.cast(pa.binary())
        offsets, data = _offsets_and_data(bodies)
        starts, ends = offsets[:-1], offsets[1:]
        filled = ends > starts
        alone = ~filled
        alone[filled] |= data[starts[filled]] != ord("{")
        alone[filled] |= data[ends[filled] - 1] != ord("}")
        breaks = np.flatnonzero((data == 10) | (data == 13))
        if len(breaks):
            alone[np.searchsorted(ends, breaks, "right")] = True
        bad: dict[int, str] = {}
        pieces: list[tuple[np.ndarray, pa.Table]] = []
        lined = np.flatnonzero(~alone)
        self._lines(bodies if len(lined) == n else bodies.take(pa.array(lined)), lined, pieces, bad)
        for i in np.flatnonzero(alone).tolist():
            try:
                pieces.append((np.array([i]), self._read(bytes(data[starts[i] : ends[i]]), 1, self.one_options)))
            except (pa.ArrowException, ValueError) as e:
                bad[i] = _json_reason(e)
        if not pieces:
            return np.empty(0, np.int64), self.value_schema.empty_table(), bad
        idx = np.concatenate([p[0] for p in pieces])
        values = pa.concat_tables([p[1] for p in pieces])
        if alone.any():
            order = np.argsort(idx, kind="stable")
            idx, values = idx[order], values.take(pa.array(order))
        return idx, values, bad

    def _lines(
        self, bodies: pa.Array, rows: np.ndarray, pieces: list[tuple[np.ndarray, pa.Table]], bad: dict[int, str]
    ) -> None:
        """Read ``bodies`` (the bodies ``rows`` of the batch) as one line each."""
        if not len(rows):
            return
        lines = pc.binary_join_element_wise(bodies, _NEWLINE, _NOTHING)  # each body and a newline, end to end
        try:
            pieces.append((rows, self._read(_values_buffer(lines), len(rows), self.options)))
            return
        except (pa.ArrowException, ValueError) as e:
            if len(rows) == 1:
                bad[int(rows[0])] = _json_reason(e)
                return
        half = len(rows) // 2
        self._lines(bodies.slice(0, half), rows[:half], pieces, bad)
        self._lines(bodies.slice(half), rows[half:], pieces, bad)


def _json_reason(e: BaseException) -> str:
    return str(e).replace(" in row 0", "").splitlines()[0]


def _offsets_and_data(bodies: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The bodies' offsets (rebased to 0) and bytes, without copying the bytes."""
    _, off_buf, data_buf = bodies.buffers()
    offsets = np.frombuffer(off_buf, np.int32)[bodies.offset : bodies.offset + len(bodies) + 1].astype(np.int64)
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.empty(0, np.uint8)
    data = data[offsets[0] : offsets[-1]]
    return offsets - offsets[0], data


def _values_buffer(arr: pa.Array) -> pa.Buffer:
    """The bytes of a binary array's values, end to end (no copy)."""
    _, off_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(off_buf, np.int32)[arr.offset : arr.offset + len(arr) + 1]
    return data_buf.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))


# =====================================================================================================
# Batches: messages rows -> typed rows + decode_errors rows
# =====================================================================================================


def decode_batch(schema: BodySchema, rows: pa.Table | pa.RecordBatch) -> tuple[pa.Table, pa.Table]:
    """Decode the bodies of ``rows`` (any table or batch with the ``messages`` columns of TYPED_FIXED_FIELDS and
    ``body``) with ``schema``: (typed rows, ``schema.table_schema``; decode_errors rows, DECODE_ERRORS_SCHEMA),
    each in the order of ``rows``.  Every row lands in exactly one of the two."""
    table = rows if isinstance(rows, pa.Table) else pa.Table.from_batches([rows])
    fixed = table.select(TYPED_FIXED_SCHEMA.names).cast(TYPED_FIXED_SCHEMA)
    good, values, bad = schema.decode(table.column("body"))
    typed = fixed.take(pa.array(good, pa.int64()))
    for f in values.schema:
        typed = typed.append_column(f, values.column(f.name))
    typed = typed.cast(schema.table_schema)
    order = sorted(bad)
    idx = pa.array(order, pa.int64())
    errors = fixed.take(idx)
    errors = errors.append_column(DECODE_ERRORS_SCHEMA.field("schema_kind"), pa.repeat(schema.kind, len(order)))
    errors = errors.append_column(DECODE_ERRORS_SCHEMA.field("reason"), pa.array([bad[i] for i in order], pa.string()))
    errors = errors.append_column(DECODE_ERRORS_SCHEMA.field("body"), table.column("body").take(idx))
    return typed, errors.cast(DECODE_ERRORS_SCHEMA)


# =====================================================================================================
# Where declarations live, and evolution
# =====================================================================================================


def schemas_location(lake: str | Path) -> str:
    return tables.table_uri(lake, tables.SCHEMAS_DIR)


def _read_file(location: str) -> bytes | None:
    fs, path = objectstore.filesystem(location)
    with objectstore.reaching(location, "reading a schema declaration"):
        try:
            with fs.open_input_stream(path) as f:
                return bytes(f.read())
        except FileNotFoundError:
            return None


def load(lake: str | Path, topic: str) -> BodySchema | None:
    """``topic``'s declaration under ``lake`` (None: none); SchemaError for one that cannot be used, or two."""
    base = schemas_location(lake)
    found = [(k, data) for k, s in SUFFIXES.items() if (data := _read_file(f"{base}/{topic}{s}")) is not None]
    if not found:
        return None
    if len(found) > 1:
        raise SchemaError(f"{topic}: {len(found)} declarations under {base} ({', '.join(k for k, _ in found)}); "
                          "keep one")  # fmt: skip
    kind, data = found[0]
    message = None
    if kind == PROTOBUF:
        text = _read_file(f"{base}/{topic}{MESSAGE_SUFFIX}")
        message = text.decode().strip() if text else None
    return parse(topic, kind, data, message)


def declared_topics(lake: str | Path) -> list[str]:
    """The topics with a declaration file under ``lake``."""
    from pyarrow import fs as pafs

    location = schemas_location(lake)
    fsys, base = objectstore.filesystem(location)
    with objectstore.reaching(location, "listing the schema declarations"):
        infos = fsys.get_file_info(pafs.FileSelector(base, allow_not_found=True))
    suffixes = set(SUFFIXES.values())
    return sorted({Path(i.base_name).stem for i in infos if Path(i.base_name).suffix in suffixes})


def incompatibilities(old: BodySchema | None, new: BodySchema, table: pa.Schema | None) -> list[str]:
    """Why the typed table cannot take ``new`` (empty: it can), given the declaration it had (``old``) and its
    columns (``table``).  A compatible change adds optional fields, or makes a required one optional; anything
    else would leave rows already written unreadable by the new declaration, or a column with two types."""
    problems = []
    if old is not None and old.kind != new.kind:
        problems.append(f"the kind changes from {old.kind} to {new.kind}: bodies already tiered are {old.kind}")
    before = old.fields if old is not None else None
    if before is not None:
        for f in before:
            if f.name not in new.fields.names:
                problems.append(f"field {f.name!r} is removed")
            elif f.nullable and not new.fields.field(f.name).nullable:
                problems.append(f"field {f.name!r} becomes required")
        for f in new.fields:
            if f.name not in before.names and not f.nullable:
                problems.append(f"field {f.name!r} is added as required (older bodies lack it)")
    if table is not None:
        want = new.table_schema
        for f in table:
            if f.name not in want.names:
                if f"field {f.name!r} is removed" not in problems:
                    problems.append(f"field {f.name!r} is removed")
            elif _all_nullable(f.type) != want.field(f.name).type:
                problems.append(f"field {f.name!r} changes type from {f.type} to {want.field(f.name).type}")
    return problems


def evolve_table(table_uri: str, schema: BodySchema) -> list[str]:
    """Add ``schema``'s new columns to the typed table at ``table_uri`` (none there: nothing to do); returns the
    columns added.  SchemaError, changing nothing, when the table cannot take the declaration."""
    from deltalake import Field

    from lake import delta as lk

    if not lk.is_table(table_uri):
        return []
    have = lk.table_schema(table_uri)
    problems = incompatibilities(None, schema, have)
    if problems:
        raise SchemaError(f"{schema.topic}: the typed table {table_uri} cannot take this schema: {'; '.join(problems)}")
    new = [f for f in schema.table_schema if f.name not in have.names]
    if new:
        with objectstore.reaching(table_uri, "adding columns to the typed table"):
            lk.open_table(table_uri).alter.add_columns([Field.from_arrow(f) for f in new])
    return [f.name for f in new]


def declare(lake: str | Path, topic: str, kind: str, source: bytes, message: str | None = None) -> list[str]:
    """Declare (or change) ``topic``'s body schema under ``lake``: checked against the declaration it replaces
    and the typed table, the table's new columns added, then the file written.  Returns the columns added.
    SchemaError, changing nothing, when it is unusable or incompatible."""
    new = parse(topic, kind, source, message)
    old = load(lake, topic)
    uri = tables.typed_table_uri(lake, topic)
    from lake import delta as lk

    table = lk.table_schema(uri) if lk.is_table(uri) else None
    problems = incompatibilities(old, new, table)
    if problems:
        raise SchemaError(f"{topic}: incompatible schema change, refused (the table and declaration are left as "
                          f"they were): {'; '.join(problems)}")  # fmt: skip
    added = evolve_table(uri, new)
    base = schemas_location(lake)
    fs, path = objectstore.filesystem(base)
    with objectstore.reaching(base, "writing the schema declaration"):
        fs.create_dir(path, recursive=True)
        _write(fs, f"{path}/{topic}{SUFFIXES[kind]}", source)
        if kind == PROTOBUF:
            _write(fs, f"{path}/{topic}{MESSAGE_SUFFIX}", (new.message or "").encode() + b"\n")
    return added


def _write(fs: Any, path: str, data: bytes) -> None:
    """Write through a temporary name and move it in place: a reader never sees half a declaration."""
    tmp = f"{path}.tmp"
    with fs.open_output_stream(tmp) as f:
        f.write(data)
    fs.move(tmp, path)


__all__ = [
    "AVRO",
    "JSON",
    "PROTOBUF",
    "BodySchema",
    "SchemaError",
    "declare",
    "declared_topics",
    "decode_batch",
    "evolve_table",
    "incompatibilities",
    "kind_of",
    "load",
    "parse",
]

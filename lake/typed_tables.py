"""The typed tables on disk: what a tier run adds to a topic's typed table and to ``decode_errors``, and the
rebuild of a typed table from ``messages`` (docs/lake.md, "Typed tables").  delta-rs only, no Spark.

Idempotency is the tier's: the typed table takes commits under the tier's own transaction id
``mqlake-tier:<store id>`` with version = the largest base offset of the segments decoded; ``decode_errors``,
shared by every topic, under ``mqlake-tier:<store id>:<topic>``.  Segments are decoded in base-offset order, so a
segment at or below a table's recorded version is in it already, and a re-run adds nothing twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds

from lake import delta as lk
from lake import objectstore, tables
from lake.schema import DECODE_ERRORS_SCHEMA, TYPED_FIXED_SCHEMA
from lake.typed import BodySchema, SchemaError, decode_batch, evolve_table, load

log = logging.getLogger(__name__)

SOURCE_COLUMNS = [*TYPED_FIXED_SCHEMA.names, "body"]


def typed_app_id(store_id: str) -> str:
    """The typed table's transaction id for a store: the same as its ``messages`` commits'."""
    return f"mqlake-tier:{store_id}"


def errors_app_id(store_id: str, topic: str) -> str:
    return f"mqlake-tier:{store_id}:{topic}"


@dataclass
class TypedOutcome:
    topic: str
    rows: int = 0  # typed rows committed
    errors: int = 0  # decode_errors rows committed
    added_columns: list[str] = field(default_factory=list)
    error: str | None = None  # why the topic's typed rows were not written (the tier went on)


def _decode(
    schema: BodySchema, messages_uri: str, where: ds.Expression, version: int | None = None
) -> tuple[pa.Table, pa.Table]:
    typed, errors = [], []
    for batch in lk.scan_batches(messages_uri, SOURCE_COLUMNS, where, version):
        if batch.num_rows:
            t, e = decode_batch(schema, batch)
            typed.append(t)
            errors.append(e)
    return (
        pa.concat_tables(typed) if typed else schema.table_schema.empty_table(),
        pa.concat_tables(errors) if errors else DECODE_ERRORS_SCHEMA.empty_table(),
    )


def _as_table_orders(rows: pa.Table, table_uri: str) -> pa.Table:
    """``rows`` in the column order of the table at ``table_uri`` (columns added later come last there)."""
    if not lk.is_table(table_uri):
        return rows
    return rows.select(lk.table_schema(table_uri).names)


def add_tiered(
    lake: str | Path, topic: str, *, store_id: str, broker_name: str, segments: dict[str, int]
) -> TypedOutcome | None:
    """Decode ``topic``'s committed ``messages`` rows of ``broker_name``'s ``segments`` (name -> base offset) and
    commit them to its typed table and ``decode_errors`` (None: the topic has no declared schema)."""
    schema = load(lake, topic)
    if schema is None:
        return None
    out = TypedOutcome(topic)
    messages_uri = tables.table_uri(lake, tables.MESSAGES)
    typed_uri, errors_uri = tables.typed_table_uri(lake, topic), tables.table_uri(lake, tables.DECODE_ERRORS)
    t_app, e_app = typed_app_id(store_id), errors_app_id(store_id, topic)
    done_t = lk.transaction_version(typed_uri, t_app)
    done_e = lk.transaction_version(errors_uri, e_app)
    for_typed = {n: b for n, b in segments.items() if done_t is None or b > done_t}
    for_errors = {n: b for n, b in segments.items() if done_e is None or b > done_e}
    if not for_typed and not for_errors:
        return out
    out.added_columns = evolve_table(typed_uri, schema)
    owned = (ds.field(tables.BROKER_NAME) == broker_name) & (ds.field("topic") == topic)
    decoded: dict[tuple[str, ...], tuple[pa.Table, pa.Table]] = {}
    for todo, uri, app in ((for_typed, typed_uri, t_app), (for_errors, errors_uri, e_app)):
        if not todo:
            continue
        key = tuple(sorted(todo))
        if key not in decoded:
            decoded[key] = _decode(schema, messages_uri, owned & ds.field("segment").isin(list(key)))
        typed, errors = decoded[key]
        version = max(todo.values())
        if uri == typed_uri:  # committed even when empty: its transaction id then says these segments are done
            if lk.append_arrow(uri, _as_table_orders(typed, uri), app_id=app, version=version) is not None:
                out.rows = typed.num_rows
        elif errors.num_rows and lk.append_arrow(uri, errors, app_id=app, version=version) is not None:
            out.errors = errors.num_rows
    return out


def _store_versions(lake: str | Path, messages_version: int) -> dict[str, int]:
    """The recorded transaction version of each store in the ``messages`` snapshot ``messages_version``."""
    segments_uri = tables.table_uri(lake, tables.SEGMENTS)
    if not lk.is_table(segments_uri):
        return {}
    stores = set(lk.to_arrow(segments_uri).column("store_id").to_pylist())
    dt = lk.open_table(tables.table_uri(lake, tables.MESSAGES), version=messages_version)
    out = {}
    for s in sorted(stores):
        v = dt.transaction_version(typed_app_id(s))
        if v is not None:
            out[s] = v
    return out


def rebuild(lake: str | Path, topic: str) -> TypedOutcome:
    """Rewrite ``topic``'s typed table, and its ``decode_errors`` rows, from every row ``messages`` holds for it,
    with its declared schema.  Each store's tier transaction id is recorded at the version the ``messages``
    snapshot read had, so later tier runs add only what came after it."""
    from deltalake import write_deltalake
    from deltalake.transaction import CommitProperties, Transaction

    schema = load(lake, topic)
    if schema is None:
        raise SchemaError(f"{topic}: no schema declared (mqlake lake schema set {topic} FILE)")
    messages_uri = tables.table_uri(lake, tables.MESSAGES)
    if not lk.is_table(messages_uri):
        raise lk.LakeError(f"{messages_uri} is not a Delta table: nothing tiered yet")
    version = lk.open_table(messages_uri).version()
    stores = _store_versions(lake, version)
    typed, errors = _decode(schema, messages_uri, ds.field("topic") == topic, version)
    typed_uri, errors_uri = tables.typed_table_uri(lake, topic), tables.table_uri(lake, tables.DECODE_ERRORS)
    meta = {"mqlake.typed.rebuild": topic, "mqlake.typed.messages_version": str(version)}
    props = CommitProperties(
        custom_metadata=meta, app_transactions=[Transaction(typed_app_id(s), v) for s, v in stores.items()]
    )
    with objectstore.reaching(typed_uri, "rewriting the typed table"):
        write_deltalake(
            typed_uri, typed, mode="overwrite", schema_mode="overwrite", commit_properties=props,
            configuration=None if lk.is_table(typed_uri) else lk.TABLE_PROPERTIES,
            storage_options=objectstore.storage_options(typed_uri),
        )  # fmt: skip
    if lk.is_table(errors_uri):
        lk.delete_rows(errors_uri, f"topic = {lk.sql_text(topic)}", metadata=meta)
    e_props = CommitProperties(
        custom_metadata=meta, app_transactions=[Transaction(errors_app_id(s, topic), v) for s, v in stores.items()]
    )
    with objectstore.reaching(errors_uri, "writing decode_errors"):
        write_deltalake(
            errors_uri, errors, mode="append", commit_properties=e_props,
            configuration=None if lk.is_table(errors_uri) else lk.TABLE_PROPERTIES,
            storage_options=objectstore.storage_options(errors_uri),
        )  # fmt: skip
    log.info("rebuilt %s from messages version %d: %d rows, %d decode errors", typed_uri, version,
             typed.num_rows, errors.num_rows)  # fmt: skip
    return TypedOutcome(topic, typed.num_rows, errors.num_rows)


def sql_names(lake: str | Path, taken: set[str]) -> list[tuple[str, str]]:
    """(SQL name, location) of each typed table under ``lake``: the topic's name, or ``<topic>_typed`` where that
    is a lake table's name already."""
    root = tables.table_uri(lake, tables.TYPED_DIR)
    if not objectstore.exists(root):
        return []
    return [(sql_name(name, taken), uri) for name, uri in lk.lake_tables(root)]


def sql_name(topic: str, taken: set[str]) -> str:
    """The SQL name of ``topic``'s typed table: the topic's (as a SQL name, ``lake.delta.table_name``), or
    ``<that>_typed`` where that is in ``taken`` (the lake tables' names)."""
    name = lk.table_name(topic)
    return f"{name}_typed" if name in taken else name

"""History in one copy: the lake's ``messages`` table UNION the live CommitLog records not yet tiered.

Two readers take it: ``mqlake replay`` (pipelines/replay/source.py) and ``mqlake sql --store-dir``'s views
``messages_all`` and each typed topic's ``<T>_all`` (:func:`register_views`).  The rules, here once:

Stores.  Each live store is one broker's, and its rows carry that broker's name: a source queue is (broker,
topic, queue id), so the same queue id of two brokers is two queues and one broker's tier boundary never hides
another's rows.  A store's broker is the ``brokerName`` its broker recorded in the store (``mqlake.json``), else
the name the lake recorded for the store, else the default (:func:`store_broker`, by lake/broker_names.py's
rules).  Each broker has one store, and no store is read twice (:func:`check_stores`).

Segments.  Live segments the store's manifest lists as ``tiered`` or ``deleted`` are not read at all
(:func:`live_segments`).  The segment being written is read up to its last whole record: the store writes a
record's TOTALSIZE and MAGICCODE last, so a concurrent append is either whole or invisible, and zeros where a
record would start end the segment (pipelines/segment_reader.py).  Nothing is written to the store: files are
mapped read-only, and the manifest is read under its shared lock.

Order.  Every store's manifest is read before the lake's snapshot is taken.  A segment the tier commits in
between is then in both (the key below drops the copy); read the other way round, it would be in neither
(skipped live as ``tiered``, absent from the older snapshot).

Key.  A record is (broker_name, topic, queue_id, queue_offset) (:data:`KEY`), and no key is read twice.  Deduping
on the offset rather than "live rows above the lake's max offset" keeps a quarantined (never tiered) segment's
rows, which sit below later tiered ones.  Replay's sender keeps the first row of each key as it walks a source
queue in offset order; the views keep the lake's row and drop the live one (an anti-join on the key against the
lake rows that can hold it: those of the live stores' brokers at or above their lowest live CommitLog offset, so
parquet statistics skip the rest of the table).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from lake.tables import BROKER_NAME
from store.errors import MQLakeError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from lake.typed import BodySchema

KEY = (BROKER_NAME, "topic", "queue_id", "queue_offset")
MESSAGES_ALL = "messages_all"  # the view of the messages table UNION the live records not yet tiered
ALL_SUFFIX = "_all"  # a typed topic's view: <its typed table's SQL name>_all

Store = tuple[str, Path]  # (brokerName, store root)
TypedDecode = Callable[["pa.RecordBatch"], "pa.RecordBatch | pa.Table"]


class LiveStoreError(MQLakeError, ValueError):
    """A live store that cannot be read, or a list of stores that would read a record twice."""


def parse_broker_stores(items: Iterable[str] | None) -> tuple[Store, ...]:
    """``--broker-store NAME=PATH`` (repeatable): each live store with the brokerName of its broker."""
    out = []
    for item in items or ():
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise LiveStoreError(f"--broker-store {item!r}: use BROKER_NAME=STORE_DIR, e.g. broker-a=/data/a/store")
        out.append((name.strip(), Path(path.strip())))
    return tuple(out)


def check_stores(stores: Sequence[Store]) -> None:
    """Raise :class:`LiveStoreError` for a store without a CommitLog, a broker given two stores (they would share
    source queues) or one store given twice (its live records would be read twice)."""
    for name, path in stores:
        if not (path / "commitlog").is_dir():
            raise LiveStoreError(f"store {path} (broker {name}) has no commitlog directory")
    names = [name for name, _ in stores]
    if len(set(names)) != len(names):
        raise LiveStoreError(f"broker {_twice(names)} is given two live stores: each broker has one store")
    paths = [path.resolve() for _, path in stores]
    if len(set(paths)) != len(paths):
        raise LiveStoreError(f"store {_twice(paths)} is given twice: its live records would be read twice")


def _twice(items: list) -> str:
    return str(next(x for x in items if items.count(x) > 1))


def store_broker(lake: Path | str, store_dir: Path, given: str | None = None) -> str:
    """The broker whose rows the store at ``store_dir`` holds (see the module docstring); ``given`` (a flag) must
    agree with what the store and the lake recorded.  Raises ``BrokerNameError`` otherwise, and for a lake that
    predates the broker column."""
    from lake import broker_names
    from store import identity

    found = identity.read(store_dir)  # never made here: the read leaves the store as it is
    if found is None:
        broker_names.check_layout(lake)
        return given or broker_names.default_broker_name()
    return broker_names.resolve(lake, store_dir, found, given)


def live_segments(store_dir: Path, from_ms: int | None = None, to_ms: int | None = None) -> list[int]:
    """Base offsets of the CommitLog segments still to read live: not tiered, and overlapping the time range
    (``from_ms`` <= store time < ``to_ms``, as the manifest recorded the segment's store times)."""
    from pipelines.segment_reader import segment_files
    from store.retention import SegmentManifest, SegmentState

    entries = {e.base_offset: e for e in SegmentManifest(store_dir).entries()}
    out = []
    for f in segment_files(store_dir):
        base = int(f.name)
        e = entries.get(base)
        if e is not None:
            if e.state in (SegmentState.TIERED, SegmentState.DELETED):
                continue
            if from_ms is not None and e.last_store_time is not None and e.last_store_time < from_ms:
                continue
            if to_ms is not None and e.first_store_time is not None and e.first_store_time >= to_ms:
                continue
        out.append(base)
    return out


def live_frame(spark: SparkSession, broker: str, store_dir: Path, bases: Sequence[int]) -> DataFrame:
    """The records of the segments ``bases`` of one store, as rows of the ``messages`` table under ``broker``."""
    from lake.schema import MESSAGES_SCHEMA, spark_schema

    # the schema given, so defining the frame asks no Python worker for it
    reader = spark.read.format("commitlog").schema(spark_schema(MESSAGES_SCHEMA)).option("brokerName", broker)
    return reader.option("segments", ",".join(map(str, bases))).load(str(Path(store_dir).absolute()))


@dataclass(frozen=True)
class TypedTopic:
    """A topic whose bodies decode into a typed table, seen live as the view ``<T>_all`` (T its typed table's SQL name).

    ``decode`` takes a batch of ``messages`` rows (``MESSAGES_SCHEMA``) of the topic and returns the typed rows
    of those that decode, with ``schema``'s columns: the typed table's, :data:`KEY` among them (a body that does
    not decode is left out of the view; it stays in ``messages_all``).  ``name`` is the typed table's SQL name
    (lake/typed_tables.py's ``sql_name``; default the topic's), the view's is ``<name>_all``.
    """

    topic: str
    table_uri: str
    schema: pa.Schema
    decode: TypedDecode
    name: str | None = None


@dataclass
class History:
    """One pinned read of the history: each store's live segments (read first), then each table's version."""

    lake: Path | str
    live: dict[str, tuple[Path, list[int]]]  # broker -> (store root, base offsets of the live segments)
    versions: dict[str, int] = field(default_factory=dict)  # table uri -> the version read (absent: no table)

    @classmethod
    def pin(cls, lake: Path | str, stores: Sequence[Store], tables: Sequence[str] = ()) -> History:
        """Read the stores' manifests, then the versions of ``tables`` (default: ``messages``), in that order."""
        from lake import delta as lk
        from lake import tables as names

        live = {broker: (path, live_segments(path)) for broker, path in stores}
        versions = {}
        for uri in tables or (names.table_uri(lake, names.MESSAGES),):
            if lk.is_table(uri):
                versions[uri] = lk.open_table(uri).version()
        return cls(lake, live, versions)

    def _table(self, spark: SparkSession, uri: str) -> DataFrame | None:
        from pipelines.spark_tables import read_table

        version = self.versions.get(uri)
        return None if version is None else read_table(spark, uri, version)

    def live_rows(self, spark: SparkSession) -> DataFrame | None:
        """Every live store's rows (a record may also be in the lake)."""
        frames = [live_frame(spark, broker, path, bases) for broker, (path, bases) in self.live.items() if bases]
        return _union(frames)

    def untiered(self, live: DataFrame, lake: DataFrame | None) -> DataFrame:
        """``live`` without the rows whose key ``lake`` holds.  Only lake rows of the live brokers at or above their
        lowest live CommitLog offset can hold one, when ``lake`` has that column (the ``messages`` table does)."""
        from pyspark.sql import functions as F

        if lake is None:
            return live
        near = None
        for broker, (_, bases) in self.live.items():
            if not bases:
                continue
            one = F.col(BROKER_NAME) == F.lit(broker)
            if "commitlog_offset" in lake.columns:
                one = one & (F.col("commitlog_offset") >= F.lit(min(bases)))
            near = one if near is None else near | one
        if near is None:
            return live
        return live.join(lake.where(near).select(*KEY), list(KEY), "left_anti")

    def messages_all(self, spark: SparkSession) -> DataFrame:
        """The ``messages`` table's rows UNION the live rows it does not hold, with exactly its columns."""
        from lake import tables
        from lake.schema import MESSAGES_SCHEMA, spark_schema

        columns = MESSAGES_SCHEMA.names
        lake = self._table(spark, tables.table_uri(self.lake, tables.MESSAGES))
        lake = None if lake is None else lake.select(*columns)
        live = self.live_rows(spark)
        if live is None:
            return lake if lake is not None else spark.createDataFrame([], spark_schema(MESSAGES_SCHEMA))
        fresh = self.untiered(live, lake).select(*columns)
        return fresh if lake is None else lake.unionByName(fresh)

    def typed_all(self, spark: SparkSession, typed: TypedTopic) -> DataFrame:
        """The typed table's rows UNION the topic's live rows it does not hold, decoded by ``typed.decode``."""
        from pyspark.sql import functions as F

        from lake.schema import spark_schema

        columns = typed.schema.names
        lake = self._table(spark, typed.table_uri)
        lake = None if lake is None else lake.select(*columns)
        live = self.live_rows(spark)
        if live is None:
            return lake if lake is not None else spark.createDataFrame([], spark_schema(typed.schema))
        live = live.where(F.col("topic") == F.lit(typed.topic))
        # the keys the typed table holds, compared before decoding: a body that fails to decode is no key lost
        fresh = self.untiered(live, None if lake is None else lake.where(F.col("topic") == typed.topic))
        decode = typed.decode

        def decode_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            import pyarrow as pa

            for batch in batches:
                rows = decode(batch)
                if isinstance(rows, pa.Table):
                    yield from rows.to_batches()
                else:
                    yield rows

        decoded = fresh.mapInArrow(decode_batches, spark_schema(typed.schema)).select(*columns)
        return decoded if lake is None else lake.unionByName(decoded)


def _union(frames: list[DataFrame]) -> DataFrame | None:
    if not frames:
        return None
    df = frames[0]
    for f in frames[1:]:
        df = df.unionByName(f)
    return df


def typed_view_name(typed: TypedTopic) -> str:
    return f"{typed.name or typed.topic}{ALL_SUFFIX}"


@functools.lru_cache(maxsize=64)
def _declaration(topic: str, kind: str, source: bytes, message: str | None) -> BodySchema:
    from lake.typed import parse

    return parse(topic, kind, source, message)


def _typed_rows(topic: str, kind: str, source: bytes, message: str | None, batch: pa.RecordBatch) -> pa.Table:
    """The rows of ``batch`` whose bodies decode with the declaration, as its typed table's rows.  Spark's workers
    get the declaration's bytes and parse it once each (a parsed Protobuf declaration does not pickle)."""
    from lake.typed import decode_batch

    return decode_batch(_declaration(topic, kind, source, message), batch)[0]


def declared_topics(lake: Path | str) -> tuple[list[TypedTopic], dict[str, str]]:
    """A :class:`TypedTopic` per topic with a body schema declared under ``lake``, decoding as the tier does
    (``lake.typed.decode_batch``) into its typed table's columns; and why each declaration that cannot be used
    was left out (topic -> reason), so one broken declaration costs its own view only."""
    from lake import delta as lk
    from lake import tables, typed, typed_tables

    taken = {name for name, _ in lk.lake_tables(lake)}
    found, skipped = [], {}
    for topic in typed.declared_topics(lake):
        try:
            schema = typed.load(lake, topic)
        except typed.SchemaError as e:
            skipped[topic] = str(e)
            continue
        if schema is None:
            continue
        decode = functools.partial(_typed_rows, topic, schema.kind, schema.source, schema.message)
        uri = tables.typed_table_uri(lake, topic)
        found.append(TypedTopic(topic, uri, schema.table_schema, decode, typed_tables.sql_name(topic, taken)))
    return found, skipped


def register_views(
    spark: SparkSession, lake: Path | str, stores: Sequence[Store], typed: Sequence[TypedTopic] = ()
) -> list[str]:
    """Pin the history now and (re)define the session's temporary views ``messages_all`` and each typed topic's
    ``<T>_all`` over it; returns their names.  A view is the history as of its definition: see
    :class:`LiveViews` for views kept fresh statement after statement."""
    return LiveViews(lake, stores, typed).refresh(spark)


class LiveViews:
    """The history views of a session that runs statement after statement (``mqlake sql --shell``).

    :meth:`refresh` before each statement pins the history anew.  The views are defined again only when the pin
    moved (a segment listed or tiered, a table's new version): with the same segments and versions the views
    already defined read the same, the live segments to where they end when the statement reads them, and
    defining them again would only cost the statement Spark's analysis of them.
    """

    def __init__(self, lake: Path | str, stores: Sequence[Store], typed: Sequence[TypedTopic] = ()) -> None:
        from lake import tables

        self.lake, self.stores, self.typed = lake, tuple(stores), tuple(typed)
        self.uris = [tables.table_uri(lake, tables.MESSAGES), *(t.table_uri for t in self.typed)]
        self.names = [MESSAGES_ALL, *(typed_view_name(t) for t in self.typed)]
        self.pinned: History | None = None

    def refresh(self, spark: SparkSession) -> list[str]:
        """Pin the history now; (re)define the views if it moved since the last call (or one was dropped)."""
        history = History.pin(self.lake, self.stores, self.uris)
        if history == self.pinned and all(spark.catalog.tableExists(f"`{n}`") for n in self.names):
            return self.names
        history.messages_all(spark).createOrReplaceTempView(MESSAGES_ALL)
        for t, name in zip(self.typed, self.names[1:], strict=True):
            history.typed_all(spark, t).createOrReplaceTempView(f"`{name}`")
        self.pinned = history
        return self.names

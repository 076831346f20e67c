"""Which broker a store belongs to, for the ``broker_name`` of the rows the tier writes; and whether a lake
has the broker column at all.

Where the name comes from, first that applies:

1. ``brokerName`` of the store's ``mqlake.json`` (:mod:`store.identity`), which its broker writes at start;
2. ``--broker-name`` (``TierJob(broker_name=...)``, the Airflow DAGs' per-store ``broker_name``), else
   ``brokerName`` of ``--broker-conf`` (the broker.conf the store's broker runs with);
3. the name this store (its ``storeId``) was tiered under before: the ``segments`` table's rows;
4. ``broker-a``: what a broker whose broker.conf sets no ``brokerName`` calls itself (broker/config.py), so
   a store written without one is tiered under the name its broker serves fall-through reads as.

A name given by a flag that contradicts the store's own, or the one the lake recorded for the store, stops the
run: the rows would land in another broker's partition, and that broker would serve them.

A lake tiered before the broker column existed (``messages`` partitioned by topic and store date only,
``segments`` without ``broker_name``) is refused with an error naming the table and the migration
(:mod:`pipelines.migrate_brokers`); nothing is written to it until it is migrated.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from lake import tables
from store.constants import DEFAULT_BROKER_NAME
from store.errors import MQLakeError
from store.identity import BROKER_NAME, IDENTITY_FILE, StoreIdentity, identity_path

log = logging.getLogger(__name__)


def default_broker_name() -> str:
    return DEFAULT_BROKER_NAME


class BrokerNameError(MQLakeError, ValueError):
    """A broker name that contradicts the lake, or a lake without the broker column."""


def migration_hint(lake: Path | str) -> str:
    return (
        f"migrate it once with `mqlake tier-migrate --lake {lake} --broker-name NAME` (NAME: the brokerName of "
        f"the broker whose store was tiered there, broker-a if its broker.conf set none)"
    )


def missing_broker_column(lake: Path | str) -> list[str]:
    """The tier tables under ``lake`` that predate the broker column (empty: none, or no table yet)."""
    from lake import delta as lk

    old = []
    messages = tables.table_uri(lake, tables.MESSAGES)
    partitions = list(lk.open_table(messages).metadata().partition_columns) if lk.is_table(messages) else None
    if partitions is not None and partitions != tables.MESSAGES_PARTITION_BY:
        old.append(messages)
    segments = tables.table_uri(lake, tables.SEGMENTS)
    if lk.is_table(segments) and tables.BROKER_NAME not in lk.table_schema(segments).names:
        old.append(segments)
    return old


def check_layout(lake: Path | str) -> None:
    """Raise :class:`BrokerNameError` if a tier table under ``lake`` has no broker column."""
    old = missing_broker_column(lake)
    if old:
        raise BrokerNameError(
            f"{', '.join(old)}: tiered before the broker name was a column (messages partitioned by "
            f"{tables.MESSAGES_PARTITION_BY} now); {migration_hint(lake)}"
        )


def recorded(lake: Path | str, store_id: str) -> set[str]:
    """The broker names the ``segments`` table records for the store ``store_id``."""
    from lake import delta as lk

    uri = tables.table_uri(lake, tables.SEGMENTS)
    if not lk.is_table(uri):
        return set()
    rows = lk.to_arrow(uri, [("store_id", "=", store_id)])
    return set(rows.column(tables.BROKER_NAME).to_pylist())


def resolve(lake: Path | str, store_dir: Path | str, store: StoreIdentity, given: str | None) -> str:
    """The broker name to tier the store at ``store_dir`` (identity ``store``) under (see the module docstring)."""
    check_layout(lake)
    if given is not None and not given:
        raise BrokerNameError("the broker name is empty")
    known = recorded(lake, store.store_id)
    own = store.broker_name
    if own is not None and given is not None and given != own:
        raise BrokerNameError(
            f"{identity_path(store_dir)} says {BROKER_NAME}={own}, the flags say {given} (--broker-name or "
            f"brokerName of --broker-conf): drop the flag, or tier the store its own broker wrote"
        )
    name = own if own is not None else given
    if name is not None:
        if known and known != {name}:
            raise BrokerNameError(
                f"store {store.store_id} was tiered into {lake} as broker {', '.join(sorted(known))}, not {name}: "
                f"give the brokerName of the broker.conf the store belongs to"
            )
        return name
    if len(known) == 1:
        return known.pop()
    if known:  # only a hand-edited lake gets here
        raise BrokerNameError(f"store {store.store_id} is tiered into {lake} as several brokers: {sorted(known)}")
    name = default_broker_name()
    log.warning("no broker name in %s nor given (--broker-name or --broker-conf): tiering it as %s",
                identity_path(store_dir), name)  # fmt: skip
    return name


def refuse_rows_of_another_store(
    lake: Path | str, store_dir: Path | str, store: StoreIdentity, broker_name: str,
    queues: Mapping[tuple[str, int], tuple[int, int]], *, version: int | None = None,
    withdrawn: int | None = None,
) -> int:
    """Raise :class:`BrokerNameError` before a commit whose rows would sit beside rows already in the lake: any
    (``broker_name``, topic, queue id, queue offset) of ``queues`` ((topic, queue id) -> first and last queue
    offset the commit adds) that ``messages`` holds.  The store's own earlier commits never hold these (a
    segment is committed once, by its transaction id), so such a row came from another store under the same
    broker name: two stores, one name, and both would be served as one broker's history.

    Returns the table version looked at (-1: no table yet).  ``version``: look at that version rather than the
    latest.  The check only sees commits before it, so a run asks again after its commit, at the version just
    before its own: another store's commit that landed in between is there.  ``withdrawn``: the version of this
    run's commit, already taken out again when this is raised (only the message says so)."""
    import pyarrow.dataset as ds

    from lake import delta as lk
    from lake import objectstore

    uri = tables.table_uri(lake, tables.MESSAGES)
    if not lk.is_table(uri):
        return -1
    table = lk.open_table(uri, version=version)
    looked_at = table.version()
    if not queues:
        return looked_at
    wanted = None
    for (topic, queue_id), (first, last) in sorted(queues.items()):
        one = ((ds.field("topic") == topic) & (ds.field("queue_id") == queue_id)
               & (ds.field("queue_offset") >= first) & (ds.field("queue_offset") <= last))  # fmt: skip
        wanted = one if wanted is None else wanted | one
    with objectstore.reaching(uri, "reading the Delta table"):
        found = table.to_pyarrow_dataset().to_table(
            columns=["topic", "queue_id", "queue_offset"], filter=(ds.field(tables.BROKER_NAME) == broker_name) & wanted
        )
    if found.num_rows:
        first_row = found.slice(0, 1).to_pylist()[0]
        outcome = "nothing was committed" if withdrawn is None else (
            f"its commit (version {withdrawn}) raced another store's and was taken out again")  # fmt: skip
        raise BrokerNameError(
            f"{found.num_rows} row(s) this run would commit are already in {uri} under broker_name={broker_name} "
            f"from another store (e.g. topic {first_row['topic']} queue {first_row['queue_id']} offset "
            f"{first_row['queue_offset']}); this store ({identity_path(store_dir)}, storeId {store.store_id}) is "
            f"a second store under one broker name: {outcome}; give it a brokerName of its own (its broker.conf "
            f"and {IDENTITY_FILE})"
        )
    return looked_at

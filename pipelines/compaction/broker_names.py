"""Which broker a store belongs to, for the ``broker_name`` of the rows the tier writes; and whether a lake
has the broker column at all.

Where the name comes from, first that applies:

1. ``--broker-name`` (``TierJob(broker_name=...)``, the Airflow DAGs' per-store ``broker_name``);
2. ``brokerName`` of ``--broker-conf`` (the broker.conf the store's broker runs with);
3. the name this store (its ``mqlake-store-id``) was tiered under before: the ``segments`` table's rows;
4. ``broker-a``: what a broker whose broker.conf sets no ``brokerName`` calls itself (broker/config.py), so
   a store written without one is tiered under the name its broker serves fall-through reads as.

A RocketMQ store holds no broker name of its own (the CommitLog and config JSON never name the broker), hence
the order.  A name that contradicts the one recorded for the store stops the run: the rows would land in
another broker's partition, and that broker would serve them.

A lake tiered before the broker column existed (``messages`` partitioned by topic and store date only,
``segments`` without ``broker_name``) is refused with an error naming the table and the migration
(:mod:`pipelines.migrate_brokers`); nothing is written to it until it is migrated.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipelines.compaction import tables
from store.errors import MQLakeError

log = logging.getLogger(__name__)


def default_broker_name() -> str:
    from broker.config import BrokerConfig

    return str(BrokerConfig.model_fields["broker_name"].default)


class BrokerNameError(MQLakeError, ValueError):
    """A broker name that contradicts the lake, or a lake without the broker column."""


def migration_hint(lake: Path | str) -> str:
    return (
        f"migrate it once with `mqlake tier-migrate --lake {lake} --broker-name NAME` (NAME: the brokerName of "
        f"the broker whose store was tiered there, broker-a if its broker.conf set none)"
    )


def missing_broker_column(lake: Path | str) -> list[str]:
    """The tier tables under ``lake`` that predate the broker column (empty: none, or no table yet)."""
    from pipelines import lake as lk

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
    from pipelines import lake as lk

    uri = tables.table_uri(lake, tables.SEGMENTS)
    if not lk.is_table(uri):
        return set()
    rows = lk.to_arrow(uri, [("store_id", "=", store_id)])
    return set(rows.column(tables.BROKER_NAME).to_pylist())


def resolve(lake: Path | str, store_id: str, given: str | None) -> str:
    """The broker name to tier the store ``store_id`` under (see the module docstring)."""
    check_layout(lake)
    known = recorded(lake, store_id)
    if given is not None:
        if not given:
            raise BrokerNameError("the broker name is empty")
        if known and known != {given}:
            raise BrokerNameError(
                f"store {store_id} was tiered into {lake} as broker {', '.join(sorted(known))}, not {given}: "
                f"give the brokerName of the broker.conf the store belongs to"
            )
        return given
    if len(known) == 1:
        return known.pop()
    if known:  # only a hand-edited lake gets here
        raise BrokerNameError(f"store {store_id} is tiered into {lake} as several brokers: {sorted(known)}")
    name = default_broker_name()
    log.warning("no broker name given for store %s (--broker-name or --broker-conf): tiering it as %s", store_id, name)
    return name

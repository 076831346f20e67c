"""Whose store this is: ``<store>/mqlake.json``, mqlake's own file beside RocketMQ's (which it leaves unchanged).

::

    {"storeId": "3f2c...", "brokerClusterName": "DefaultCluster", "brokerName": "broker-a"}

- ``storeId``: a random id made once per store.  The tier job's Delta transaction ids derive from it (so a
  re-run of the same store commits nothing twice) and its commits record it (so a second store under the same
  broker name is told apart from the first).
- ``brokerClusterName`` and ``brokerName``: written by the broker at start.  A RocketMQ store names no broker
  (neither the CommitLog nor the config JSON does), yet the tier must know whose partition of the lake a store's
  rows belong to; a broker started on a store that names another broker is refused, naming the key.

A store written without a broker (the store tools, tests) has a file with ``storeId`` only, made by the first
job that needs the id.  A ``mqlake-store-id`` file (where the id was kept before this file existed) gives the
id, so a store already tiered keeps its transaction ids.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from store.config_files import replace_file
from store.errors import MQLakeError

IDENTITY_FILE = "mqlake.json"
STORE_ID_FILE = "mqlake-store-id"
STORE_ID = "storeId"
CLUSTER = "brokerClusterName"
BROKER_NAME = "brokerName"
# What a broker whose broker.conf sets no brokerName calls itself (broker/config.py), and so the name the tier
# gives a store written without one


class StoreIdentityError(MQLakeError, ValueError):
    """``mqlake.json`` is unreadable, or names another broker than the one asked for."""


@dataclass(frozen=True)
class StoreIdentity:
    store_id: str
    broker_cluster_name: str | None = None
    broker_name: str | None = None

    def to_json(self) -> dict[str, str]:
        out = {STORE_ID: self.store_id}
        if self.broker_cluster_name is not None:
            out[CLUSTER] = self.broker_cluster_name
        if self.broker_name is not None:
            out[BROKER_NAME] = self.broker_name
        return out


def identity_path(store_dir: Path | str) -> Path:
    return Path(store_dir) / IDENTITY_FILE


def read(store_dir: Path | str) -> StoreIdentity | None:
    """The store's identity, None when it has no ``mqlake.json`` yet."""
    path = identity_path(store_dir)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise StoreIdentityError(f"{path}: not a readable JSON object ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get(STORE_ID), str) or not data[STORE_ID]:
        raise StoreIdentityError(f"{path}: no {STORE_ID}")
    names = {k: data.get(k) for k in (CLUSTER, BROKER_NAME)}
    bad = [k for k, v in names.items() if v is not None and (not isinstance(v, str) or not v)]
    if bad:
        raise StoreIdentityError(f"{path}: {bad[0]} must be a non-empty string")
    return StoreIdentity(data[STORE_ID], names[CLUSTER], names[BROKER_NAME])


def _write(path: Path, identity: StoreIdentity, *, replace: bool) -> None:
    """``replace`` swaps the new content in crash-safely (:func:`store.config_files.replace_file`); otherwise the
    first writer wins (a hard link fails when the file exists), so two processes making the first id agree on one."""
    payload = (json.dumps(identity.to_json(), indent=4) + "\n").encode()
    if replace:
        replace_file(path, payload)
        return
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _legacy_store_id(store_dir: Path) -> str | None:
    try:
        return (store_dir / STORE_ID_FILE).read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None


def ensure(store_dir: Path | str) -> StoreIdentity:
    """The store's identity, made (with a new ``storeId``) if it has none."""
    store_dir = Path(store_dir)
    found = read(store_dir)
    if found is not None:
        return found
    store_dir.mkdir(parents=True, exist_ok=True)
    _write(identity_path(store_dir), StoreIdentity(_legacy_store_id(store_dir) or uuid.uuid4().hex), replace=False)
    made = read(store_dir)
    assert made is not None  # just written, by this process or the one that won
    return made


def record_broker(store_dir: Path | str, cluster: str, broker_name: str) -> StoreIdentity:
    """At broker start: record ``cluster`` and ``broker_name`` in the store, or refuse (StoreIdentityError) a
    store that already names another cluster or broker."""
    current = ensure(store_dir)
    path = identity_path(store_dir)
    for key, recorded, given in ((BROKER_NAME, current.broker_name, broker_name),
                                 (CLUSTER, current.broker_cluster_name, cluster)):  # fmt: skip
        if recorded is not None and recorded != given:
            raise StoreIdentityError(
                f"{path}: the store belongs to {key}={recorded}, not {key}={given}: start it with {key}={recorded}, "
                f"or give this broker its own storePathRootDir"
            )
    if (current.broker_name, current.broker_cluster_name) == (broker_name, cluster):
        return current
    named = StoreIdentity(current.store_id, cluster, broker_name)
    _write(path, named, replace=True)
    return named

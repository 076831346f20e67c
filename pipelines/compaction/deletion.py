"""Deleting tiered segments: through the store's own deletion path, never by unlinking files here.

The store's clean pass deletes ``tiered`` segments oldest first and, with them, the ConsumeQueue units
and IndexFiles wholly below the new minimum offset (store/segment_deletion.py).  When a broker holds the store
(its ``lock``), that pass runs inside the broker: at the ``deleteWhen`` hour, under disk pressure, or on a
manual request — the job then leaves deletion to it.  When no process holds the store, the job takes its lock
and runs the same deletion on the closed store (``delete_tiered_closed``: no recovery, which would re-read the
last segments and rebuild ConsumeQueue tails for nothing); only a store that did not shut down cleanly is
opened (recovery, then manual clean passes) and closed again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

from store.checkpoint import StoreLock, StoreLockedError
from store.config import MessageStoreConfig
from store.errors import MQLakeError
from store.format import units
from store.message_store import MessageStore
from store.retention import SegmentManifest, SegmentState
from store.segment_deletion import delete_tiered_closed

log = logging.getLogger(__name__)


class StoreSizeError(MQLakeError, ValueError):
    """The store's file sizes cannot be read off its files."""


def infer_store_config(store_dir: Path) -> MessageStoreConfig:
    """The sizes a store was written with, read off its files (the store refuses files of another size)."""
    root = Path(store_dir)
    # Opened only to delete: a CRC pass over the last segments would cost seconds per GiB and decide nothing.
    values: dict = {"store_path_root_dir": root, "check_crc_on_recover": False}
    segments = sorted(_non_empty(root / "commitlog", "*", units.is_offset_file_name))
    if segments:
        values["mapped_file_size_commit_log"] = segments[0].stat().st_size
    cq = next(_non_empty(root / "consumequeue", "*/*/*", units.is_offset_file_name), None)
    if cq is not None:
        values["mapped_file_size_consume_queue"] = cq.stat().st_size
    index = sorted(_non_empty(root / "index", "*", units.is_index_file_name))
    if index:
        # The header counts used slots, not configured ones, so the size is all there is to go by:
        # 40 + 4 * slots + 20 * entries, with RocketMQ's entries = 4 * slots (5M / 20M by default).
        size = index[0].stat().st_size
        per_slot = units.index_file_size(1, 4) - units.index_file_size(0, 0)
        slots, rest = divmod(size - units.index_file_size(0, 0), per_slot)
        if rest:
            raise StoreSizeError(
                f"{index[0]}: size {size} is not maxIndexNum = 4 x maxHashSlotNum; pass the broker's config "
                f"(--broker-conf) so the store can be opened to delete tiered segments"
            )
        values["max_hash_slot_num"], values["max_index_num"] = slots, 4 * slots
    elif segments:
        values["message_index_enable"] = False  # a store with messages and no IndexFile never indexed
    return MessageStoreConfig(**values)


def _non_empty(directory: Path, pattern: str, is_name: Callable[[str], bool]) -> Iterator[Path]:
    """The non-empty files under ``directory`` matching ``pattern`` whose name ``is_name`` accepts."""
    return (p for p in directory.glob(pattern) if is_name(p.name) and p.is_file() and p.stat().st_size > 0)


def delete_tiered(store_dir: Path, config: MessageStoreConfig | None = None) -> list[int] | None:
    """Delete every ``tiered`` segment the store's deletion path allows; returns their base offsets, or
    None when a broker holds the store (it deletes them in its own clean pass).

    ``config`` is the store's configuration (from broker.conf); without it the sizes are read off the files.
    """
    root = Path(store_dir)
    manifest = SegmentManifest(root)
    if not any(e.state == SegmentState.TIERED for e in manifest.entries()):
        return []
    try:
        StoreLock(root).release()
        config = config or infer_store_config(root)
        deleted = delete_tiered_closed(config)
    except StoreLockedError:
        log.info("a broker holds %s: it deletes the tiered segments in its clean pass", root)
        return None
    if deleted is not None:
        return deleted
    # the store did not shut down cleanly: recovery re-dispatches the log before anything may go
    store = MessageStore(config)
    try:
        store.start()
    except StoreLockedError:
        return None  # a broker started in between
    deleted: list[int] = []
    try:
        while True:
            before = list(store.commitlog.queue.files)
            store.delete_expired_files_manually()  # at most 10 per pass, as RocketMQ
            gone = [mf.file_from_offset for mf in before if mf not in store.commitlog.queue.files]
            if not gone:
                break
            deleted.extend(gone)
    finally:
        store.shutdown()
    return deleted

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
from pathlib import Path

from store.checkpoint import StoreLock, StoreLockedError
from store.config import MessageStoreConfig
from store.file_sizes import infer_store_config
from store.message_store import MessageStore
from store.retention import SegmentManifest, SegmentState
from store.segment_deletion import delete_tiered_closed

log = logging.getLogger(__name__)


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

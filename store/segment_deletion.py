"""Deleting the oldest CommitLog segments, and what points only into them: one implementation, two callers.

The store's clean pass (``MessageStore.clean_expired_files``) deletes the leading segments whose manifest state
allows it, then the ConsumeQueue files and IndexFiles wholly below the new minimum offset.  The tiering job
deletes the segments it tiered the same way, on a store no process holds (:func:`delete_tiered_closed`): it takes
the store's lock and opens only the files the deletion touches, with no recovery.  That is sound only after a
clean shutdown — the ``abort`` marker gone means every record in the log was dispatched into the ConsumeQueues
and IndexFiles (``MessageStore.shutdown`` removes it only then) — so after a crash it declines, and the caller
opens the store (recovery re-dispatches first).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable

from store.checkpoint import StoreLock, abort_file
from store.commitlog import CommitLog
from store.config import MessageStoreConfig
from store.consume_queue import ConsumeQueue, ConsumeQueueTable
from store.index import IndexService
from store.retention import SegmentManifest, SegmentState

log = logging.getLogger(__name__)


def delete_leading_segments(
    commitlog: CommitLog,
    manifest: SegmentManifest,
    consume_queues: Iterable[ConsumeQueue],
    index: IndexService,
    deletable: Collection[SegmentState],
    *,
    dispatched_to: int,
    limit: int | None = None,
) -> list[int]:
    """Delete the oldest segments while their state is ``deletable`` (never the last one, never one holding bytes
    at or past ``dispatched_to``, at most ``limit``), then the ConsumeQueue files and IndexFiles wholly below the
    new minimum; returns the deleted segments' base offsets."""
    states = {e.base_offset: e.state for e in manifest.entries()}
    deleted: list[int] = []
    files = commitlog.queue.files
    limit = len(files) if limit is None else limit
    while len(files) > 1 and len(deleted) < limit and states.get(files[0].file_from_offset) in deletable:
        base = files[0].file_from_offset
        if base + files[0].file_size > dispatched_to:
            break  # never delete what is not dispatched yet
        commitlog.queue.delete_first()
        manifest.mark_deleted(base)
        deleted.append(base)
        files = commitlog.queue.files
    if deleted:
        cl_min = commitlog.min_offset
        for cq in consume_queues:
            cq.delete_expired(cl_min)
        index.delete_expired(cl_min)
        log.info("deleted CommitLog segments %s; new minimum offset %d", deleted, cl_min)
    return deleted


def delete_tiered_closed(config: MessageStoreConfig) -> list[int] | None:
    """Delete the leading ``tiered`` segments of a store no process holds, without opening it; returns their base
    offsets, or None when the store did not shut down cleanly (open it instead: recovery must run first).

    Raises ``StoreLockedError`` when a process holds the store."""
    root = config.store_path_root_dir
    lock = StoreLock(root)
    try:
        if abort_file(root).exists():
            return None
        commitlog = CommitLog(config.commitlog_dir, config.mapped_file_size_commit_log)
        consume_queues = ConsumeQueueTable(config.consume_queue_dir, config.mapped_file_size_consume_queue)
        index = IndexService(config.index_dir, config.max_hash_slot_num, config.max_index_num)
        try:
            commitlog.queue.load()
            files = commitlog.queue.files
            if len(files) < 2:
                return []
            consume_queues.load()
            index.load(last_exit_ok=True, index_msg_timestamp=0)  # the timestamp matters only after a crash
            # a clean shutdown dispatched the whole log: every segment before the last one is behind dispatch
            return delete_leading_segments(
                commitlog, SegmentManifest(root), consume_queues.all(), index, {SegmentState.TIERED},
                dispatched_to=files[-1].file_from_offset,
            )  # fmt: skip
        finally:
            commitlog.close()
            for cq in consume_queues.all():
                cq.close()
            index.close()
    finally:
        lock.release()

"""Recovery at start-up, as RocketMQ's ``DefaultMessageStore.recover`` does it.

Normal exit (no abort file): scan the CommitLog from the 3rd-last segment, truncate a torn tail, and
re-dispatch from the highest offset any ConsumeQueue reached.  Abnormal exit: start from the newest
segment whose first record is older than the checkpoint (minus 3 s) and re-dispatch everything from
there; dispatch is idempotent, so ConsumeQueue and IndexFile end up complete.

Two things we do beyond RocketMQ, because they lose data there: bytes cut off a torn tail are copied
to ``<root>/quarantine/`` first, and a bad record in a segment that is *followed by valid segments* is
an error naming the file and offset instead of a truncation that would discard every later segment.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from store.checkpoint import StoreCheckpoint
from store.commitlog import CommitLog
from store.config import MessageStoreConfig
from store.consume_queue import ConsumeQueue
from store.errors import MQLakeError
from store.format import records, units
from store.index import IndexService
from store.mapped_file import PAGE_SIZE, MappedFile

log = logging.getLogger(__name__)


class StoreCorruptError(MQLakeError, RuntimeError):
    """A record in the middle of the log is bad; truncating there would drop valid later segments."""


@dataclass
class RecoveryReport:
    abnormal: bool
    process_offset: int
    dispatch_from: int
    truncated_bytes: int = 0
    quarantined_to: str | None = None
    cq_units_dropped: int = 0
    index_entries_dropped: int = 0
    # each loaded ConsumeQueue's end (next queue offset) as found on disk, before anything was cut
    queue_ends: dict[tuple[str, int], int] = field(default_factory=dict)


def store_time_at(cl: CommitLog, phy: int) -> int | None:
    data = cl.read_record_at(phy)
    return records.read_store_timestamp(data, 0) if data else None


def _scan_commitlog(commitlog: CommitLog, start_index: int, config: MessageStoreConfig) -> int:
    """Scan valid records from segment ``start_index``; return the end of the last valid one."""
    files = commitlog.queue.files
    check_crc = config.check_crc_on_recover
    process = files[start_index].file_from_offset
    for i in range(start_index, len(files)):
        mf = files[i]
        walk = records.RecordWalk(mf.view)
        for pos, size in walk:
            res = records.check_record(mf.view, pos, check_crc=check_crc, size=size)
            # A bad record (no request: given the walk's size, never a BLANK) ends the log, and so does one
            # whose PHYSICALOFFSET is not where it lies: it was never appended there.
            if res.request is None or res.request.commitlog_offset != mf.file_from_offset + pos:
                break
        else:
            pos = mf.file_size if walk.ended is records.WalkEnd.BLANK else walk.end
        process = mf.file_from_offset + pos
        if pos < mf.file_size:
            # A short segment ends the log. If a later segment starts with a valid record, this is not a
            # torn tail but damage in the middle: refuse rather than throw the later segments away.
            if i + 1 < len(files) and records.check_record(files[i + 1].view, 0, check_crc=check_crc).size > 0:
                res = records.check_record(mf.view, pos, check_crc=check_crc)
                raise StoreCorruptError(
                    f"{mf.path}: invalid record at position {pos} (CommitLog offset {process}): {res.reason}; "
                    f"later segments hold valid data, so the store will not truncate here. "
                    f"Inspect with `mqlake store dump --verify {config.store_path_root_dir}`."
                )
            break
    return process


def _first_record_time(mf: MappedFile, check_crc: bool) -> int | None:
    res = records.check_record(mf.view, 0, check_crc=check_crc)
    if res.request is None:  # a bad record, a BLANK or zeros
        return None
    return res.request.store_timestamp


def _abnormal_start_index(commitlog: CommitLog, cp: StoreCheckpoint, config: MessageStoreConfig) -> int:
    """Newest segment whose first record is valid and not newer than the checkpoint bound."""
    files = commitlog.queue.files
    # Bounding by the index timestamp too (RocketMQ's messageIndexSafe) is what keeps queries complete:
    # index files newer than it were just discarded and must be rebuilt from the log.
    bound = cp.min_timestamp_index if config.message_index_enable else cp.min_timestamp
    if bound > time.time() * 1000:
        # A checkpoint from the future was not written by a flush; trusting it would skip re-dispatch of
        # everything before the last segment. Re-dispatch from the first segment instead.
        log.warning("checkpoint %s holds timestamps in the future; recovering from the first segment", cp.path)
        return 0
    for i in range(len(files) - 1, -1, -1):
        ts = _first_record_time(files[i], config.check_crc_on_recover)
        if ts is not None and ts != 0 and ts <= bound:
            return i
    return 0


def _quarantine_tail(commitlog: CommitLog, offset: int, qdir: Path) -> tuple[int, str | None]:
    """Copy the non-zero bytes past ``offset`` (the part about to be truncated) to ``qdir``."""
    files = commitlog.queue.files
    chunks: list[bytes] = []
    for mf in files:
        if mf.end_offset <= offset:
            continue
        pos = max(0, offset - mf.file_from_offset)
        end = pos
        while end < mf.file_size:
            nxt = min(mf.file_size, (end // PAGE_SIZE + 1) * PAGE_SIZE)
            if not any(mf.mm[end:nxt]):
                break
            end = nxt
        if end > pos:
            chunks.append(mf.mm[pos:end])
    data = b"".join(chunks)
    if not data:
        return 0, None
    qdir.mkdir(parents=True, exist_ok=True)
    path = qdir / f"commitlog-{offset:020d}-{int(time.time() * 1000)}.bin"
    path.write_bytes(data)
    log.warning("CommitLog truncated at offset %d: %d bytes past it copied to %s", offset, len(data), path)
    return len(data), str(path)


def _verify_cq_tail(cl: CommitLog, consume_queues: Sequence[ConsumeQueue], process: int) -> tuple[int, int]:
    """Check the recovered ConsumeQueue units against the CommitLog; cut each queue at its first bad unit.

    Returns (units dropped, lowest CommitLog offset that must be re-dispatched).
    """
    dropped = 0
    redispatch_from = process
    cl_min = cl.min_offset
    for cq in consume_queues:
        files = cq.queue.files
        if not files:
            continue
        start_file = max(0, len(files) - 3)
        good_end_units = None
        last_good_phy_end = None
        for mf in files[start_file:]:
            for pos in range(0, mf.wrote, units.CQ_UNIT_SIZE):
                phy, size, _tags = units.decode_cq_unit(mf.mm, pos)
                if size == units.CQ_FILL_SIZE or phy + size <= cl_min:
                    continue  # filler, or data already deleted below the CommitLog minimum
                index = (mf.file_from_offset + pos) // units.CQ_UNIT_SIZE
                data = cl.read(phy, records.PLACEMENT_SIZE) if phy + size <= process else None
                ok = False
                if data is not None:
                    total, magic, qid, qoff = records.read_record_placement(data)
                    ok = (
                        magic in (records.MESSAGE_MAGIC_V1, records.MESSAGE_MAGIC_V2)
                        and total == size
                        and qid == cq.queue_id
                        and qoff == index
                    )
                if not ok:
                    good_end_units = index
                    break
                last_good_phy_end = phy + size
            if good_end_units is not None:
                break
        if good_end_units is None:
            continue
        n_before = cq.max_offset_in_queue
        log.warning(
            "%s-%d: ConsumeQueue unit %d does not match the CommitLog; rebuilding from there",
            cq.topic, cq.queue_id, good_end_units,
        )  # fmt: skip
        cq.queue.truncate_dirty_files(good_end_units * units.CQ_UNIT_SIZE)
        cq.max_physic_offset = last_good_phy_end if last_good_phy_end is not None else -1
        dropped += n_before - cq.max_offset_in_queue
        redispatch_from = min(redispatch_from, last_good_phy_end if last_good_phy_end is not None else cl_min)
    return dropped, redispatch_from


def recover(
    cl: CommitLog, cqs: Sequence[ConsumeQueue], index: IndexService, checkpoint: StoreCheckpoint,
    config: MessageStoreConfig, *, last_exit_ok: bool,
) -> RecoveryReport:  # fmt: skip
    """Bring the loaded CommitLog and ConsumeQueues to a consistent end; say where dispatch must restart.

    The CommitLog is scanned (from the 3rd-last segment after a clean exit, else from where the
    checkpoint says) and cut at the end of its valid data; ConsumeQueue units and IndexFile entries past it,
    and units not matching it, are dropped.  IndexFiles newer than the checkpoint were already discarded by
    ``IndexService.load``.
    """
    for cq in cqs:
        cq.recover()
    queue_ends = {(cq.topic, cq.queue_id): cq.max_offset_in_queue for cq in cqs}
    max_cq_phy = max((cq.max_physic_offset for cq in cqs), default=-1)
    files = cl.queue.files
    if not files:
        # The deleted-CommitLog case: queues pointing nowhere are useless.
        for cq in cqs:
            cq.destroy()
        index.destroy()
        return RecoveryReport(not last_exit_ok, 0, 0, queue_ends=queue_ends)

    start = max(0, len(files) - 3) if last_exit_ok else _abnormal_start_index(cl, checkpoint, config)
    process = _scan_commitlog(cl, start, config)
    truncated, qpath = _quarantine_tail(cl, process, config.quarantine_dir)
    cl.queue.truncate_dirty_files(process)
    # RocketMQ leaves its IndexFiles alone here (only files newer than the checkpoint go, at load): entries past the
    # cut then answer queries with whatever is written there next, and hide the keys written there next.
    index_dropped = index.truncate(process, lambda phy: store_time_at(cl, phy))
    if max_cq_phy >= process or not last_exit_ok:
        for cq in cqs:
            cq.truncate_dirty_logic_files(process)
    dropped, redispatch_from = _verify_cq_tail(cl, cqs, process)

    if last_exit_ok:
        dispatch_from = min(max(max_cq_phy, cl.min_offset), process, redispatch_from)
    else:
        dispatch_from = min(files[start].file_from_offset if files else 0, redispatch_from)
    dispatch_from = max(dispatch_from, cl.min_offset)
    return RecoveryReport(
        not last_exit_ok, process, dispatch_from, truncated, qpath, dropped, index_dropped, queue_ends
    )

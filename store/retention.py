"""Which CommitLog segments are expired, and the segment manifest an offline job claims them from.

The manifest is ``<storeRoot>/segments.json``: one entry per CommitLog file.  It is shared between the
broker process (which adds, seals, expires and finally deletes segments) and a tiering job in another
process (which claims expired segments and marks them tiered or quarantined).  Every change is a
read-modify-write under an exclusive ``flock`` on ``segments.json.lock``, written to a temp file and
renamed, so each process sees whole states and a crash in either leaves the last committed state.

Life of a segment::

    active -> sealed -> expired -> tiering -> tiered -> deleted
                                     |  |
                                     |  +-> sealed   (release: the store expires it again in its next pass)
                                     |  +-> tiering  (the claimer died or its lease ran out: taken over)
                                     v
                                  quarantined     (kept on disk, reported)

With ``expiredSegmentPolicy=delete`` an expired segment goes straight to ``deleted``, as in RocketMQ.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from store.config import parse_delete_when
from store.config_files import replace_file
from store.errors import MQLakeError

MANIFEST_NAME = "segments.json"
DEFAULT_CLAIM_LEASE_S = 3600.0


class SegmentState(StrEnum):
    ACTIVE = "active"
    SEALED = "sealed"
    EXPIRED = "expired"
    TIERING = "tiering"
    TIERED = "tiered"
    QUARANTINED = "quarantined"
    DELETED = "deleted"


class SegmentEntry(BaseModel):
    base_offset: int
    size: int
    state: SegmentState = SegmentState.ACTIVE
    first_store_time: int | None = None
    last_store_time: int | None = None
    message_count: int | None = None
    claimed_by: str | None = None
    claimed_at: float | None = None
    updated_at: float = 0.0
    note: str = ""

    @property
    def file_name(self) -> str:
        return f"{self.base_offset:020d}"


class ManifestError(MQLakeError, RuntimeError):
    """The segment manifest cannot be read, or a change to it does not fit the segment's state."""


def claimer_id(run_id: str = "") -> str:
    """Who holds a claim: host, pid and the job's run id."""
    return f"{socket.gethostname()}:{os.getpid()}:{run_id}"


def _claimer_alive(owner: str) -> bool:
    host, _, rest = owner.partition(":")
    pid_s = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_s.isdigit():
        return True  # cannot tell from here; the lease decides
    try:
        os.kill(int(pid_s), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SegmentManifest:
    def __init__(self, store_root: Path) -> None:
        self.root = Path(store_root)
        self.path = self.root / MANIFEST_NAME
        self.lock_path = self.root / (MANIFEST_NAME + ".lock")

    # --- raw access --------------------------------------------------------------------------------------
    def _read(self) -> dict[int, SegmentEntry]:
        if not self.path.exists():
            return {}
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            return {int(k): SegmentEntry(**v) for k, v in raw.get("segments", {}).items()}
        except (ValueError, TypeError) as e:
            raise ManifestError(f"{self.path}: unreadable segment manifest: {e}") from e

    def _write(self, entries: dict[int, SegmentEntry]) -> None:
        data = {
            "version": 1,
            "segments": {e.file_name: e.model_dump(mode="json") for _, e in sorted(entries.items())},
        }
        replace_file(self.path, json.dumps(data, indent=2).encode("utf-8"))

    @contextlib.contextmanager
    def transaction(self) -> Iterator[dict[int, SegmentEntry]]:
        """Exclusive read-modify-write; the dict yielded is written back when the block succeeds."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a+") as lk:
            fcntl.flock(lk, fcntl.LOCK_EX)
            entries = self._read()
            yield entries
            self._write(entries)

    def entries(self) -> list[SegmentEntry]:
        if not self.path.exists():
            return []
        with open(self.lock_path, "a+") as lk:
            fcntl.flock(lk, fcntl.LOCK_SH)
            return [e for _, e in sorted(self._read().items())]

    def get(self, base_offset: int) -> SegmentEntry | None:
        return next((e for e in self.entries() if e.base_offset == base_offset), None)

    # --- the offline job's API ------------------------------------------------------------------------------
    def claim(
        self,
        owner: str,
        *,
        limit: int | None = None,
        treat_sealed_as_expired: bool = False,
        lease_s: float = DEFAULT_CLAIM_LEASE_S,
    ) -> list[SegmentEntry]:
        """Move expired segments (oldest first) to ``tiering`` for ``owner`` and return them.

        Segments another claimer holds are skipped unless its process is gone or its lease ran out, so
        a job killed mid-run is finished by the next one.  ``treat_sealed_as_expired`` is the job's
        ``--file-reserved-time 0``: every sealed segment counts; the active one never does.
        """
        now = time.time()
        claimable = {SegmentState.EXPIRED} | ({SegmentState.SEALED} if treat_sealed_as_expired else set())
        out: list[SegmentEntry] = []
        with self.transaction() as entries:
            for _, e in sorted(entries.items()):
                if limit is not None and len(out) >= limit:
                    break
                stale = (
                    e.state == SegmentState.TIERING
                    and e.claimed_by != owner
                    and (not _claimer_alive(e.claimed_by or "") or now - (e.claimed_at or 0) > lease_s)
                )
                mine = e.state == SegmentState.TIERING and e.claimed_by == owner
                if e.state in claimable or stale or mine:
                    e.state, e.claimed_by, e.claimed_at, e.updated_at = SegmentState.TIERING, owner, now, now
                    out.append(e.model_copy())
        return out

    def _finish(self, base_offset: int, owner: str, state: SegmentState, note: str = "", **facts: Any) -> SegmentEntry:
        with self.transaction() as entries:
            e = entries.get(base_offset)
            if e is None:
                raise ManifestError(f"{self.path}: no segment {base_offset:020d}")
            if e.state != SegmentState.TIERING or e.claimed_by != owner:
                raise ManifestError(
                    f"{self.path}: segment {e.file_name} is {e.state.value} "
                    f"(claimed by {e.claimed_by}), not held by {owner}"
                )
            e.state, e.note, e.updated_at = state, note, time.time()
            e.claimed_by = e.claimed_at = None
            for k, v in facts.items():
                setattr(e, k, v)
            return e.model_copy()

    def mark_tiered(self, base_offset: int, owner: str, note: str = "", **facts: Any) -> SegmentEntry:
        """The segment's rows are committed and verified: the store may now delete it."""
        return self._finish(base_offset, owner, SegmentState.TIERED, note, **facts)

    def mark_quarantined(self, base_offset: int, owner: str, reason: str) -> SegmentEntry:
        """The segment failed a check: it is kept on disk and never deleted automatically."""
        return self._finish(base_offset, owner, SegmentState.QUARANTINED, reason)

    def release(self, base_offset: int, owner: str) -> SegmentEntry:
        """Give a claim back untouched.

        It becomes ``sealed``, not ``expired``: it may have been claimed early (``treat_sealed_as_expired``),
        and under ``expiredSegmentPolicy=delete`` an expired segment is deleted.  The store's next clean
        pass expires it again once its ``fileReservedTime`` has really passed.
        """
        return self._finish(base_offset, owner, SegmentState.SEALED, "released")

    # --- the store's side ------------------------------------------------------------------------------------
    def sync_files(self, files: list[tuple[int, int]], stats: dict[int, tuple[int, int | None, int | None]]) -> None:
        """Record the CommitLog's files: the last one is active, earlier ones sealed at least.

        ``stats`` maps base offset -> (message count, first store time, last store time) where known.
        """
        now = time.time()
        present = {b for b, _ in files}
        with self.transaction() as entries:
            for i, (base, size) in enumerate(files):
                e = entries.get(base)
                if e is None or e.state == SegmentState.DELETED:
                    e = entries[base] = SegmentEntry(base_offset=base, size=size, updated_at=now)
                if i < len(files) - 1 and e.state == SegmentState.ACTIVE:
                    e.state, e.updated_at = SegmentState.SEALED, now
                if base in stats:
                    e.message_count, e.first_store_time, e.last_store_time = stats[base]
            for base, e in entries.items():
                if base not in present and e.state != SegmentState.DELETED:
                    e.state, e.updated_at = SegmentState.DELETED, now

    def expire(self, bases: list[int]) -> None:
        now = time.time()
        with self.transaction() as entries:
            for b in bases:
                e = entries.get(b)
                if e is not None and e.state == SegmentState.SEALED:
                    e.state, e.updated_at = SegmentState.EXPIRED, now

    def adopt_tiered(self, bases: list[int]) -> list[int]:
        """A slave's copy: segments its master tiered become tiered here (sealed or expired ones only), so the
        clean pass may delete them; returns those that changed."""
        now = time.time()
        out = []
        with self.transaction() as entries:
            for b in bases:
                e = entries.get(b)
                if e is not None and e.state in (SegmentState.SEALED, SegmentState.EXPIRED):
                    e.state, e.note, e.updated_at = SegmentState.TIERED, "tiered by the master", now
                    out.append(b)
        return out

    def mark_deleted(self, base_offset: int) -> None:
        with self.transaction() as entries:
            e = entries.get(base_offset)
            if e is not None:
                e.state, e.updated_at = SegmentState.DELETED, time.time()


def is_deletion_hour(delete_when: str, now: float | None = None) -> bool:
    """Whether the local clock's hour (now, or ``now``) is one of ``deleteWhen``'s."""
    return time.localtime(now).tm_hour in parse_delete_when(delete_when)


def disk_used_ratio(path: Path) -> float:
    """``UtilAll.getDiskPartitionSpaceUsedPercent``: used / (used + usable), rounded up to a whole percent,
    as df's Use% (blocks reserved for root count as neither); -1.0 when it cannot be measured."""
    try:
        st = os.statvfs(path)
    except OSError:
        return -1.0
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    entire = used + st.f_bavail * st.f_frsize
    if st.f_blocks == 0 or entire == 0:
        return -1.0
    return -(-used * 100 // entire) / 100


def disk_free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer can still take on ``path``'s filesystem (df's Avail); -1 when unknown."""
    try:
        st = os.statvfs(path)
    except OSError:
        return -1
    return st.f_bavail * st.f_frsize

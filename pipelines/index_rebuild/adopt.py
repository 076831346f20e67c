"""``mqlake store adopt-index``: install rebuilt ConsumeQueue and IndexFile files into a stopped store.

Holds the store lock while it works (so no broker can start in between, and a running one makes it
refuse), moves every file it replaces to ``STORE/index-backup/<time>/`` in the same layout, and
installs each directory by copying to a temporary name and renaming it into place.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from pipelines.index_rebuild.job import REPAIR_MANIFEST
from pipelines.segment_reader import segment_files
from store import names
from store.checkpoint import StoreLock
from store.errors import MQLakeError
from store.mapped_file import fsync_dir


class AdoptError(MQLakeError, RuntimeError):
    """The rebuilt files cannot be installed into this store (the message says why)."""


@dataclass
class AdoptResult:
    backup: Path
    queues: list[str] = field(default_factory=list)
    index_files: list[str] = field(default_factory=list)


def _install(src: Path, dst: Path, backup: Path) -> None:
    """Replace directory ``dst`` by a copy of ``src``; the old one moves to ``backup``."""
    tmp = dst.with_name(dst.name + ".adopting")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    if dst.exists():
        backup.parent.mkdir(parents=True, exist_ok=True)
        dst.rename(backup)
    tmp.rename(dst)
    fsync_dir(dst.parent)


def adopt_index(store_dir: Path, from_dir: Path) -> AdoptResult:
    """Install the files ``verify_index(..., repair_out=from_dir)`` wrote; raises StoreLockedError if a broker runs."""
    store_dir, from_dir = Path(store_dir), Path(from_dir)
    manifest_path = from_dir / REPAIR_MANIFEST
    if not manifest_path.is_file():
        raise AdoptError(f"{from_dir} has no {REPAIR_MANIFEST}: not the --out of `mqlake verify-index --repair`")
    manifest = json.loads(manifest_path.read_text())
    if not (store_dir / "commitlog").is_dir():
        raise AdoptError(f"{store_dir} has no commitlog directory")
    for q in manifest["consume_queues"]:  # every name before any file moves: nothing half adopted
        bad = names.file_name_error(str(q["topic"])) or names.file_name_error(str(q["queue_id"]))
        if bad is not None:
            raise AdoptError(f"{manifest_path}: a consume queue's name {bad}; nothing adopted")
    lock = StoreLock(store_dir)
    try:
        segments = segment_files(store_dir)
        cl_min = int(segments[0].name) if segments else 0
        if cl_min > manifest["commitlog_end_offset"] or cl_min < manifest["commitlog_min_offset"]:
            raise AdoptError(
                f"the store's CommitLog now starts at {cl_min}; the rebuilt files cover "
                f"{manifest['commitlog_min_offset']}..{manifest['commitlog_end_offset']}: run verify-index again"
            )
        backup = store_dir / "index-backup" / datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        result = AdoptResult(backup)
        for q in manifest["consume_queues"]:
            rel = Path("consumequeue") / q["topic"] / str(q["queue_id"])
            (store_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            _install(from_dir / rel, store_dir / rel, backup / rel)
            result.queues.append(f"{q['topic']}-{q['queue_id']}")
        _install(from_dir / "index", store_dir / "index", backup / "index")
        result.index_files = list(manifest["index_files"])
        return result
    finally:
        lock.release()

"""Each tier run's staging directory and its lease; the staged files of dead runs that were never committed.

A run stages its parquet under ``messages/tier-<run id>/`` of a local lake (staging.py); its commit makes some
of those files part of the table in place, and a run killed before its commit (or the files of segments left
out of it) leaves the rest there, outside the Delta log, for nothing to read.

The lease says which runs are alive: the run holds an exclusive ``flock`` on ``tier-<run id>/.mqlake-run.lease``
from before its first staged file until it ends, and the kernel drops it when the process dies, however it
dies.  The directory is made under a temporary name (``.making-...``) with its lease already locked and then
renamed, so no ``tier-*`` directory is ever seen without a held lease while its run lives (a run killed before
the rename leaves an empty ``.making-...`` directory, which is left alone).  ``flock`` locks conflict between
any two opens of the file, in one process or two, so runs in threads of one process see each other too; they
reach other machines only as far as the lake's file system carries ``flock`` (NFS v4 does).  Once a dead run's
leftovers are gone, a directory that still holds committed files is marked done (``.mqlake-run.done`` in place
of the lease) and never looked into again.

:func:`remove_dead_runs_files` deletes, in the directories of runs whose lease nobody holds, the files Delta's
own vacuum calls untracked: listed by a full vacuum but not by the plain one, so named by no add or remove
action of the log (a file removed from the table, which time travel may still read, stays for vacuum).

A lake on S3 has no lock that dies with its holder.  Its runs stage in a local mirror and upload under the
table's ``tier-<run id>/`` just before their commit, so the lease of the local staging directory (naming the
table) still tells a dead run from a live one, for the runs of this host: :func:`remove_dead_runs_uploads`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import socket
import uuid
from pathlib import Path

from lake import objectstore
from store.checkpoint import flock_held

log = logging.getLogger(__name__)

RUN_DIR_PREFIX = "tier-"
LEASE = ".mqlake-run.lease"
DONE = ".mqlake-run.done"
_MAKING = ".making-"  # a run directory before its rename: its lease is held from the start


def run_dir(root: Path, run_id: str) -> Path:
    """The staging directory of run ``run_id`` under the staging root ``root``."""
    return Path(root) / f"{RUN_DIR_PREFIX}{run_id}"


class RunLease:
    """The run's staging directory, made with its lease held until :meth:`release` (or the process's end)."""

    def __init__(self, root: Path, run_id: str, table: str | None = None) -> None:
        """``table``: the table on S3 the run uploads its staged files to (None: a local lake's, staged in place)."""
        self.directory = run_dir(root, run_id)
        self.table = table
        self._fd: int | None = None

    def acquire(self) -> Path:
        root = self.directory.parent
        root.mkdir(parents=True, exist_ok=True)
        making = root / f"{_MAKING}{self.directory.name}-{uuid.uuid4().hex[:8]}"
        making.mkdir()
        fd = os.open(making / LEASE, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        owner = {"host": socket.gethostname(), "pid": os.getpid(), "table": self.table}
        os.write(fd, json.dumps(owner).encode() + b"\n")
        os.rename(making, self.directory)
        self._fd = fd
        return self.directory

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _untracked(table_root: Path | str) -> set[str] | None:
    """Files under the table that no version of its log names, relative to it (None: no table yet, nothing is)."""
    from lake import delta as lk

    if not lk.is_table(table_root):
        return None
    dt = lk.open_table(table_root)
    with objectstore.reaching(str(table_root), "listing the Delta table's files"):
        every = dt.vacuum(retention_hours=0, dry_run=True, full=True, enforce_retention_duration=False)
        removed = dt.vacuum(retention_hours=0, dry_run=True, full=False, enforce_retention_duration=False)
    prefix = str(table_root).rstrip("/") + "/"
    return {f.removeprefix(prefix) for f in set(every) - set(removed)}


def remove_dead_runs_files(table_root: Path | str) -> list[str]:
    """Delete the never-committed files of dead runs under ``table_root`` (a local ``messages`` table), and their
    directories once nothing committed is left in them; returns the files deleted, relative to the root."""
    root = Path(table_root)
    if not root.is_dir():
        return []
    dead = [
        d for d in root.iterdir()
        if d.name.startswith(RUN_DIR_PREFIX) and d.is_dir() and not (d / DONE).exists() and not flock_held(d / LEASE)
    ]  # fmt: skip
    if not dead:
        return []
    untracked = _untracked(root)
    removed = []
    for d in dead:
        for f in sorted(p for p in d.rglob("*") if p.is_file() and p.name != LEASE):
            rel = f.relative_to(root).as_posix()
            if untracked is None or rel in untracked:
                with contextlib.suppress(FileNotFoundError):
                    f.unlink()
                removed.append(rel)
        for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                sub.rmdir()  # only the empty ones
        if not any(p.name != LEASE for p in d.iterdir()):
            shutil.rmtree(d, ignore_errors=True)
        else:  # committed files stay: nothing more to look for here
            (d / DONE).touch()
            (d / LEASE).unlink(missing_ok=True)
    if removed:
        log.info("removed %d staged file(s) of dead tier runs never committed to %s: %s", len(removed), root,
                 sorted({r.split("/", 1)[0] for r in removed}))  # fmt: skip
    return removed


def remove_dead_runs_uploads(table_uri: str) -> list[str]:
    """Delete, under ``table_uri`` (a ``messages`` table on S3), the uploaded never-committed files of dead runs
    of this host, and then those runs' local staging directories; returns the files deleted, relative to the
    table.

    A run on S3 stages under the local staging root (``<store>-<run>/messages/tier-<run>``, the lease there
    naming the table) and uploads to ``tier-<run>/`` under the table just before its commit, so the flock of
    its local lease still tells whether it lives.  A run of another host has no lease here and its files are
    left alone: only vacuum deletes them, once older than the table's retention."""
    from pyarrow import fs as pafs

    dead = []
    for d in objectstore.local_staging_root().glob(f"*/*/{RUN_DIR_PREFIX}*"):
        if d.is_dir() and not flock_held(d / LEASE) and _lease_table(d) == table_uri:
            dead.append(d)
    if not dead:
        return []
    untracked = _untracked(table_uri)
    fsys, base = objectstore.filesystem(table_uri)
    removed = []
    for d in dead:
        selector = pafs.FileSelector(f"{base}/{d.name}", allow_not_found=True, recursive=True)
        with objectstore.reaching(table_uri, f"cleaning up the staged files of dead run {d.name}"):
            kept, deleted = False, False
            for info in fsys.get_file_info(selector):
                rel = info.path.removeprefix(base + "/")
                if info.type != pafs.FileType.File:
                    continue
                if untracked is None or rel in untracked:
                    fsys.delete_file(info.path)
                    removed.append(rel)
                    deleted = True
                else:
                    kept = True
            if deleted and not kept:  # deleting a prefix's last object leaves empty "directory" markers: them too
                with contextlib.suppress(FileNotFoundError):
                    fsys.delete_dir(selector.base_dir)
        shutil.rmtree(d.parent.parent, ignore_errors=True)  # the run's whole local staging: <store>-<run>
    if removed:
        log.info("removed %d uploaded file(s) of dead tier runs never committed to %s: %s", len(removed),
                 table_uri, sorted({r.split("/", 1)[0] for r in removed}))  # fmt: skip
    return removed


def _lease_table(directory: Path) -> str | None:
    """The table the lease in ``directory`` says its run uploads to (None: unreadable, or a local lake's run)."""
    try:
        table = json.loads((directory / LEASE).read_text().splitlines()[0]).get("table")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return table if isinstance(table, str) else None

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

    def __init__(self, root: Path, run_id: str) -> None:
        self.directory = run_dir(root, run_id)
        self._fd: int | None = None

    def acquire(self) -> Path:
        root = self.directory.parent
        root.mkdir(parents=True, exist_ok=True)
        making = root / f"{_MAKING}{self.directory.name}-{uuid.uuid4().hex[:8]}"
        making.mkdir()
        fd = os.open(making / LEASE, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid()}).encode() + b"\n")
        os.rename(making, self.directory)
        self._fd = fd
        return self.directory

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _held(directory: Path) -> bool:
    """Whether a live run holds the lease in ``directory`` (no lease file: a run directory of no live run)."""
    try:
        fd = os.open(directory / LEASE, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops this open's lock only
    return False


def _untracked(table_root: Path) -> set[str] | None:
    """Files under the table that no version of its log names, relative to it (None: no table yet, nothing is)."""
    from pipelines import lake as lk

    if not lk.is_table(table_root):
        return None
    dt = lk.open_table(table_root)
    every = dt.vacuum(retention_hours=0, dry_run=True, full=True, enforce_retention_duration=False)
    removed = dt.vacuum(retention_hours=0, dry_run=True, full=False, enforce_retention_duration=False)
    return set(every) - set(removed)


def remove_dead_runs_files(table_root: Path | str) -> list[str]:
    """Delete the never-committed files of dead runs under ``table_root`` (a local ``messages`` table), and their
    directories once nothing committed is left in them; returns the files deleted, relative to the root."""
    root = Path(table_root)
    if not root.is_dir():
        return []
    dead = [
        d for d in root.iterdir()
        if d.name.startswith(RUN_DIR_PREFIX) and d.is_dir() and not (d / DONE).exists() and not _held(d)
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

"""The tiering job: expired CommitLog segments -> Delta ``messages`` + ``segments``, verified before deletion.

One run::

    claim (manifest: expired -> tiering)
    scan each file on the driver                     (record count, BLANK, torn tail; bodies' CRCs: in stage)
    skip what the tier already committed             (txn version of this store, see below)
    stage:   ONE Spark job decodes the segments, evaluates the record rules and digests the rows while it
             writes them as parquet under messages/tier-<run>/ (not yet visible; staging.py)
    validate the rules' counts and the segment/queue checks (expectations/) -> quality_results;
             failures quarantined, kept (their staged files are not committed)
    refuse:  rows another store already committed under this broker name (broker_names.py): nothing commits
    commit:  ONE delta-rs commit adds the passing segments' files, with txn (app id, version) and the store id
    verify:  read the committed snapshot back (bodies too), match it against the staging pass's digests;
             a segment that does not match is quarantined and its rows deleted again (one commit)
    segments table row per verified segment (same txn id, so it is written once)
    typed:   topics with a declared body schema: the verified rows decoded into their typed tables and
             decode_errors (lake/typed_tables.py; same txn id, so written once; never blocks the tier)
    mark_tiered; then delete tiered segments through the store (when no broker holds it)
    leftovers: delete the staged files no commit took, of this run and of dead runs (leftovers.py)

Several brokers, one lake.  Every row carries the broker name of the store it came from (``broker_name``, the
first partition column of ``messages``, a column of ``segments``; :mod:`lake.broker_names` says
where the name comes from).  Two brokers' segments have the same 20-digit names and overlapping CommitLog
offsets, so everything a run reads back from the lake is keyed by (broker, segment): the verify reads only its
broker's partition, a resumed commit is found by its broker and segment, and the segments table's rows by store.
Rows another store already committed under the same broker name are refused before the commit, and, for a
store that committed between that check and this run's commit, right after it (the commit then leaves again).

Idempotency.  The app id is ``mqlake-tier:<store id>`` (``storeId`` of the store's mqlake.json) and the
version is the largest base offset in the commit.  Segments are claimed oldest first and committed in
base-offset order, so every segment with a base offset at or below the recorded version is already in the
table: a re-run never stages it again, it only verifies it.  A segment that failed its checks is quarantined
before the commit, so a later commit never skips over a segment that still has to be tiered.
lake.commit_files checks the recorded version again just before committing; delta-rs refuses a concurrent
commit with the same app id.

Crash safety.  Nothing is deleted until a segment is ``tiered``, and ``tiered`` is set only after the
committed rows were read back and matched.  Files staged by a run that died before its commit are in its
own ``tier-<run>`` directory, never in the log; the next run deletes them (its lease tells a dead run from a
live one, leftovers.py); a claim held by a dead process is taken over by the next run.
``MQLAKE_TIER_CRASH_AT=before_commit|after_upload|after_commit|after_verify`` (after_upload: a lake on S3 only)
SIGKILLs the job at that step (for the tests).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import mmap
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from expectations.rules import MESSAGES, checked_messages, rules_for
from expectations.runner import QualityReport, validate, write_report
from lake import broker_names, objectstore, tables, typed, typed_tables
from lake import delta as lk
from lake.reports import report_path
from lake.schema import MESSAGES_SCHEMA, SEGMENTS_SCHEMA
from pipelines import job_progress, spark_tables
from pipelines.compaction import checks, leftovers, staging
from pipelines.compaction.checks import QueueRange, RowsDigest, TieredSegment
from pipelines.compaction.deletion import delete_tiered
from pipelines.segment_reader import SegmentFacts
from store import identity as store_identity
from store.checkpoint import StoreLock, StoreLockedError
from store.config import MessageStoreConfig
from store.dispatchers import count_records
from store.format import units
from store.retention import SegmentEntry, SegmentManifest, SegmentState, claimer_id

log = logging.getLogger(__name__)

CRASH_ENV = "MQLAKE_TIER_CRASH_AT"
CRASH_POINTS = ("before_commit", "after_upload", "after_commit", "after_verify")


def _crash_point(step: str) -> None:
    if os.environ.get(CRASH_ENV) == step:
        log.warning("%s=%s: killing the tiering job", CRASH_ENV, step)
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class SegmentOutcome:
    segment: str
    base_offset: int
    state: str  # tiered | quarantined | pending (claim kept for the next run)
    reason: str = ""
    messages_version: int | None = None
    rows: int | None = None


@dataclass
class TierReport:
    run_id: str
    store_id: str
    started_at: datetime
    segments: list[SegmentOutcome] = field(default_factory=list)
    messages_version: int | None = None
    deleted: list[int] | None = None  # None: a broker holds the store; it deletes in its clean pass
    delete_error: str | None = None
    phases: dict[str, float] = field(default_factory=dict)
    quality: QualityReport | None = None
    report_path: str | None = None
    broker_name: str = ""
    broker_cluster_name: str | None = None  # as the store's mqlake.json names it (None: it names none)
    leftovers_removed: int = 0  # staged files never committed, of this run and of dead ones, deleted
    typed: list[dict[str, Any]] = field(default_factory=list)  # per topic with a declared schema: rows, errors

    def by_state(self, state: str) -> list[SegmentOutcome]:
        return [s for s in self.segments if s.state == state]

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "store_id": self.store_id,
            "broker_name": self.broker_name,
            "broker_cluster_name": self.broker_cluster_name,
            "started_at": self.started_at.isoformat(),
            "messages_version": self.messages_version,
            "segments": [vars(s) for s in self.segments],
            "deleted": self.deleted,
            "leftovers_removed": self.leftovers_removed,
            "typed": self.typed,
            "delete_error": self.delete_error,
            "phases_s": {k: round(v, 3) for k, v in self.phases.items()},
            "quality": self.quality.to_json() if self.quality else None,
        }


def _phase_timer(out: dict[str, float]):
    @contextlib.contextmanager
    def phase(name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            out[name] = out.get(name, 0.0) + time.perf_counter() - t0

    return phase


def _new_run_id() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:8]


def _older_sealed(entries: list[SegmentEntry], file_reserved_time: float) -> list[int]:
    """Sealed segments whose last message is older than ``file_reserved_time`` hours."""
    cutoff_ms = (time.time() - file_reserved_time * 3600) * 1000
    return [
        e.base_offset
        for e in entries
        if e.state == SegmentState.SEALED and e.last_store_time is not None and e.last_store_time <= cutoff_ms
    ]


def _list_closed_segments(store_dir: Path, manifest: SegmentManifest) -> None:
    """Record the CommitLog files of a store that has no segment manifest and no broker holding it, as a broker's
    start does: a store Apache RocketMQ's broker wrote, whose sealed segments are tiered like any other.

    A store with a manifest is left to it: mqlake's broker keeps it current, and only the broker knows which file
    is its active segment (the one after it may be preallocated already)."""
    if manifest.entries():
        return
    files = sorted(p for p in (store_dir / "commitlog").iterdir() if units.is_offset_file_name(p.name))
    if not files:
        return
    try:
        lock = StoreLock(store_dir)
    except StoreLockedError:
        return
    try:
        stats = {}
        for path in files[:-1]:  # sealed: counted, as the broker counts a segment it sealed
            if path.stat().st_size == 0:
                continue
            with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                c = count_records(mm, len(mm))
            if c.complete:
                stats[int(path.name)] = (c.count, c.first_store_time, c.last_store_time)
        manifest.sync_files([(int(p.name), p.stat().st_size) for p in files], stats)
    finally:
        lock.release()


def _claim(manifest: SegmentManifest, owner: str, file_reserved_time: float | None, limit: int | None):
    if file_reserved_time is not None and file_reserved_time > 0:
        # The store expires by its own fileReservedTime; a shorter one given to the job expires more now.
        old = _older_sealed(manifest.entries(), file_reserved_time)
        if old:
            manifest.expire(old)
    return manifest.claim(owner, treat_sealed_as_expired=file_reserved_time == 0, limit=limit)


def due_segments(store_dir: Path | str, file_reserved_time: float | None = None) -> list[SegmentEntry]:
    """What a run with this ``file_reserved_time`` would claim now, read only: expired segments, claims of
    unfinished runs, and sealed segments older than ``file_reserved_time`` hours (0: every sealed one)."""
    entries = SegmentManifest(Path(store_dir)).entries()
    if file_reserved_time == 0:
        sealed = {e.base_offset for e in entries if e.state == SegmentState.SEALED}
    else:
        sealed = set(_older_sealed(entries, file_reserved_time)) if file_reserved_time else set()
    due = (SegmentState.EXPIRED, SegmentState.TIERING)
    return [e for e in entries if e.state in due or e.base_offset in sealed]


def _tiered_history(segments_uri: str, sid: str) -> list[TieredSegment]:

    if not lk.is_table(segments_uri):
        return []
    dt = lk.open_table(segments_uri)
    rows = dt.to_pyarrow_table(columns=["store_id", "base_offset", "file_size", "queue_ranges"]).to_pylist()
    return [
        TieredSegment(
            r["base_offset"],
            r["file_size"],
            {(q["topic"], q["queue_id"]): QueueRange(q["first_offset"], q["last_offset"], q["count"])
             for q in r["queue_ranges"] or []},
        )  # fmt: skip
        for r in rows
        if r["store_id"] == sid
    ]


def _files_holding(actions: pa.Table, lo: int, hi: int) -> list[checks.DataFile]:
    """The files of a snapshot's add actions that may hold CommitLog offsets in ``[lo, hi)`` (by their stats)."""
    cols = actions.to_pydict()
    prefix = "partition."
    parts = [c for c in cols if c.startswith(prefix)]
    out = []
    for i, path in enumerate(cols["path"]):
        a = (cols.get("min.commitlog_offset") or [None] * (i + 1))[i]
        b = (cols.get("max.commitlog_offset") or [None] * (i + 1))[i]
        if (a is None or a < hi) and (b is None or b >= lo):
            out.append(checks.DataFile(path, {c.removeprefix(prefix): cols[c][i] for c in parts}))
    return out


def _commit_version_of(messages_uri: str, broker_name: str, segment: str) -> int | None:
    """The table version whose commit added ``broker_name``'s ``segment`` (from the commit metadata the job
    writes; a commit from before brokers were recorded names none, and counts as the broker's own)."""

    for commit in lk.open_table(messages_uri).history():
        broker = commit.get("mqlake.tier.broker")
        if (broker is None or broker == broker_name) and segment in str(
            commit.get("mqlake.tier.segments", "")
        ).split(","):
            return commit["version"]
    return None


class TierJob:
    def __init__(
        self,
        store_dir: Path,
        lake: Path | str,
        *,
        spark=None,
        master: str | None = None,
        conf: dict[str, str] | None = None,
        file_reserved_time: float | None = None,
        max_segments: int | None = None,
        report: Path | None = None,
        run_id: str | None = None,
        store_config: MessageStoreConfig | None = None,
        broker_name: str | None = None,
    ) -> None:
        """``broker_name``: the broker group whose store this is, when the store does not name it (None: the
        name the store records, else the one it was tiered under before, else the broker's default; a name that
        contradicts the store's is refused; see :func:`lake.broker_names.resolve`)."""
        self.store_dir = Path(store_dir)
        self.lake = objectstore.lake_location(lake)
        self.remote = objectstore.is_remote(self.lake)
        self._spark = spark
        self.master, self.conf = master, conf
        self.file_reserved_time = file_reserved_time
        self.max_segments = max_segments
        self.store_config = store_config
        self.run_id = run_id or _new_run_id()
        # a lake on S3 keeps the run reports beside the staged files, on local disk (docs/scaling.md)
        self.report_path = Path(report) if report else report_path(self.lake, "tier", self.run_id)
        self.owner = claimer_id(self.run_id)
        self.manifest = SegmentManifest(self.store_dir)
        self.identity = store_identity.ensure(self.store_dir)
        self.store_id = self.identity.store_id
        self.app_id = f"mqlake-tier:{self.store_id}"
        self.messages_uri = tables.table_uri(self.lake, tables.MESSAGES)
        self.segments_uri = tables.table_uri(self.lake, tables.SEGMENTS)
        self.quality_uri = tables.table_uri(self.lake, tables.QUALITY_RESULTS)
        # Spark tasks write the staged parquet here: under the messages table itself for a local lake (a
        # commit then adds it in place), in a local mirror of it for a lake on S3 (uploaded before the commit)
        self.staging_root = (
            objectstore.local_staging_root() / f"{self.store_id}-{self.run_id}" / tables.MESSAGES
            if self.remote else Path(self.messages_uri)
        )  # fmt: skip
        self.broker_name = broker_names.resolve(self.lake, self.store_dir, self.identity, broker_name)

    @property
    def spark(self):
        if self._spark is None:
            from pipelines.executor_access import check_executors_see
            from pipelines.spark import get_spark

            self._spark = get_spark(self.master, app_name="mqlake-tier", conf=self.conf)
            # on a cluster the executors read the segments and write the staged files themselves
            staged = self.staging_root.parent if self.remote else Path(self.lake)
            if self.remote:
                staged.mkdir(parents=True, exist_ok=True)
            check_executors_see(self._spark, read=[self.store_dir / "commitlog"], write=[staged])
        return self._spark

    # =================================================================================================
    def run(self) -> TierReport:
        report = TierReport(self.run_id, self.store_id, datetime.now(UTC), broker_name=self.broker_name,
                            broker_cluster_name=self.identity.broker_cluster_name)  # fmt: skip
        phase = _phase_timer(report.phases)
        if not self.remote:
            Path(self.lake).mkdir(parents=True, exist_ok=True)
        with phase("claim"):
            _list_closed_segments(self.store_dir, self.manifest)
            claimed = _claim(self.manifest, self.owner, self.file_reserved_time, self.max_segments)
        job_progress.set_total(sum(e.size for e in claimed), "bytes")
        entries = {e.base_offset: e for e in claimed}
        outcomes: dict[int, SegmentOutcome] = {}
        if claimed:
            log.info("run %s claimed %d segments: %s", self.run_id, len(claimed), [e.file_name for e in claimed])
            # Great Expectations takes seconds to import; do it while Spark stages (the driver thread mostly
            # waits on the JVM then).  Python's import lock makes the later import wait for this one.
            threading.Thread(target=importlib.import_module, args=("great_expectations",), daemon=True).start()
            # the run's staging directory carries its lease (leftovers.py): in the lake, or in the local mirror of
            # a lake on S3, where the lease names the table the run uploads to
            lease = leftovers.RunLease(self.staging_root, self.run_id, self.messages_uri if self.remote else None)
            try:
                try:
                    lease.acquire()
                    self._tier_claimed(claimed, entries, outcomes, report, phase)
                finally:
                    lease.release()
            except Exception:
                # Give back what is not finished; a committed one is only verified when claimed again,
                # because its base offset is at or below the recorded txn version.
                for e in claimed:
                    if e.base_offset not in outcomes or outcomes[e.base_offset].state == "pending":
                        self.manifest.release(e.base_offset, self.owner)
                raise
        report.segments = [outcomes[b] for b in sorted(outcomes)]
        with phase("leftovers"):  # this run's files left out of its commit, and those of dead runs
            if self.remote:  # and the local staging of this run and of dead ones
                try:
                    report.leftovers_removed = len(leftovers.remove_dead_runs_uploads(self.messages_uri))
                except objectstore.ObjectStoreError as e:  # the tier is complete; the next run cleans up
                    log.warning("cleaning up dead runs' uploads failed: %s", e)
            else:
                report.leftovers_removed = len(leftovers.remove_dead_runs_files(self.staging_root))
        with phase("delete"):
            try:
                report.deleted = delete_tiered(self.store_dir, self.store_config)
            except Exception as e:  # the tier is complete either way; the store's own clean pass retries
                log.error("deleting tiered segments failed: %s", e)
                report.delete_error = f"{type(e).__name__}: {e}"
        report.report_path = str(write_report(self.report_path, report.to_json()))
        return report

    def _tier_claimed(self, claimed, entries, outcomes, report, phase) -> None:
        from pipelines.segment_reader import scan_segment

        with phase("scan"):
            facts = {}
            for e in claimed:
                path = self.store_dir / "commitlog" / e.file_name
                if not path.exists():
                    outcomes[e.base_offset] = self._quarantine(e, f"{path} is missing")
                    continue
                # the bodies' CRCs are checked where the rows are staged (the crc_matches rule), not twice
                facts[e.base_offset] = scan_segment(path, check_crc=False)
        recorded = lk.transaction_version(self.messages_uri, self.app_id)
        recorded = -1 if recorded is None else recorded
        committed_earlier = [b for b in facts if b <= recorded]
        todo = sorted(b for b in facts if b > recorded)
        expected: dict[str, RowsDigest] = {}
        committed_version = None
        if todo:
            committed_version = self._stage_validate_commit(
                [facts[b] for b in todo], entries, outcomes, expected, report, phase
            )
        _crash_point("after_commit")
        with phase("verify"):
            verify = [b for b in committed_earlier + todo if b not in outcomes]
            verified = self._verify(verify, facts, entries, expected, committed_version, outcomes)
        failed = [b for b in verify if b not in verified]
        if failed:
            with phase("revert"):
                self._revert(failed, facts, entries)
        with phase("segments_table"):
            self._write_segments_rows(verified, facts, outcomes, expected)
        with phase("typed"):
            report.typed = self._write_typed(verified, entries, expected)
        _crash_point("after_verify")
        for b in verified:
            self.manifest.mark_tiered(b, self.owner, note=f"run {self.run_id}")
            outcomes[b].state = "tiered"

    # =================================================================================================
    def _quarantine(self, e: SegmentEntry, reason: str) -> SegmentOutcome:
        log.error("quarantining segment %s: %s", e.file_name, reason)
        self.manifest.mark_quarantined(e.base_offset, self.owner, reason)
        return SegmentOutcome(e.file_name, e.base_offset, "quarantined", reason)

    def _source(self, bases: list[int]):
        """The segments' records, decoded by the commitlog Spark source."""
        return (
            self.spark.read.format("commitlog")
            .option("segments", ",".join(str(b) for b in bases))
            .load(str(self.store_dir))
        )

    def _stage(self, batch: list[SegmentFacts], bases: list[int], entries) -> staging.Staged:
        """Decode, check and write ``bases`` as parquet under the messages table root, invisible to readers
        until committed (pipelines/compaction/staging.py)."""
        times = {b: (entries[b].first_store_time, entries[b].last_store_time) for b in bases if b in entries}
        directory = leftovers.run_dir(self.staging_root, self.run_id)
        return staging.stage(self.spark, self.store_dir, bases, directory, times, broker_name=self.broker_name)

    def _stage_validate_commit(self, batch, entries, outcomes, expected, report, phase) -> int | None:

        bases = [f.base_offset for f in batch]
        clean = [f.base_offset for f in batch if checks.is_clean(f)]
        with phase("stage"):
            staged = self._stage(batch, clean, entries) if clean else None
        with phase("validate"):
            digests = staged.digests if staged else {}
            # The messages rules were counted while staging; only if one broke are the staged rows read back,
            # to count it per segment and sample the breaking rows.
            counted, messages = None, None
            if staged is None or not any(staged.violations.values()):
                counted = {MESSAGES: {(f.segment, r.name): 0 for f in batch for r in rules_for(MESSAGES)}}
            else:
                messages = checked_messages(staging.staged_frame(self.spark, staged))
            history = _tiered_history(self.segments_uri, self.store_id)
            frames = checks.expectation_frames(
                messages,
                checks.segment_check_table(batch, entries, digests),
                checks.queue_check_table(batch, digests, history),
            )
            quality = validate(self.spark, frames, [f.segment for f in batch], self.run_id, counted=counted)
            report.quality = quality
            # results are data even if this run dies later: append them before anything is committed
            lk.append_arrow(
                self.quality_uri, quality.to_arrow(), app_id=f"mqlake-quality:{self.store_id}",
                version=time.time_ns() // 1000,
            )  # fmt: skip
        failures = quality.failures()
        passing = [b for b in bases if entries[b].file_name not in failures]
        for b in bases:
            if b not in passing:
                names = ", ".join(failures[entries[b].file_name])
                outcomes[b] = self._quarantine(entries[b], f"failed expectations: {names} (run {self.run_id})")
        if not passing or staged is None:
            return None
        expected.update({entries[b].file_name: digests[entries[b].file_name] for b in passing})
        with phase("other_stores"):
            queues: dict[tuple[str, int], tuple[int, int]] = {}
            for b in passing:
                for key, r in digests[entries[b].file_name].queues.items():
                    lo, hi = queues.get(key, (r.first_offset, r.last_offset))
                    queues[key] = (min(lo, r.first_offset), max(hi, r.last_offset))
            checked = broker_names.refuse_rows_of_another_store(
                self.lake, self.store_dir, self.identity, self.broker_name, queues
            )
        _crash_point("before_commit")
        with phase("commit"):
            # each staged file holds one segment's rows: a quarantined segment's files are left out
            files = [Path(f) for b in passing for f in staged.files.get(entries[b].file_name, [])]
            adds = lk.add_actions(self.staging_root, files, tables.MESSAGES_PARTITION_BY)
            if self.remote:  # the same relative paths under the table on S3; nothing is visible until the commit
                objectstore.upload(files, self.staging_root, self.messages_uri)
                _crash_point("after_upload")
            version = lk.commit_files(
                self.messages_uri,
                adds,
                schema=MESSAGES_SCHEMA,
                partition_by=tables.MESSAGES_PARTITION_BY,
                app_id=self.app_id,
                version=max(passing),
                metadata={
                    "mqlake.tier.run": self.run_id,
                    "mqlake.tier.broker": self.broker_name,
                    "mqlake.tier.store": self.store_id,
                    "mqlake.tier.segments": ",".join(entries[b].file_name for b in passing),
                },
            )
        if version is not None and version - 1 > checked:
            with phase("other_stores"):
                self._refuse_a_racing_store(version, queues, adds, passing, entries, outcomes)
        report.messages_version = version
        return version

    def _refuse_a_racing_store(self, version, queues, adds, passing, entries, outcomes) -> None:
        """Another store under this broker name may have committed the same rows between this run's check and
        its commit (both checks saw neither).  The log orders the two commits: the check is asked again at the
        version just before this run's, and if it finds that store's rows, this run's files leave the table
        again (by file: the rows match the other store's in every column a delete could name), its segments are
        quarantined and the run is refused.  The earlier commit stays, so one of two racing stores always wins."""

        try:
            broker_names.refuse_rows_of_another_store(
                self.lake, self.store_dir, self.identity, self.broker_name, queues, version=version - 1,
                withdrawn=version,
            )  # fmt: skip
        except broker_names.BrokerNameError as e:
            lk.remove_files(
                self.messages_uri, adds, schema=MESSAGES_SCHEMA, partition_by=tables.MESSAGES_PARTITION_BY,
                metadata={"mqlake.tier.run": self.run_id, "mqlake.tier.broker": self.broker_name,
                          "mqlake.tier.store": self.store_id, "mqlake.tier.withdrawn": version},
            )  # fmt: skip
            for b in passing:
                outcomes[b] = self._quarantine(entries[b], str(e))
            raise

    def _verify(self, bases, facts, entries, expected, committed_version, outcomes) -> list[int]:
        """Match the committed snapshot's rows of each segment against what was validated; returns the
        base offsets that match."""

        if not bases:
            return []
        names = {entries[b].file_name for b in bases}
        lo = min(bases)
        hi = max(facts[b].base_offset + facts[b].file_size for b in bases)
        if self.remote:  # Spark reads the snapshot through Delta and S3A
            from pyspark.sql import functions as F

            rows = spark_tables.read_table(self.spark, self.messages_uri).where(
                (F.col(tables.BROKER_NAME) == self.broker_name)
                & F.col("commitlog_offset").between(lo, hi - 1)
                & F.col("segment").isin(sorted(names))
            )
            found = checks.rows_digest(rows)
        else:  # each committed file read and digested where it is read: no body moves into the JVM
            files = [f for f in _files_holding(lk.snapshot_files(self.messages_uri), lo, hi)
                     if f.partition_values.get(tables.BROKER_NAME) == self.broker_name]  # this broker's files only
            found = checks.files_digest(self.spark, files, MESSAGES_SCHEMA, names, (lo, hi))
        resumed = [b for b in bases if entries[b].file_name not in expected]
        if resumed:
            # Committed by a run that died before verifying: decode the files again as the reference.
            expected.update(checks.rows_digest(self._source(resumed)))
        verified = []
        for b in bases:
            name = entries[b].file_name
            problems = checks.mismatches(expected.get(name) or RowsDigest(0, 0, 0, None, None, {}), found.get(name))
            if problems:
                outcomes[b] = self._quarantine(entries[b], f"committed rows do not match: {'; '.join(problems)}")
                continue
            version = committed_version
            if b in resumed:
                version = _commit_version_of(self.messages_uri, self.broker_name, name)
            outcomes[b] = SegmentOutcome(name, b, "pending", "", version, found[name].count)
            verified.append(b)
        return verified

    def _revert(self, bases: list[int], facts, entries) -> None:
        """Take the committed rows of segments that failed the verify out of the table again (one delete
        commit), so no unverified row stays visible; the segments stay quarantined in the store.  The rows are
        found by broker, segment and CommitLog range: each staged file holds one segment's rows, so the commit's
        files of these segments leave whole, and the broker's other segments and stores stay untouched."""

        names = [entries[b].file_name for b in bases]
        ranges = " OR ".join(
            f"(segment = {lk.sql_text(entries[b].file_name)} AND commitlog_offset >= {b}"
            f" AND commitlog_offset < {b + facts[b].file_size})"
            for b in bases
        )
        done = lk.delete_rows(
            self.messages_uri,
            f"{tables.BROKER_NAME} = {lk.sql_text(self.broker_name)} AND ({ranges})",
            metadata={"mqlake.tier.run": self.run_id, "mqlake.tier.broker": self.broker_name,
                      "mqlake.tier.store": self.store_id, "mqlake.tier.reverted": ",".join(names)},
        )  # fmt: skip
        log.error("took the unverified rows of %s out of %s again: %s", names, self.messages_uri, done)

    def _write_typed(self, verified: list[int], entries, digests: dict[str, RowsDigest]) -> list[dict[str, Any]]:
        """Decode the verified segments' rows of each topic with a declared schema into its typed table and
        ``decode_errors`` (lake/typed_tables.py).  Before the segments are marked tiered, so a run that dies
        meanwhile is finished by the next one; a topic whose rows cannot be written is logged and reported, and
        never holds the tier back (``mqlake lake schema rebuild`` writes them later)."""
        try:
            declared = set(typed.declared_topics(self.lake))
        except Exception as e:  # noqa: BLE001 - the typed tables never block the tier
            log.error("listing the declared schemas of %s failed: %s", self.lake, e)
            return [{"topic": None, "error": f"{type(e).__name__}: {e}"}]
        by_topic: dict[str, dict[str, int]] = {}
        for b in verified:
            name = entries[b].file_name
            for topic, _queue in digests[name].queues:
                if topic in declared:
                    by_topic.setdefault(topic, {})[name] = b
        out = []
        for topic, segments in sorted(by_topic.items()):
            try:
                done = typed_tables.add_tiered(
                    self.lake, topic, store_id=self.store_id, broker_name=self.broker_name, segments=segments
                )
            except Exception as e:  # noqa: BLE001 - the typed tables never block the tier
                log.error("writing the typed rows of topic %s failed (mqlake lake schema rebuild %s writes them "
                          "later): %s", topic, topic, e)  # fmt: skip
                done = typed_tables.TypedOutcome(topic, error=f"{type(e).__name__}: {e}")
            if done is not None:
                out.append(vars(done))
        return out

    def _write_segments_rows(self, verified: list[int], facts, outcomes, digests: dict[str, RowsDigest]) -> None:

        recorded = lk.transaction_version(self.segments_uri, self.app_id)
        todo = [b for b in verified if recorded is None or b > recorded]
        if not todo:
            return
        now = datetime.now(UTC)
        rows = []
        for b in todo:
            f, o = facts[b], outcomes[b]
            digest = digests[f.segment]
            queues = digest.queues
            rows.append(
                {
                    "store_id": self.store_id,
                    tables.BROKER_NAME: self.broker_name,
                    "segment": f.segment,
                    "base_offset": b,
                    "file_size": f.file_size,
                    "record_count": f.record_count,
                    "valid_bytes": f.valid_bytes,
                    "min_commitlog_offset": f.min_commitlog_offset,
                    "max_commitlog_offset": f.max_commitlog_offset,
                    "min_queue_offset": min((q.first_offset for q in queues.values()), default=None),
                    "max_queue_offset": max((q.last_offset for q in queues.values()), default=None),
                    "min_store_timestamp": f.first_store_timestamp,
                    "max_store_timestamp": f.last_store_timestamp,
                    "file_crc32c": checks.file_crc32c(Path(f.path)),
                    "body_crc_sum": digest.crc_sum,
                    "queue_ranges": [
                        {"topic": t, "queue_id": q, "first_offset": r.first_offset, "last_offset": r.last_offset,
                         "count": r.count}
                        for (t, q), r in sorted(queues.items())
                    ],  # fmt: skip
                    "run_id": self.run_id,
                    "messages_version": o.messages_version if o.messages_version is not None else -1,
                    "tiered_at": now,
                }
            )
        lk.append_arrow(
            self.segments_uri,
            pa.Table.from_pylist(rows, schema=SEGMENTS_SCHEMA),
            app_id=self.app_id,
            version=max(todo),
        )


def tier(store_dir: Path, lake: Path | str, **kwargs) -> TierReport:
    """Run the tiering job once (see :class:`TierJob` for the keyword arguments)."""
    return TierJob(store_dir, lake, **kwargs).run()

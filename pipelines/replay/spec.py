"""What a replay is asked to do: the parsed, validated options and their fingerprint.

No pyspark here: the CLI validates its input before a Spark session exists, so a typo fails in
milliseconds rather than after the JVM has started.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from lake import objectstore
from lake.tables import MESSAGES, table_uri
from pipelines import history
from store.errors import MQLakeError

QUEUE_MAPS = ("preserve", "hash")
_REPLAY_ID = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
_EPOCH_MS = re.compile(r"^\d{10,}$")


class ReplaySpecError(MQLakeError, ValueError):
    """Options that cannot describe a replay; the message names the option."""


def parse_time(text: str | None, option: str) -> int | None:
    """``--from`` / ``--to``: epoch milliseconds, or ISO-8601 (a date, or date and time; no zone means UTC)."""
    if text is None or not text.strip():
        return None
    text = text.strip()
    if _EPOCH_MS.match(text):
        return int(text)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ReplaySpecError(
            f"{option} {text!r}: use epoch milliseconds or ISO-8601 such as 2026-11-22T06:00:00Z"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def parse_tags(text: str | None) -> list[str] | None:
    """A RocketMQ tag expression ``A||B``; None or ``*`` selects every tag."""
    if text is None or text.strip() in ("", "*"):
        return None
    tags = sorted({t.strip() for t in text.split("||") if t.strip()})
    if not tags:
        raise ReplaySpecError(f"--tags {text!r} names no tag")
    return tags


def parse_list(text: str | None, option: str) -> list[str] | None:
    if text is None or not text.strip():
        return None
    items = sorted({t.strip() for t in text.split(",") if t.strip()})
    if not items:
        raise ReplaySpecError(f"{option} {text!r} names nothing")
    return items


def parse_broker_stores(items: list[str] | None) -> tuple[tuple[str, Path], ...]:
    """``--broker-store NAME=PATH`` (repeatable): each live store with the brokerName of its broker."""
    try:
        return history.parse_broker_stores(items)
    except history.LiveStoreError as e:
        raise ReplaySpecError(str(e)) from None


def new_replay_id() -> str:
    # no "replay-" prefix: the run report is already named replay-<id>-<run>.json (broker/lake/reports.py)
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]


@dataclass(frozen=True)
class ReplaySpec:
    """One replay.  The fields above ``rate`` select and shape the messages; a resumed replay (same
    ``replay_id``) must repeat them exactly (see :meth:`fingerprint`).  ``rate`` and the rest may change."""

    lake: Path | str
    source_topics: tuple[str, ...]
    target_topic: str
    store_dir: Path | None = None
    from_ms: int | None = None  # store_timestamp >= from_ms
    to_ms: int | None = None  # store_timestamp < to_ms
    where: str | None = None
    tags: tuple[str, ...] | None = None
    keys: tuple[str, ...] | None = None
    queue_map: str = "preserve"
    preserve_timestamps: bool = False
    rate: float | None = None  # messages per second over the whole job; None: unthrottled
    namesrv: str = ""
    dry_run: bool = False
    replay_id: str = field(default_factory=new_replay_id)
    batch_size: int = 128  # messages per SEND_BATCH_MESSAGE
    commit_every: int = 5000  # progress commit after this many acknowledged messages per task ...
    commit_seconds: float = 2.0  # ... or this many seconds, whichever comes first
    parallelism: int | None = None  # Spark tasks sending at once (default: the session's default parallelism)
    broker_name: str | None = None  # the broker of store_dir (None: the broker's default name, broker-a)
    broker_stores: tuple[tuple[str, Path], ...] = ()  # more live stores: (brokerName, store root) each

    def store_broker(self) -> str:
        """The broker name of the live rows read from ``store_dir``."""
        from lake.broker_names import default_broker_name

        return self.broker_name or default_broker_name()

    def live_stores(self) -> list[tuple[str, Path]]:
        """Every live store to read, with its broker: ``store_dir`` (as ``store_broker()``) and ``broker_stores``."""
        single = [(self.store_broker(), Path(self.store_dir))] if self.store_dir is not None else []
        return single + [(name, Path(path)) for name, path in self.broker_stores]

    def lake_messages(self) -> str | None:
        """The URI of the lake's ``messages`` table to read (None: the lake has none yet), once the lake's broker
        layout is checked: every broker's history is read, told apart by broker_name."""
        from lake import delta as lk
        from lake.broker_names import BrokerNameError, check_layout

        uri = table_uri(self.lake, MESSAGES)
        if not lk.is_table(uri):
            return None
        try:
            check_layout(self.lake)
        except BrokerNameError as e:
            raise ReplaySpecError(str(e)) from None
        return uri

    def __post_init__(self) -> None:
        if not self.source_topics:
            raise ReplaySpecError("--source-topic names no topic")
        if self.target_topic in self.source_topics:
            raise ReplaySpecError(f"--target-topic {self.target_topic} is also a source topic: it would replay itself")
        if self.queue_map not in QUEUE_MAPS:
            raise ReplaySpecError(f"--queue-map {self.queue_map!r}: use one of {', '.join(QUEUE_MAPS)}")
        if self.from_ms is not None and self.to_ms is not None and self.from_ms >= self.to_ms:
            raise ReplaySpecError(f"--from ({self.from_ms}) must be before --to ({self.to_ms})")
        if self.rate is not None and self.rate <= 0:
            raise ReplaySpecError(f"--rate {self.rate} must be positive")
        if not _REPLAY_ID.match(self.replay_id):
            raise ReplaySpecError(f"--replay-id {self.replay_id!r}: 1-100 characters of [A-Za-z0-9_-]")
        if not self.dry_run and not self.namesrv:
            raise ReplaySpecError("--namesrv is required unless --dry-run")
        if self.broker_name is not None and self.store_dir is None:
            raise ReplaySpecError("--broker-name names the --store-dir's broker: give --store-dir, or --broker-store "
                                  f"{self.broker_name}=STORE_DIR")  # fmt: skip
        stores = self.live_stores()
        if not stores and not objectstore.exists(table_uri(self.lake, MESSAGES)):
            raise ReplaySpecError(
                f"nothing to read: {self.lake} has no messages table and no --store-dir or --broker-store was given"
            )
        try:
            history.check_stores(stores)
        except history.LiveStoreError as e:
            raise ReplaySpecError(str(e)) from None
        if self.batch_size < 1 or self.commit_every < 1 or self.commit_seconds <= 0:
            raise ReplaySpecError("batch size, commit interval and commit seconds must be positive")

    def selection(self) -> dict:
        """The options that decide which messages go where, in a stable JSON-able form."""
        return {
            "source_topics": sorted(self.source_topics), "target_topic": self.target_topic, "from_ms": self.from_ms,
            "to_ms": self.to_ms, "where": self.where, "tags": list(self.tags) if self.tags else None,
            "keys": list(self.keys) if self.keys else None, "queue_map": self.queue_map,
            "preserve_timestamps": self.preserve_timestamps,
        }  # fmt: skip

    def fingerprint(self) -> str:
        """Progress recorded under a replay id is only valid for the same selection: a resumed run with other
        filters would skip (or re-send) by offsets that meant something else."""
        text = json.dumps(self.selection(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    def to_json(self) -> dict:
        d = asdict(self)
        d["lake"], d["store_dir"] = str(self.lake), str(self.store_dir) if self.store_dir else None
        d["broker_stores"] = [[name, str(path)] for name, path in self.broker_stores]
        return d

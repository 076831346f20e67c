"""RocketMQ's broker config JSON files under ``<storeRoot>/config/``: lenient reads, crash-safe writes.

fastjson persists ``Map<Integer/Long, ...>`` keys unquoted (``{"offsetTable":{"t@g":{0:123}}}``), so reads
quote bare integer keys before ``json.loads``; writes emit standard JSON, which fastjson also accepts.
Writes follow 4.x ``MixAll.string2File``: the new content to a temp file first, then the old file -> ``<file>.bak``
and the temp file renamed into place, so a full disk fails the write and loses nothing.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiofiles
import aiofiles.os
import aiofiles.tempfile

from store.errors import MQLakeError

log = logging.getLogger(__name__)

TOPICS = "topics.json"
CONSUMER_OFFSET = "consumerOffset.json"
SUBSCRIPTION_GROUP = "subscriptionGroup.json"
DELAY_OFFSET = "delayOffset.json"
DELETED_TOPICS = "deletedTopics.json"  # mqlake's own: RocketMQ keeps no record of a deletion
QUEUE_ENDS = "consumeQueueEnds.json"  # mqlake's own: where each ConsumeQueue ended, to notice one gone missing


class ConfigFileError(MQLakeError, ValueError):
    """A config file (and its ``.bak``) could not be read or has the wrong shape."""

    def __init__(self, path: str | os.PathLike[str], detail: str) -> None:
        self.path = str(path)
        self.detail = detail
        super().__init__(f"{self.path}: {detail}")


# A whole JSON string (skipped untouched) or a bare integer object key: `{` or `,`, digits, then `:`.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|([{,]\s*)(-?\d+)(?=\s*:)', re.DOTALL)


def _quote_int_keys(text: str) -> tuple[str, list[int]]:
    """Quote bare integer keys; also return where quotes were inserted (positions in the output)."""
    out: list[str] = []
    inserted: list[int] = []
    size = last = 0
    for m in _TOKEN.finditer(text):
        if m.group(2) is None:
            continue
        before = text[last : m.start(2)]
        out.append(before)
        size += len(before)
        inserted.append(size)
        out.append(f'"{m.group(2)}"')
        size += len(m.group(2)) + 2
        inserted.append(size - 1)
        last = m.end(2)
    out.append(text[last:])
    return "".join(out), inserted


def load_lenient_json(text: str, source: str = "<string>") -> Any:
    """Parse JSON that may contain fastjson's unquoted integer map keys; errors name ``source``."""
    fixed, inserted = _quote_int_keys(text)
    try:
        return json.loads(fixed)
    except json.JSONDecodeError as e:
        # Report the position in the text as written, not in the quoted copy.
        pos = e.pos - bisect.bisect_left(inserted, e.pos)
        line = text.count("\n", 0, pos) + 1
        col = pos - (text.rfind("\n", 0, pos) + 1) + 1
        raise ConfigFileError(source, f"{e.msg}: line {line} column {col} (char {pos})") from None


def _bak(path: Path) -> Path:
    return path.with_name(path.name + ".bak")


def _load_file(path: Path) -> dict[str, Any]:
    """Parse one file into a JSON object; ConfigFileError if missing, empty or corrupt."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigFileError(path, "missing") from None
    except OSError as e:
        raise ConfigFileError(path, f"unreadable: {e}") from None
    return _parse_file(path, raw)


def _parse_file(path: Path, raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigFileError(path, f"unreadable: {e}") from None
    if not text.strip():
        raise ConfigFileError(path, "empty")
    data = load_lenient_json(text, str(path))
    if not isinstance(data, dict):
        raise ConfigFileError(path, f"expected a JSON object, got {type(data).__name__}")
    return data


def read_config(path: Path) -> dict[str, Any] | None:
    """Load a config file, falling back to ``<file>.bak``; None if neither exists.

    Unlike RocketMQ (which then starts empty), a bad file without a usable backup raises
    ConfigFileError: silently resetting consumer offsets would redeliver or skip messages.
    """
    path = Path(path)
    bak = _bak(path)
    try:
        return _load_file(path)
    except ConfigFileError as main_err:
        if not path.exists() and not bak.exists():
            return None
        try:
            data = _load_file(bak)
        except ConfigFileError as bak_err:
            raise ConfigFileError(path, f"{main_err.detail}; backup {bak_err}") from None
        log.warning("config %s unusable (%s); loaded %s", path, main_err, bak)
        return data


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replaces_backup(path: Path, current: bytes | None) -> bool:
    """Whether the file about to be replaced (its bytes; None when unreadable) becomes ``<file>.bak``: yes, unless
    it is not a usable config file and a ``.bak`` already exists (a corrupt file must not replace a good backup)."""
    if current is not None:
        try:
            _parse_file(path, current)
            return True
        except ConfigFileError:
            pass
    return not _bak(path).exists()


def _read_current(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def replace_file(path: Path, payload: bytes, *, backup: bool = False) -> None:
    """Make ``payload`` the content of ``path`` crash-safely, and without ever losing the previous content.

    The new bytes go to a temp file beside it, are fsynced, and only then take the name (``MixAll.string2File``'s
    ``.tmp``): a write that fails (a full disk) leaves the previous file untouched and no temp file behind.  With
    ``backup`` the previous file becomes ``<file>.bak`` just before the rename (see ``_replaces_backup``).
    :func:`replace_file_async` is the same steps for the broker's event loop.
    """
    path = Path(path)
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        if backup and path.exists() and _replaces_backup(path, _read_current(path)):
            os.replace(path, _bak(path))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(directory)


_afsync = aiofiles.os.wrap(os.fsync)
_afsync_dir = aiofiles.os.wrap(_fsync_dir)


async def replace_file_async(path: Path, payload: bytes, *, backup: bool = False) -> None:
    """:func:`replace_file` from an event loop: each blocking step (write, fsync, rename) runs in aiofiles' thread
    pool, so a slow disk never stalls the loop; the steps and the crash-safety are the same."""
    path = Path(path)
    directory = path.parent
    await aiofiles.os.makedirs(directory, exist_ok=True)
    async with aiofiles.tempfile.NamedTemporaryFile(
        "wb", dir=directory, prefix=f".{path.name}.", suffix=".tmp", delete=False
    ) as f:
        tmp = str(f.name)
        try:
            await f.write(payload)
            await f.flush()
            await _afsync(f.fileno())
        except BaseException:
            await aiofiles.os.remove(tmp)
            raise
    try:
        if backup and await aiofiles.os.path.exists(path):
            try:
                async with aiofiles.open(path, "rb") as current:
                    raw: bytes | None = await current.read()
            except OSError:
                raw = None
            if _replaces_backup(path, raw):
                await aiofiles.os.replace(path, _bak(path))
        await aiofiles.os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            await aiofiles.os.remove(tmp)
        raise
    await _afsync_dir(directory)


def config_payload(data: Mapping[str, Any]) -> bytes:
    """A config file's bytes: pretty JSON, as every config file is written."""
    return (json.dumps(data, indent=4, ensure_ascii=False) + "\n").encode("utf-8")


def write_config(path: Path, data: Mapping[str, Any]) -> None:
    """Persist ``data`` as pretty JSON (:func:`replace_file`, the previous file kept as ``<file>.bak``)."""
    replace_file(path, config_payload(data), backup=True)


async def write_config_async(path: Path, data: Mapping[str, Any]) -> None:
    """:func:`write_config` from an event loop (:func:`replace_file_async`)."""
    await replace_file_async(path, config_payload(data), backup=True)


# --- the four files ---------------------------------------------------------------------------------


def _int_map(path: Path, value: Any, what: str) -> dict[int, int]:
    try:
        return {int(k): int(v) for k, v in (value or {}).items()}
    except (AttributeError, TypeError, ValueError) as e:
        raise ConfigFileError(path, f"bad {what}: {e}") from None


def load_consumer_offsets(config_dir: Path) -> dict[str, dict[int, int]]:
    """``consumerOffset.json`` offsetTable: ``{"topic@group": {queueId: offset}}`` (4.x and 5.x files)."""
    path = Path(config_dir) / CONSUMER_OFFSET
    table = (read_config(path) or {}).get("offsetTable") or {}
    if not isinstance(table, dict):
        raise ConfigFileError(path, "bad offsetTable: not an object")
    return {key: _int_map(path, queues, f"offsetTable[{key!r}]") for key, queues in table.items()}


def consumer_offsets_document(table: Mapping[str, Mapping[int, int]]) -> dict[str, Any]:
    """``consumerOffset.json``'s content in the 4.x shape (5.x reads it too)."""
    return {"offsetTable": {key: {str(q): int(o) for q, o in sorted(queues.items())} for key, queues in table.items()}}


def save_consumer_offsets(config_dir: Path, table: Mapping[str, Mapping[int, int]]) -> None:
    """Write ``consumerOffset.json``."""
    write_config(Path(config_dir) / CONSUMER_OFFSET, consumer_offsets_document(table))


def load_delay_offsets(config_dir: Path) -> dict[int, int]:
    """``delayOffset.json`` offsetTable: ``{delayLevel: next CQ offset}`` (levels are 1-based)."""
    path = Path(config_dir) / DELAY_OFFSET
    return _int_map(path, (read_config(path) or {}).get("offsetTable"), "offsetTable")


def delay_offsets_document(table: Mapping[int, int]) -> dict[str, Any]:
    """``delayOffset.json``'s content."""
    return {"offsetTable": {str(level): int(o) for level, o in sorted(table.items())}}


def save_delay_offsets(config_dir: Path, table: Mapping[int, int]) -> None:
    """Write ``delayOffset.json``."""
    write_config(Path(config_dir) / DELAY_OFFSET, delay_offsets_document(table))


def load_deleted_topics(config_dir: Path) -> dict[str, int]:
    """``deletedTopics.json``: ``{topic: CommitLog offset}``, the end of the log when each topic was deleted."""
    path = Path(config_dir) / DELETED_TOPICS
    table = (read_config(path) or {}).get("deletedTopics") or {}
    if not isinstance(table, dict):
        raise ConfigFileError(path, "bad deletedTopics: not an object")
    try:
        return {str(k): int(v) for k, v in table.items()}
    except (TypeError, ValueError) as e:
        raise ConfigFileError(path, f"bad deletedTopics: {e}") from None


def save_deleted_topics(config_dir: Path, table: Mapping[str, int]) -> None:
    """Write ``deletedTopics.json``."""
    write_config(Path(config_dir) / DELETED_TOPICS, {"deletedTopics": {k: int(v) for k, v in sorted(table.items())}})


def load_queue_ends(config_dir: Path) -> dict[tuple[str, int], int]:
    """``consumeQueueEnds.json``: ``{topic: {queueId: next queue offset}}`` as the store last recorded it."""
    path = Path(config_dir) / QUEUE_ENDS
    table = (read_config(path) or {}).get("queueEnds") or {}
    if not isinstance(table, dict):
        raise ConfigFileError(path, "bad queueEnds: not an object")
    return {(str(topic), q): end for topic, queues in table.items()
            for q, end in _int_map(path, queues, f"queueEnds[{topic!r}]").items()}  # fmt: skip


def save_queue_ends(config_dir: Path, ends: Mapping[tuple[str, int], int]) -> None:
    """Write ``consumeQueueEnds.json``."""
    table: dict[str, dict[str, int]] = {}
    for (topic, q), end in sorted(ends.items()):
        table.setdefault(topic, {})[str(q)] = int(end)
    write_config(Path(config_dir) / QUEUE_ENDS, {"queueEnds": table})


def next_data_version(previous: Mapping[str, Any] | None = None, state_version: int | None = None) -> dict[str, Any]:
    """RocketMQ ``DataVersion.nextVersion``: counter + 1, timestamp = now (ms); ``stateVersion`` set when given (a
    controller-mode broker's master epoch), other fields kept."""
    version = dict(previous or {})
    if state_version is not None:
        version["stateVersion"] = state_version
    version["counter"] = int(version.get("counter", 0)) + 1
    version["timestamp"] = int(time.time() * 1000)
    return version


def _load_versioned(config_dir: Path, name: str, table_key: str) -> dict[str, Any]:
    path = Path(config_dir) / name
    data = read_config(path) or {}
    for key in ("dataVersion", table_key):
        if not isinstance(data.setdefault(key, {}), dict):
            raise ConfigFileError(path, f"bad {key}: not an object")
    data["dataVersion"].setdefault("counter", 0)
    data["dataVersion"].setdefault("timestamp", 0)
    return data


def load_topics(config_dir: Path) -> dict[str, Any]:
    """``topics.json`` as ``{"dataVersion": {...}, "topicConfigTable": {name: config}}`` (empty if absent)."""
    return _load_versioned(config_dir, TOPICS, "topicConfigTable")


def topics_document(table: Mapping[str, Mapping[str, Any]], data_version: Mapping[str, Any]) -> dict[str, Any]:
    """``topics.json``'s content."""
    return {"dataVersion": dict(data_version), "topicConfigTable": {k: dict(v) for k, v in table.items()}}


def save_topics(config_dir: Path, table: Mapping[str, Mapping[str, Any]], data_version: Mapping[str, Any]) -> None:
    """Write ``topics.json``; pass ``next_data_version(old)`` when the table changed."""
    write_config(Path(config_dir) / TOPICS, topics_document(table, data_version))


def load_subscription_groups(config_dir: Path) -> dict[str, Any]:
    """``subscriptionGroup.json`` as ``{"dataVersion": {...}, "subscriptionGroupTable": {group: config}}``."""
    return _load_versioned(config_dir, SUBSCRIPTION_GROUP, "subscriptionGroupTable")


def subscription_groups_document(
    table: Mapping[str, Mapping[str, Any]], data_version: Mapping[str, Any]
) -> dict[str, Any]:
    """``subscriptionGroup.json``'s content."""
    return {"dataVersion": dict(data_version), "subscriptionGroupTable": {k: dict(v) for k, v in table.items()}}


def save_subscription_groups(
    config_dir: Path, table: Mapping[str, Mapping[str, Any]], data_version: Mapping[str, Any]
) -> None:
    """Write ``subscriptionGroup.json``; pass ``next_data_version(old)`` when the table changed."""
    write_config(Path(config_dir) / SUBSCRIPTION_GROUP, subscription_groups_document(table, data_version))

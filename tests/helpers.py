"""Shared test helpers: small-segment store configs, message builders, deadline polling and background threads.

Import from here (``from tests.helpers import make_config, make_message, wait_until, wait_dispatched, Worker``).
"""

from __future__ import annotations

import contextlib
import importlib.resources
import itertools
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from store.config import MessageStoreConfig
from store.format import msgid, properties, records

SMALL_COMMITLOG = 64 * 1024
SMALL_CONSUME_QUEUE = 20 * 50  # 50 units per ConsumeQueue file
SMALL_HASH_SLOTS = 64
SMALL_INDEX_NUM = 256

_uniq = msgid.UniqKeyGenerator(ip=b"\x7f\x00\x00\x01", pid=4242, salt=0x1234ABCD)
_seq = itertools.count()


def make_config(tmp_path: Path, **overrides) -> MessageStoreConfig:
    """A MessageStoreConfig rooted at ``tmp_path/store`` with small files; overrides by snake or camelCase name."""
    values: dict = {
        "storePathRootDir": Path(tmp_path) / "store",
        "mappedFileSizeCommitLog": SMALL_COMMITLOG,
        "mappedFileSizeConsumeQueue": SMALL_CONSUME_QUEUE,
        "maxHashSlotNum": SMALL_HASH_SLOTS,
        "maxIndexNum": SMALL_INDEX_NUM,
        # keep background passes quiet during tests; retention runs only when a test asks for it
        "cleanResourceInterval": 3_600_000,
    }
    fields = MessageStoreConfig.model_fields
    for key, value in overrides.items():
        alias = fields[key].alias if key in fields and fields[key].alias else key
        values[alias] = value
    return MessageStoreConfig(**values)


def make_message(
    topic: str,
    queue_id: int,
    body: bytes | str,
    tags: str | None = None,
    keys: str | list[str] | None = None,
    uniq_key: bool | str = True,
    *,
    sys_flag: int = 0,
    born_timestamp: int | None = None,
    **props: str,
) -> records.MessageRecord:
    """A MessageRecord with TAGS / KEYS / UNIQ_KEY properties (plus any extra ``props``).

    ``uniq_key=True`` generates a client-style id, a string uses that id, False omits it.
    ``keys`` may be a list (joined with spaces, as the Java client does).
    """
    p: dict[str, str] = {}
    if tags is not None:
        p[properties.PROPERTY_TAGS] = tags
    if keys is not None:
        p[properties.PROPERTY_KEYS] = keys if isinstance(keys, str) else properties.KEY_SEPARATOR.join(keys)
    if uniq_key is True:
        p[properties.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = _uniq.next()
    elif isinstance(uniq_key, str):
        p[properties.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = uniq_key
    p.update(props)
    return records.MessageRecord(
        topic=topic,
        queue_id=queue_id,
        body=body.encode("utf-8") if isinstance(body, str) else bytes(body),
        properties=properties.encode_properties(p),
        sys_flag=sys_flag,
        born_timestamp=int(time.time() * 1000) if born_timestamp is None else born_timestamp,
        born_host=("127.0.0.1", 50000 + next(_seq) % 10000),
    )


def cli_env(**extra: str) -> dict[str, str]:
    """The environment for running a command-line tool in a subprocess, without ``COLUMNS``: outside a terminal
    the output must not depend on it, so a test neither sets it (that would hide a regression) nor inherits the
    width of the terminal the tests run from."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return {**env, **extra}


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, what: str = "") -> object:
    """Poll ``predicate`` until truthy; raise AssertionError naming ``what`` once ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what or predicate!r}")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


class Worker(threading.Thread):
    """A test's background thread whose failure fails the test: the exception (an ``assert`` included) is kept and
    re-raised in the test's thread by :meth:`check` and :meth:`finish`, with its traceback, where a plain thread's
    would only print and leave the test passing."""

    def __init__(self, target: Callable[..., object], *args: object, name: str | None = None) -> None:
        super().__init__(name=name or getattr(target, "__name__", None), daemon=True)
        self._target_fn, self._target_args = target, args
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._target_fn(*self._target_args)
        except BaseException as e:  # handed to the test's thread
            self.error = e

    def check(self) -> None:
        """Raise the thread's exception now if it has failed (use in a polled predicate)."""
        if self.error is not None:
            raise AssertionError(f"background thread {self.name} failed: {self.error!r}") from self.error

    def finish(self, timeout: float = 60.0) -> None:
        """Join, then fail if the thread failed or is still running."""
        self.join(timeout)
        self.check()
        assert not self.is_alive(), f"background thread {self.name} still running after {timeout}s"


def wait_dispatched(store, timeout: float = 10.0) -> None:
    """Wait until the reput service has dispatched everything in the CommitLog."""
    wait_until(
        lambda: store.dispatch_behind_bytes <= 0,
        timeout,
        what=f"dispatch to catch up (behind {store.dispatch_behind_bytes} bytes)",
    )


def read_queue(store, topic: str, queue_id: int) -> list[tuple[int, records.MessageRecord]]:
    """Every message of a queue via get_message, following next_begin_offset, CRC-checked."""
    from store.message_store import GetMessageStatus

    out = []
    offset = store.get_min_offset_in_queue(topic, queue_id)
    while True:
        r = store.get_message(topic, queue_id, offset, 32)
        if r.status != GetMessageStatus.FOUND:
            assert r.status in (GetMessageStatus.OFFSET_OVERFLOW_ONE, GetMessageStatus.NO_MESSAGE_IN_QUEUE), r.status
            return out
        out.extend(
            (q, records.decode_record(m, check_crc=True)) for q, m in zip(r.queue_offsets, r.messages, strict=True)
        )
        assert r.next_begin_offset > offset
        offset = r.next_begin_offset


def flip_byte(path: Path, pos: int) -> None:
    """Invert the byte at ``pos`` of ``path`` in place (a planted corruption)."""
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0xFF]))


def kill_process_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every descendant, and each one's process group, as a container kill does.

    A process group alone is not the whole job: PySpark's daemon moves itself and its Python workers into a
    group of their own, so ``killpg`` of a spark-submit leaves those workers running (and sending) until the
    daemon notices its JVM is gone.
    """
    signal_process_tree(pid, signal.SIGKILL)


def signal_process_tree(pid: int, sig: int) -> None:
    """Send ``sig`` to ``pid``, every descendant and each one's process group (never the test's own group).

    SIGSTOP freezes a job where it is, so that a test can look at its state and then SIGKILL it knowing that the
    state it saw is the one the kill lands in; SIGCONT lets it go on."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # the command name (field 2) may hold spaces and parentheses: the fields after it start past ')'
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, ()))
    groups = set()
    for p in tree:
        with contextlib.suppress(ProcessLookupError):
            groups.add(os.getpgid(p))
    for g in groups - {os.getpgid(0)}:  # never the test's own group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(g, sig)
    for p in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, sig)


@contextlib.contextmanager
def local_zone(name: str):
    """Run with the process-local time zone set to ``name`` (what Java's Calendar.getInstance() uses).

    The zone's rules come from the pinned ``tzdata`` package (a dev dependency), not from the host's tz
    database, which a slim container may lack: TZ=":<path>" makes the C library read that TZif file."""
    zone_file = importlib.resources.files("tzdata.zoneinfo").joinpath(*name.split("/"))
    assert zone_file.is_file(), f"time zone {name} is not in the tzdata package"  # glibc would fall back to UTC
    old = os.environ.get("TZ")
    os.environ["TZ"] = f":{zone_file}"
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = old
        time.tzset()

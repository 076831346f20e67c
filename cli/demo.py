"""``mqlake demo``: the whole path in a few minutes, in a directory of its own.

It starts ``mqlake up`` with small CommitLog segments (1 MiB) and a short retention (fileReservedTime=1 h) on
loopback ports the OS picks, sends traffic, then runs the lake's three jobs as a user would type them: ``mqlake tier``
(every sealed segment, ``--file-reserved-time 0``), ``mqlake sql`` over the tiered messages and ``mqlake replay``
of them into a new topic.  Each step prints its command and its time; the broker is stopped at the end.  The
jobs run in this process on one Spark session, so Spark starts once.  The
directory (``--dir``, default a new one under the system's temp directory) keeps the store, the lake and the
broker's log for a look afterwards.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from store.console import console, print_error

if TYPE_CHECKING:
    from typer._click import Command as ClickCommand  # typer vendors click

TOPIC = "DemoOrders"
REPLAY_TOPIC = "DemoOrdersReplay"
SEGMENT_BYTES = 1024 * 1024
START_TIMEOUT_S = 120.0
BATCH = 100


def _mqlake(*args: str) -> list[str]:
    # -P: a "store" directory in the working directory must not shadow the package
    return [sys.executable, "-P", "-m", "cli", *args]


class _Steps:
    def __init__(self, total: int) -> None:
        self.total = total
        self.n = 0
        self.out = console()
        self.started = time.monotonic()

    @contextmanager
    def step(self, title: str, command: list[str] | None = None) -> Iterator[None]:
        self.n += 1
        self.out.print(f"\n== step {self.n}/{self.total}: {title}", highlight=False)
        if command is not None:
            shown = ["mqlake", *command[4:]] if command[:4] == _mqlake() else command
            self.out.print("$ " + " ".join(_quote(a) for a in shown), highlight=False)
        t0 = time.monotonic()
        yield
        self.out.print(f"-- step {self.n} took {time.monotonic() - t0:.1f} s", highlight=False)


def _quote(arg: str) -> str:
    return arg if arg and all(c.isalnum() or c in "-_./:=,*" for c in arg) else "'" + arg.replace("'", "'\\''") + "'"


def _run(root: ClickCommand, command: list[str]) -> None:
    """Run an ``mqlake`` command (``root`` is the ``mqlake`` command group) in this process: the three Spark steps
    share one Spark session (one JVM start instead of three, the larger part of each step's time)."""
    args = command[len(_mqlake()):]
    try:
        code = root.main(args=args, prog_name="mqlake", standalone_mode=False)
    except typer.Exit as e:
        code = e.exit_code
    if code not in (0, None):
        print_error(f"the step failed (exit code {code}): mqlake {' '.join(args)}")
        raise typer.Exit(1)


def _wait_ready(proc: subprocess.Popen[bytes], log: Path) -> str:
    """Until the broker is ready; returns the NameServer's address, which the OS chose (port 0)."""
    from broker.embedded import ready_address

    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        text = log.read_text(errors="replace")
        namesrv = ready_address(text, "NameServer")
        if namesrv is not None and ready_address(text, "Broker") is not None:
            return namesrv
        if proc.poll() is not None:
            print_error(f"the broker exited with code {proc.returncode} before it was ready; its log: {log}")
            raise typer.Exit(1)
        if time.monotonic() > deadline:
            print_error(f"the broker was not ready after {START_TIMEOUT_S:.0f} s; its log: {log}")
            raise typer.Exit(1)
        time.sleep(0.2)  # polling the log file of a child process


def _wait_recorded(store: Path, sealed: int) -> None:
    """Until the broker's manifest records the sealed segments (the tier job claims from it).

    A segment past the active state counts: on a disk over diskSpaceCleanForciblyRatio the broker expires sealed
    segments at once, and the tier job claims expired ones too."""
    from store.retention import SegmentManifest, SegmentState

    manifest = SegmentManifest(store)
    deadline = time.monotonic() + START_TIMEOUT_S
    recorded = (SegmentState.SEALED, SegmentState.EXPIRED)
    while sum(e.state in recorded for e in manifest.entries()) < sealed:
        if time.monotonic() > deadline:
            print_error(f"the broker did not record {sealed} sealed segment(s) in {START_TIMEOUT_S:.0f} s")
            raise typer.Exit(1)
        time.sleep(0.2)  # the broker's clean pass writes the manifest once a second here


def _send(namesrv: str, count: int) -> int:
    """Send ``count`` messages; returns the CommitLog offset of the last one."""
    from broker.client import Message, Producer
    from broker.remoting.loop import run
    from store.format import msgid

    async def go() -> int:
        async with Producer("demo_producer", namesrv) as p:
            last = await p.send(Message(TOPIC, "{}", tags="warmup", keys="order-0"))  # creates the topic, its route
            sent = 1
            while sent < count:
                batch = [Message(TOPIC, json.dumps({"order": i, "item": f"sku-{i % 97}", "qty": 1 + i % 5,
                                                     "note": "x" * 200}),
                                 tags="paid" if i % 3 else "refund", keys=f"order-{i}")
                         for i in range(sent, min(sent + BATCH, count))]  # fmt: skip
                last = await p.send_batch(batch)
                sent += len(batch)
            return msgid.decode_offset_msg_id(last.offset_msg_id.split(",")[-1])[1]

    return run(go())


def demo(
    ctx: typer.Context,
    directory: Annotated[Path | None, typer.Option("--dir", help="Where the store, lake and logs go (default: a "
                                                   "new directory under the system's temp directory).")] = None,
    messages: Annotated[int, typer.Option("--messages", min=1, help="How many messages to send.")] = 3000,
) -> None:
    """Start a broker with small segments, send traffic, then tier it, query it with SQL and replay it."""
    base = Path(tempfile.mkdtemp(prefix="mqlake-demo-")) if directory is None else directory.absolute()
    base.mkdir(parents=True, exist_ok=True)
    store, lake, log = base / "store", base / "lake", base / "broker.log"
    root = ctx.find_root().command
    conf = base / "broker.conf"
    # cleanResourceInterval: the broker records sealed segments for the tier job every second, not every 10 s
    conf.write_text(f"brokerIP1=127.0.0.1\nmappedFileSizeCommitLog={SEGMENT_BYTES}\nfileReservedTime=1\n"
                    "cleanResourceInterval=1000\nenableProxy=false\n")  # fmt: skip
    out = console()
    out.print(f"mqlake demo in {base}", highlight=False)
    steps = _Steps(5)
    up = _mqlake("up", "-c", str(conf), "--store-dir", str(store), "--lake", str(lake), "--namesrv-port", "0",
                 "--broker-port", "0", "--host", "127.0.0.1")  # fmt: skip (ports the OS picks, never raced)
    with steps.step(f"start a NameServer and a Broker ({SEGMENT_BYTES // 1024} KiB segments), log in {log}", up):
        log_file = log.open("wb")
        proc = subprocess.Popen(up, stdout=log_file, stderr=subprocess.STDOUT)
        namesrv = _wait_ready(proc, log)
    try:
        with steps.step(f"send {messages} messages to {TOPIC} (as `mqlake send -t {TOPIC} -n {namesrv}` does)"):
            end = _send(namesrv, messages)
            sealed = end // SEGMENT_BYTES  # the segments before the one the last message went to
            out.print(f"{end:,} bytes of CommitLog: {sealed} sealed segment(s) of {SEGMENT_BYTES // 1024} KiB and "
                      "the open one", highlight=False)  # fmt: skip
            _wait_recorded(store, sealed)
        tier = _mqlake("tier", "--store-dir", str(store), "--lake", str(lake), "--file-reserved-time", "0")
        with steps.step("tier every sealed segment into the lake's Delta tables", tier):
            _run(root, tier)
        query = (f"SELECT tags, count(*) AS messages, timestamp_millis(min(store_timestamp)) AS first_stored, "
                 f"timestamp_millis(max(store_timestamp)) AS last_stored FROM messages WHERE topic = '{TOPIC}' "
                 "GROUP BY tags ORDER BY tags")  # fmt: skip
        sql = _mqlake("sql", "--lake", str(lake), query)
        with steps.step("query the tiered history with Spark SQL", sql):
            _run(root, sql)
        replay = _mqlake("replay", "--lake", str(lake), "--source-topic", TOPIC, "--target-topic", REPLAY_TOPIC,
                         "--namesrv", namesrv)  # fmt: skip
        with steps.step(f"replay the tiered messages into {REPLAY_TOPIC}", replay):
            _run(root, replay)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log_file.close()
    out.print(f"\ndone in {time.monotonic() - steps.started:.1f} s; the store, lake and broker log stay in {base}",
              highlight=False)  # fmt: skip

"""The path of one send through the broker: the modules it crosses, how often control comes back into the send
processor, and its CPU cost, for each shape of send.

Run: ``.venv/bin/python -m benchmarks bench_send_path`` (or ``make bench``); with ``MQLAKE_NO_EXTENSIONS=1`` the
Python twins run, so the path shows every Python module (a compiled twin is one call).  BENCH_SCALE multiplies
the counts.

What is measured, exactly:
  * A BrokerController (ASYNC_FLUSH, a temporary store, no NameServer) in this process; requests of 1 KiB bodies
    handed straight to the send handler (``SendProcessor.send_inline``) on the broker's event loop: a plain
    SEND_MESSAGE_V2, the same send with a V1 header (SEND_MESSAGE, the general path), a transaction's half
    message, and a SEND_BATCH_MESSAGE of 32.  Each shape is sent once untimed first (its topic created).
  * The path: one more call of each shape under a profiler hook (``sys.setprofile``), which sees every Python
    frame entered and left.  "modules" counts the project's files whose code ran; "back into send.py" counts
    how often control came back into ``broker/server/send.py`` from another module, by a call or a return.
  * The cost: rounds of sends of each shape in turn, thread CPU per send, median over the rounds.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from types import FrameType

from benchmarks.report import run_on_broker
from broker.remoting import headers as h
from broker.remoting.codes import RequestCode
from broker.remoting.command import RemotingCommand
from broker.server.controller import BrokerController
from broker.server.send import SendProcessor
from store.constants import AUTO_CREATE_TOPIC_KEY_TOPIC
from store.format import properties
from store.format.batch_body import BatchItem, encode_batch_body

SCALE = float(os.environ.get("BENCH_SCALE", "1") or 1)
ROUNDS = 9
PER_ROUND = max(100, int(4_000 * SCALE))
TOPIC = "SendPathBench"
ROOT = Path(__file__).resolve().parent.parent
SEND_PY = str(ROOT / "broker" / "server" / "send.py")


class _Peer:
    remote_addr = "127.0.0.1:5555"
    remote_host = ("127.0.0.1", 5555)


def _header(i: int, props: dict[str, str]) -> h.SendMessageRequestHeader:
    return h.SendMessageRequestHeader(
        producer_group="pg", topic=TOPIC, default_topic=AUTO_CREATE_TOPIC_KEY_TOPIC, default_topic_queue_nums=8,
        queue_id=i % 8, sys_flag=0, born_timestamp=int(time.time() * 1000), flag=0,
        properties=properties.encode_properties(props).decode(),
    )  # fmt: skip


def _plain(i: int) -> RemotingCommand:
    v1 = _header(i, {"UNIQ_KEY": f"U{i:020d}", "TAGS": "T", "KEYS": f"k{i}"})
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, h.SendMessageRequestHeaderV2.from_v1(v1), b"x" * 1024)


def _v1(i: int) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.SEND_MESSAGE, _header(i, {"UNIQ_KEY": f"V{i:020d}", "TAGS": "T"}),
                                   b"x" * 1024)  # fmt: skip


def _half(i: int) -> RemotingCommand:
    v1 = _header(i, {"UNIQ_KEY": f"H{i:020d}", "TRAN_MSG": "true", "PGROUP": "pg"})
    v1.sys_flag = 0x4  # TRANSACTION_PREPARED_TYPE
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, h.SendMessageRequestHeaderV2.from_v1(v1), b"x" * 1024)


def _batch(i: int) -> RemotingCommand:
    items = [BatchItem(0, b"x" * 1024, properties.encode_properties({"UNIQ_KEY": f"B{i:014d}{j:06d}"}))
             for j in range(32)]  # fmt: skip
    v1 = _header(i, {})
    v1.batch = True
    return RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE, h.SendMessageRequestHeaderV2.from_v1(v1),
                                   encode_batch_body(items))  # fmt: skip


SHAPES = {"plain V2": (_plain, 1), "V1 header": (_v1, 1), "half message": (_half, 1), "batch of 32": (_batch, 32)}


async def _answered(proc: SendProcessor, cmd: RemotingCommand) -> int:
    """The response code of one send, awaited when the handler returns a coroutine."""
    resp = proc.send_inline(cmd, _Peer())
    if isinstance(resp, bytes):
        return RemotingCommand.decode(resp[4:]).code
    if not isinstance(resp, RemotingCommand):
        resp = await resp  # type: ignore[misc]
    assert isinstance(resp, RemotingCommand)
    return resp.code


def _path(proc: SendProcessor, cmd: RemotingCommand) -> dict:
    """Which project files one ``send_inline`` call runs code in, and how often control comes back into send.py."""
    files: list[str] = []
    steps: list[str] = []  # each change of module: the module entered, by which event of which function
    back = 0
    current = SEND_PY

    def hook(frame: FrameType, event: str, _arg: object) -> None:
        nonlocal back, current
        if event == "call":
            where = frame.f_code.co_filename
        elif event == "return":
            caller = frame.f_back
            where = caller.f_code.co_filename if caller is not None else ""
        else:
            return
        if not where.startswith(str(ROOT)) or "/.venv/" in where or where.startswith(str(ROOT / "benchmarks")):
            return  # the standard library's, the dependencies' and this benchmark's frames
        if where not in files:
            files.append(where)
        if where != current:
            back += where == SEND_PY
            steps.append(f"{Path(where).relative_to(ROOT)} ({event} of {frame.f_code.co_name})")
            current = where

    sys.setprofile(hook)
    try:
        proc.send_inline(cmd, _Peer())
    finally:
        sys.setprofile(None)
    return {"modules": len(files), "back_into_send_py": back,
            "files": [str(Path(f).relative_to(ROOT)) for f in files], "steps": steps}  # fmt: skip


async def _measure(controller: BrokerController) -> dict:
    proc = SendProcessor(controller)
    for make, _ in SHAPES.values():
        code = await _answered(proc, make(0))  # the topic (and the half topic) created and saved
        assert code == 0, f"the first send answered {code}"
    paths = {name: _path(proc, make(1)) for name, (make, _) in SHAPES.items()}
    cpu: dict[str, list[float]] = {name: [] for name in SHAPES}
    for r in range(ROUNDS):
        for name, (make, _) in SHAPES.items():
            n = PER_ROUND if name != "batch of 32" else max(10, PER_ROUND // 32)
            reqs = [make(r * PER_ROUND + i) for i in range(n)]
            peer = _Peer()
            t0 = time.thread_time()
            for cmd in reqs:
                proc.send_inline(cmd, peer)
            cpu[name].append((time.thread_time() - t0) / n)
            await asyncio.sleep(0)  # the flush service runs between rounds
    shapes = {
        name: {**paths[name], "cpu_us_per_send": statistics.median(cpu[name]) * 1e6,
               "cpu_us_per_message": statistics.median(cpu[name]) * 1e6 / SHAPES[name][1]}
        for name in SHAPES
    }  # fmt: skip
    return {"shapes": shapes, "rounds": ROUNDS, "sends_per_round": PER_ROUND}


def _report(r: dict) -> None:
    print(f"one send through SendProcessor.send_inline ({r['machine']['codecs']} twins), thread CPU median of "
          f"{r['rounds']} rounds")  # fmt: skip
    print(f"{'shape':<14} {'modules':>8} {'back into send.py':>18} {'CPU µs/send':>12} {'µs/message':>11}")
    for name, s in r["shapes"].items():
        print(f"{name:<14} {s['modules']:>8} {s['back_into_send_py']:>18} {s['cpu_us_per_send']:>12.1f} "
              f"{s['cpu_us_per_message']:>11.2f}")  # fmt: skip
    print("the modules, in the order first entered:")
    for name, s in r["shapes"].items():
        print(f"  {name}: {' → '.join(s['files'])}")


def main() -> dict:
    # no transaction check while it runs: the half messages' producer is not a client (a check would log for each)
    return run_on_broker("bench_send_path", _measure, _report, {"transactionCheckInterval": str(24 * 3600 * 1000)})


if __name__ == "__main__":
    main()

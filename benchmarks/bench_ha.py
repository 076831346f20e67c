"""Replication benchmarks: SYNC_MASTER vs ASYNC_MASTER send rate in the same run, and how far a slave
lags its ASYNC_MASTER at a fixed 20,000 msgs/s.

Run: ``.venv/bin/python -m benchmarks bench_ha`` (or ``make bench``).

Environment:
  BENCH_SCALE    multiplies every message count and duration (default 1.0; 0.1 for a smoke run)
  BENCH_JSON     a path: also write the JSON results there

What is measured, exactly:
  * For each role, a master (``mqlake up``: NameServer + Broker, ASYNC_FLUSH, a temporary store) and a slave
    (``mqlake broker``, brokerRole=SLAVE, brokerId=1, its own store) as processes on loopback; the slave finds the
    master through the NameServer.  Measuring starts once the master reports a connected slave.
  * Send rate: broker/client ``Producer.send`` of 1 KiB messages, ``WINDOW`` in flight over 8 connections, after a
    warm-up.  Under SYNC_MASTER a send is answered only once the slave acknowledged its bytes.
  * Lag (ASYNC_MASTER, a fresh pair per rate): sends paced at each of ``LAG_RATES`` (ticks of 1 ms) for ``LAG_SECONDS``
    after a warm-up, at most ``LAG_IN_FLIGHT`` outstanding (so a slower broker lowers the achieved rate); the master
    measures each append's lag itself, from the append to the first slave ack covering it, and
    GET_BROKER_RUNTIME_INFO reports p50/p99/max over its last 100,000 appends (haAckLag*: the warm-up is among
    them).  A polling sampler was tried first: under load it got ~10 samples/s.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench_broker import bench_message, free_port, send_rate
from benchmarks.report import emit, machine
from broker.client import MQClientError, Producer
from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.loop import run
from broker.remoting.protocol.body import KVTable

SCALE = float(os.environ.get("BENCH_SCALE", "1") or 1)
WINDOW = 256
SEND_COUNT = 30_000
WARMUP = 2_000
LAG_RATES = (20_000, 1_000)  # the rate, and one well under what a loaded 2-core machine sustains
LAG_SECONDS = 5.0
LAG_IN_FLIGHT = 64  # sends outstanding at most during the paced phase
TARGET_SYNC_RATIO = 0.70
READY_TIMEOUT = 60.0


def _n(count: float) -> int:
    return max(1, int(count * SCALE))


class Pair:
    """A master and its slave as two processes."""

    def __init__(self, root: Path, role: str) -> None:
        self.root = root
        ns, mport, sport = free_port(), free_port(), free_port()
        self.namesrv_addr = f"127.0.0.1:{ns}"
        self.master_addr = f"127.0.0.1:{mport}"
        common = (
            "brokerClusterName=BenchCluster\nbrokerName=bench-ha\nbrokerIP1=127.0.0.1\n"
            f"namesrvAddr={self.namesrv_addr}\nflushDiskType=ASYNC_FLUSH\nhaListenPort={free_port()}\n"
        )
        self.procs: list[subprocess.Popen] = []
        self.logs = []
        for name, port, extra, cmd in (
            ("master", mport, f"brokerRole={role}\nbrokerId=0\n", ["up", "--namesrv-port", str(ns)]),
            ("slave", sport, "brokerRole=SLAVE\nbrokerId=1\n", ["broker"]),
        ):
            conf = root / f"{name}.conf"
            conf.write_text(common + extra + f"listenPort={port}\nstorePathRootDir={root / name}\n")
            log = open(root / f"{name}.log", "wb")  # noqa: SIM115 - closed in stop()
            self.logs.append(log)
            exe = [sys.executable, "-c", "from cli.main import main; main()"]
            self.procs.append(subprocess.Popen([*exe, *cmd, "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT))
            if name == "master":
                run(self._wait(lambda info: True))

    async def runtime(self, client: RemotingClient) -> dict[str, str]:
        resp = await client.invoke(self.master_addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), 3)
        if resp.code != ResponseCode.SUCCESS:
            raise RuntimeError(resp.remark)
        return KVTable.decode(resp.body).table

    async def _wait(self, ready) -> None:
        client = RemotingClient()
        deadline = time.monotonic() + READY_TIMEOUT
        try:
            while True:
                for p in self.procs:
                    if p.poll() is not None:
                        raise RuntimeError(f"a server exited with {p.returncode}: see {self.root}/*.log")
                with contextlib.suppress(Exception):
                    if ready(await self.runtime(client)):
                        return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"not ready after {READY_TIMEOUT:.0f}s: see {self.root}/*.log")
                await asyncio.sleep(0.1)
        finally:
            await client.close()

    def wait_slave(self) -> None:
        run(self._wait(lambda info: info.get("haConnections") == "1"))

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for log in self.logs:
            log.close()


async def rate_phase(pair: Pair) -> float:
    p = Producer("bench_ha", pair.namesrv_addr, connections_per_addr=8)
    await p.start()
    try:
        await send_rate(p, _n(WARMUP), WINDOW)
        return await send_rate(p, _n(SEND_COUNT), WINDOW)
    finally:
        await p.shutdown()


async def lag_phase(pair: Pair, rate: int) -> dict:
    """Sends paced at ``rate``: each 1 ms tick one send (of ``rate / 1000`` messages, a batch above 1,000 msgs/s:
    single sends top out near 8,000 msgs/s on this machine); then the master's own account of the lag."""
    p = Producer("bench_ha_lag", pair.namesrv_addr, connections_per_addr=8)
    await p.start()
    per_tick = max(1, rate // 1000)
    batch = [bench_message(i) for i in range(per_tick)]
    slots = asyncio.Semaphore(LAG_IN_FLIGHT)
    done = failed = 0

    async def one() -> None:
        nonlocal done, failed
        try:
            if per_tick == 1:
                await p.send(batch[0])
            else:
                await p.send_batch(batch)
            done += per_tick
        except MQClientError:
            failed += per_tick
        finally:
            slots.release()

    client = RemotingClient()
    try:
        await send_rate(p, _n(WARMUP), WINDOW)
        pending: set[asyncio.Task] = set()
        ticks = int(LAG_SECONDS * SCALE * 1000)
        t0 = time.perf_counter()
        for tick in range(ticks):
            await slots.acquire()  # a broker slower than the rate holds the sender back (achieved < target)
            t = asyncio.ensure_future(one())
            pending.add(t)
            t.add_done_callback(pending.discard)
            await asyncio.sleep(max(0.0, t0 + (tick + 1) / 1000 - time.perf_counter()))  # yields every tick
        await asyncio.gather(*pending)
        achieved = done / (time.perf_counter() - t0)
        info = await pair.runtime(client)
        while int(info["haPushToSlaveMaxOffset"]) < int(info["commitLogMaxOffset"]):  # the last acks
            await asyncio.sleep(0.01)
            info = await pair.runtime(client)
    finally:
        await client.close()
        await p.shutdown()
    return {
        "target_msgs_per_s": rate, "achieved_msgs_per_s": achieved, "messages": done, "failed_sends": failed,
        "messages_per_send": per_tick, "window": int(info["haAckLagCount"]), "p50_ms": float(info["haAckLagP50Ms"]),
        "p99_ms": float(info["haAckLagP99Ms"]), "max_ms": float(info["haAckLagMaxMs"]),
    }  # fmt: skip


def print_report(r: dict) -> None:
    print(f"  machine: {r['machine']}")
    print("  | role | msgs/s (1 KiB, 8 connections, window 256) |")
    print("  |---|---|")
    for role in ("ASYNC_MASTER", "SYNC_MASTER"):
        print(f"  | {role} | {r[role]['msgs_per_s']:,.0f} |")
    print(f"  SYNC_MASTER / ASYNC_MASTER = {r['sync_ratio']:.2f} (target >= {TARGET_SYNC_RATIO})")
    for lag in r["lag"]:
        print(f"  lag at {lag['achieved_msgs_per_s']:,.0f} msgs/s (target {lag['target_msgs_per_s']:,}): "
              f"p50 {lag['p50_ms']:.1f} ms, p99 {lag['p99_ms']:.1f} ms, max {lag['max_ms']:.1f} ms, "
              f"{lag['window']:,} appends of {lag['messages_per_send']} messages")  # fmt: skip


def main() -> dict:
    t0 = time.perf_counter()
    results: dict = {"machine": machine()}
    with tempfile.TemporaryDirectory(prefix="mqlake-bench-ha-", dir="/tmp") as d:
        results["lag"] = []
        # a fresh ASYNC pair per rate: the master's lag window then holds that rate's sends (and a warm-up) only
        phases = [("ASYNC_MASTER", rate) for rate in LAG_RATES] + [("ASYNC_MASTER", None), ("SYNC_MASTER", None)]
        for n, (role, rate) in enumerate(phases):
            print(f"  [{role} {'lag at ' + str(rate) if rate else 'send rate'}]", flush=True)
            root = Path(d) / str(n)
            root.mkdir()
            pair = Pair(root, role)
            try:
                pair.wait_slave()
                if rate:
                    results["lag"].append(run(lag_phase(pair, rate)))
                else:
                    results[role] = {"msgs_per_s": run(rate_phase(pair))}
            finally:
                pair.stop()
    results["sync_ratio"] = results["SYNC_MASTER"]["msgs_per_s"] / results["ASYNC_MASTER"]["msgs_per_s"]
    results["wall_seconds"] = time.perf_counter() - t0
    return emit("bench_ha", results, print_report)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()

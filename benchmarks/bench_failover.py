"""Automatic failover in controller mode: SIGKILL the master under SYNC load, again and again.

Run: ``.venv/bin/python -m benchmarks bench_failover``.

Environment:
  BENCH_KILLS    how many masters to kill (default 10)
  BENCH_JSON     a path: also write the JSON results there

What is measured, exactly:
  * Apache RocketMQ 5.4.0's controller as three DLedger nodes on loopback (``tests.peers.ControllerCluster``), an
    mqlake NameServer and two mqlake brokers of one broker set in controller mode (``tests.controller_mode``:
    allAckInSyncStateSet=true, heartbeats every 500 ms, a broker counted dead after 3 s, the controller scanning
    every second), each a process with its own store.
  * One stock C++ producer (``rocketmq.client``, the RocketMQ C++ client 2.x) sends 200-byte bodies, each unique,
    with ``send_sync`` in a loop for the whole run; a send counts as acknowledged when it answers SEND_OK.
  * Each round: once the slave is in the sync state set and 200 more sends were acknowledged, and a random 0-30 s
    later (uniform, seeded: a kill can fall at any point of the client's 30 s route refresh, else the rounds fall
    into step with it), the master is SIGKILLed.  Two failover times: (1) from the kill until the slave itself
    answers SUCCESS to a SEND_MESSAGE (a probe sending to its address every 50 ms; SYNC: the sync state set holds
    it); (2) from the kill to the producer's first acknowledgement after the longest pause in acknowledgements
    since it: the client's retries and its route refresh included (the C++ client asks the NameServer every 30 s;
    its Python binding has no setting for that, Java's is ``pollNameServerInterval``).  The killed broker is
    started again; it returns as a slave, cut to the epoch boundary if it held records no replica had, and once it
    has the new master's end its CommitLog is compared with the new master's, byte for byte from offset 0.
  * At the end a new C++ push consumer group reads the topic: lost = acknowledged bodies never read; duplicates =
    bodies read more than once (what a consumer of an at-least-once log may see).
"""

from __future__ import annotations

import collections
import os
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.report import emit, machine
from broker.remoting.codes import ResponseCode
from tests.controller_mode import SyncLoad, failover_seconds, in_sync, master_and_slave, max_offset, role
from tests.fixtures_broker import MqlakeServer, stop_servers
from tests.helpers import wait_until
from tests.peers import ControllerCluster
from tests.test_ha import commitlog_bytes, send_to

KILLS = int(os.environ.get("BENCH_KILLS", "10") or 10)
SENDS_BETWEEN_KILLS = 200
ROUTE_POLL_SECONDS = 30.0  # how often the C++ client asks the NameServer for routes


def probe_until_served(broker: MqlakeServer, n: int) -> float:
    """Send to ``broker`` itself (SEND_MESSAGE, a probe topic) every 50 ms until it answers SUCCESS; when it did."""
    while True:
        try:
            code = send_to(broker.broker_addr, "BenchFailoverProbe", b"probe-%d" % n)
        except OSError:
            code = -1
        if code == ResponseCode.SUCCESS:
            return time.monotonic()
        time.sleep(0.05)


def consume_counts(namesrv: str, topic: str, expect: set[bytes]) -> collections.Counter[bytes]:
    from rocketmq.client import PushConsumer

    got: collections.Counter[bytes] = collections.Counter()
    lock = threading.Lock()

    def on_message(msg) -> None:  # type: ignore[no-untyped-def]
        with lock:
            got[msg.body] += 1

    consumer = PushConsumer(f"bench-failover-read-{os.getpid()}")
    consumer.set_namesrv_addr(namesrv)
    consumer.subscribe(topic, on_message)
    consumer.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not expect <= set(got):
            time.sleep(0.5)
        time.sleep(3)  # late redeliveries count as duplicates too
    finally:
        consumer.shutdown()
    return got


def main() -> dict:
    t0 = time.perf_counter()
    results: dict = {"machine": machine(), "kills": KILLS, "controller": "Apache RocketMQ 5.4.0, 3 DLedger nodes"}
    with tempfile.TemporaryDirectory(prefix="mqlake-bench-failover-", dir="/tmp") as d:
        tmp = Path(d)
        with ControllerCluster(tmp / "controllers", scanNotActiveBrokerInterval=1000) as controllers:
            namesrv, a, b = master_and_slave(tmp, controllers.addrs)
            try:
                load = SyncLoad(namesrv.namesrv_addr, "BenchFailover")
                master, slave = a, b
                phases = random.Random(1)
                rounds = []
                for n in range(KILLS):
                    wait_until(lambda m=master: in_sync(m) == "1,2", 60, what="the slave in the sync state set")
                    target = len(load.acked) + SENDS_BETWEEN_KILLS
                    wait_until(lambda t=target: len(load.acked) >= t, 120, what="acknowledged sends")
                    time.sleep(phases.uniform(0, ROUTE_POLL_SECONDS))  # any phase of the client's route refresh
                    killed_at = time.monotonic()
                    master.kill()
                    served = probe_until_served(slave, n)
                    wait_until(lambda s=slave: role(s) == "SYNC_MASTER", 60, what="a new master")
                    after = len(load.acked)
                    wait_until(lambda t=after: len(load.acked) >= t + 20, 120, what="sends to the new master")
                    seconds = failover_seconds(load.acked, killed_at)
                    master.start()  # the old master returns as a slave
                    wait_until(lambda m=master: role(m) == "SLAVE", 60, what="the old master to follow")
                    end = max_offset(slave)
                    wait_until(lambda m=master, e=end: max_offset(m) >= e, 60, what="the old master to catch up")
                    equal = commitlog_bytes(master.store_dir, 0, end) == commitlog_bytes(slave.store_dir, 0, end)
                    rounds.append({"failover_s": round(seconds, 3), "served_s": round(served - killed_at, 3),
                                   "commitlogs_equal": equal})  # fmt: skip
                    print(f"  kill {n + 1}: new master acknowledged a send after {served - killed_at:.2f} s, the C++ "
                          f"producer after {seconds:.2f} s; CommitLogs equal: {equal}", flush=True)
                    master, slave = slave, master
                load.stop()
                acked = {body for _, body in load.acked}
                got = consume_counts(namesrv.namesrv_addr, load.topic, acked)
                times = [r["failover_s"] for r in rounds]
                served = [r["served_s"] for r in rounds]
                results.update({
                    "rounds": rounds, "failover_p50_s": statistics.median(times), "failover_max_s": max(times),
                    "served_p50_s": statistics.median(served), "served_max_s": max(served),
                    "acknowledged": len(acked), "failed_sends": load.failed, "lost": len(acked - set(got)),
                    "duplicates": sum(c - 1 for c in got.values() if c > 1),
                    "commitlogs_equal_every_rejoin": all(r["commitlogs_equal"] for r in rounds),
                })  # fmt: skip
            finally:
                stop_servers([s for s in (a, b, namesrv) if isinstance(s, MqlakeServer)])
    results["wall_seconds"] = time.perf_counter() - t0
    return emit("bench_failover", results, print_report)


def print_report(r: dict) -> None:
    print(f"Controller-mode failover, {r['kills']} SIGKILLs of the master under SYNC load ({r['controller']})")
    print(f"  failover, kill -> the new master acknowledges a send (a probe sending to it directly): "
          f"p50 {r['served_p50_s']:.2f} s, max {r['served_max_s']:.2f} s")  # fmt: skip
    print(f"  failover, kill -> the stock C++ producer's first acknowledged send after it (its route refresh "
          f"included): p50 {r['failover_p50_s']:.2f} s, max {r['failover_max_s']:.2f} s")  # fmt: skip
    print(f"  acknowledged {r['acknowledged']}, lost {r['lost']}, duplicates read {r['duplicates']}, "
          f"failed sends {r['failed_sends']}")  # fmt: skip
    print(f"  CommitLogs byte-equal after every rejoin: {r['commitlogs_equal_every_rejoin']}")


if __name__ == "__main__":
    main()

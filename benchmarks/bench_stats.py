"""What counting traffic (BrokerStatsManager) costs a send (at most 2 % of send throughput).

Run: ``.venv/bin/python -m benchmarks bench_stats`` (or ``make bench``).  BENCH_SCALE multiplies the counts.

What is measured, exactly:
  * A BrokerController (ASYNC_FLUSH, a temporary store, loopback) in this process; SEND_MESSAGE_V2 requests of
    1 KiB with TAGS and KEYS handed straight to the send handler (``SendProcessor.send_inline``) on the broker's
    event loop: the whole broker-side cost of a send (header parse, checks, record encode, CommitLog append,
    response) without the network, which would only add noise to a 2 % comparison.
  * Rounds alternate between the broker's real stats and a stats object whose counting does nothing, in ABBA
    order; each quadruple gives one ratio of per-send times (a drift as the store grows, or a neighbour's load,
    favours neither mode) and the median ratio is the throughput cost.  Also: the counting call alone, in ns
    per call, and the per-send time with metricsExporterType=PROM's latency histogram on top.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time

from benchmarks.report import run_on_broker
from broker.remoting import headers as h
from broker.remoting.codes import RequestCode
from broker.remoting.command import RemotingCommand
from broker.server.controller import BrokerController
from broker.server.metrics import MetricsExporter
from broker.server.send import SendProcessor
from broker.server.stats import BrokerStatsManager
from store.constants import AUTO_CREATE_TOPIC_KEY_TOPIC
from store.format import properties

SCALE = float(os.environ.get("BENCH_SCALE", "1") or 1)
ROUNDS = 10
PER_ROUND = max(200, int(20_000 * SCALE))
TOPIC = "StatsBench"


class _Peer:
    remote_addr = "127.0.0.1:5555"
    remote_host = ("127.0.0.1", 5555)


class _NotCounting(BrokerStatsManager):
    def put(self, topic: str, nums: int, size: int) -> None:
        pass


def _request(i: int) -> RemotingCommand:
    props = properties.encode_properties({"UNIQ_KEY": f"U{i:020d}", "TAGS": "T", "KEYS": f"k{i}"}).decode()
    v1 = h.SendMessageRequestHeader(
        producer_group="pg", topic=TOPIC, default_topic=AUTO_CREATE_TOPIC_KEY_TOPIC, default_topic_queue_nums=8,
        queue_id=i % 8, sys_flag=0, born_timestamp=int(time.time() * 1000), flag=0, properties=props,
    )  # fmt: skip
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, h.SendMessageRequestHeaderV2.from_v1(v1), b"x" * 1024)


async def _measure(controller: BrokerController) -> dict:
    proc = SendProcessor(controller)
    counting, silent = controller.stats, _NotCounting(controller.config.broker_cluster_name)
    created = proc.send_inline(_request(0), _Peer())  # creates the topic: answered once topics.json holds it
    if not isinstance(created, RemotingCommand):
        await created
    times: dict[str, list[float]] = {"counting": [], "not_counting": []}
    for r in range(ROUNDS * 2):
        mode = "counting" if r % 4 in (0, 3) else "not_counting"  # ABBA: a drift favours neither
        controller.stats = counting if mode == "counting" else silent
        reqs = [_request(i) for i in range(PER_ROUND)]
        peer = _Peer()
        t0 = time.perf_counter()
        for cmd in reqs:
            proc.send_inline(cmd, peer)
        times[mode].append((time.perf_counter() - t0) / PER_ROUND)
        await asyncio.sleep(0)  # let the flush service run between rounds
    controller.stats = counting
    # with metricsExporterType=PROM every request is also timed into rocketmq_rpc_latency
    timed = MetricsExporter(controller).timed(proc.send_inline)
    prom: list[float] = []
    for _ in range(ROUNDS):
        reqs = [_request(i) for i in range(PER_ROUND)]
        peer = _Peer()
        t0 = time.perf_counter()
        for cmd in reqs:
            timed(cmd, peer)
        prom.append((time.perf_counter() - t0) / PER_ROUND)
        await asyncio.sleep(0)
    n = PER_ROUND * 10
    t0 = time.perf_counter()
    put = counting.put
    for _ in range(n):
        put(TOPIC, 1, 1200)
    count_ns = (time.perf_counter() - t0) / n * 1e9
    with_us = statistics.median(times["counting"]) * 1e6
    without_us = statistics.median(times["not_counting"]) * 1e6
    # each ABBA quadruple compares its own two rounds of each mode: a load change between quadruples cancels out
    a, b = times["counting"], times["not_counting"]
    paired = [(a[i] + a[i + 1]) / (b[i] + b[i + 1]) - 1 for i in range(0, min(len(a), len(b)) - 1, 2)]
    return {
        "send_us_counting": with_us,
        "send_us_not_counting": without_us,
        "count_call_ns": count_ns,
        "count_share_of_send_pct": count_ns / 1000 / with_us * 100,
        "throughput_cost_pct": statistics.median(paired) * 100,
        "send_us_counting_and_prom_timing": statistics.median(prom) * 1e6,
        "rounds": ROUNDS,
        "sends_per_round": PER_ROUND,
    }


def print_report(r: dict) -> None:
    print(f"send handler, per send: {r['send_us_counting']:.2f} us counting, {r['send_us_not_counting']:.2f} us not")
    print(f"the counting call alone: {r['count_call_ns']:.0f} ns = {r['count_share_of_send_pct']:.2f} % of a send")
    print(f"throughput cost (median over ABBA quadruples): {r['throughput_cost_pct']:+.2f} %")
    print(f"with metricsExporterType=PROM (rpc latency timed): {r['send_us_counting_and_prom_timing']:.2f} us per send")


def main() -> dict:
    return run_on_broker("bench_stats", _measure, print_report)


if __name__ == "__main__":
    main()

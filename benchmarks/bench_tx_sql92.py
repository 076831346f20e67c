"""Transactions and SQL92 filters, each against its baseline in the same run on one broker.

Run: ``.venv/bin/python -m benchmarks bench_tx_sql92`` (or ``make bench``).  ``BENCH_SCALE`` and ``BENCH_JSON`` as
in bench_broker.

What is measured, exactly:
  * The broker is ``mqlake up`` in its own process (ASYNC_FLUSH, ``enablePropertyFilter=true``, a temporary store,
    free ports); the load generator is this process (broker/client, uvloop), ``WINDOW`` requests in flight on one
    connection, 1 KiB bodies.
  * Transactions: ``TransactionProducer.send_in_transaction`` whose local transaction commits at once (half
    message, then END_TRANSACTION oneway: the broker writes the committed message and the op) against plain
    ``Producer.send`` of the same messages to a topic of the same queues, back to back, ``ROUNDS`` times. Each
    rate counts from the first send until the last message is consumable (dispatched to the real topic's
    ConsumeQueue), so a commit still in flight when the sends return is timed too. The figure is the median of
    the rounds' ratios. Target: transactions >= 50 % of plain sends.
  * Filters: one queue of ``FILTER_COUNT`` messages, half TagA and half TagB, the TagA ones with ``color=red``;
    a PullConsumer reads the whole queue 32 at a time with the tag expression ``TagA`` and with the SQL92
    expression ``color = 'red' AND n >= 0`` (the same messages), back to back, ``ROUNDS`` times. The figure is the
    median of the rounds' SQL92/tag rate ratios (messages delivered per second); the broker's CPU per delivered
    message is shown too. Target: SQL92 >= 50 % of the tag-filtered rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.bench_broker import BrokerProcess, _n
from benchmarks.report import emit, machine
from broker.client import Admin, LocalTransactionState, Message, Producer, PullConsumer, PullStatus
from broker.client.transaction_producer import TransactionProducer
from broker.remoting.loop import run

BODY = 1024
QUEUES = 4
WINDOW = 64
TX_COUNT = 10_000
FILTER_COUNT = 20_000
ROUNDS = 5
TARGET_RATIO = 0.5


async def _create(b: BrokerProcess, topic: str, queues: int) -> None:
    async with Admin(b.namesrv_addr) as admin:
        await admin.create_topic(topic, broker_addr=b.broker_addr, read_queue_nums=queues, write_queue_nums=queues)
        for _ in range(300):
            route = await admin.topic_route(topic)
            if route is not None and len(route.subscribe_queues(topic)) == queues:
                return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"no route for {topic}")


async def _dispatched(c: PullConsumer, topic: str, count: int) -> None:
    queues = await c.fetch_queues(topic)
    deadline = time.monotonic() + 300
    while sum([await c.max_offset(mq) for mq in queues]) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{topic}: fewer than {count} messages dispatched after 300 s")
        await asyncio.sleep(0.02)  # not more often: each poll is four requests the broker serves too


async def _rate(c: PullConsumer, topic: str, total: int, send_one, already: int = 0) -> float:
    """Send ``total`` messages, ``WINDOW`` in flight, until all are consumable (``already`` were there before)."""
    budget = itertools.count()

    async def worker() -> None:
        while (i := next(budget)) < total:
            await send_one(already + i)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(WINDOW)))
    await _dispatched(c, topic, already + total)
    return total / (time.perf_counter() - t0)


async def tx_phase(b: BrokerProcess) -> dict:
    """Plain sends then transactional ones, back to back, ``ROUNDS`` times: the machine is shared, so the ratio of
    a round's two rates is the fairest figure; the median over the rounds is reported."""
    body = b"x" * BODY
    for t in ("BenchPlain", "BenchTx", "BenchWarm"):
        await _create(b, t, QUEUES)

    def commit(_m: Message, _r: object) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    async with Producer("bench_plain", b.namesrv_addr) as plain, \
            TransactionProducer("bench_tx", b.namesrv_addr, lambda m: LocalTransactionState.COMMIT_MESSAGE) as tx, \
            PullConsumer("bench_tx_probe", b.namesrv_addr) as c:  # fmt: skip
        warm = _n(1000)  # connections, routes, the store's first segments
        await _rate(c, "BenchWarm", warm, lambda i: plain.send(Message("BenchWarm", body, tags="T")))
        await _rate(c, "BenchWarm", warm, lambda i: tx.send_in_transaction(Message("BenchWarm", body, tags="T"),
                                                                           commit), already=warm)  # fmt: skip
        per_round = max(1, _n(TX_COUNT) // ROUNDS)
        rounds = []
        for r in range(ROUNDS):
            print("  [plain sends / transactional sends + commits]", flush=True)
            done = r * per_round
            cpu0 = b.cpu_seconds()
            plain_rate = await _rate(c, "BenchPlain", per_round, lambda i: plain.send(
                Message("BenchPlain", body, tags="T", keys=f"k{i}")), already=done)  # fmt: skip
            cpu1 = b.cpu_seconds()
            tx_rate = await _rate(c, "BenchTx", per_round, lambda i: tx.send_in_transaction(
                Message("BenchTx", body, tags="T", keys=f"k{i}"), commit), already=done)  # fmt: skip
            cpu2 = b.cpu_seconds()
            rounds.append({"plain": plain_rate, "tx": tx_rate, "plain_cpu": cpu1 - cpu0, "tx_cpu": cpu2 - cpu1})
    med = statistics.median
    total = per_round * ROUNDS
    return {"messages": total, "window": WINDOW, "plain_msgs_per_s": med(r["plain"] for r in rounds),
            "tx_msgs_per_s": med(r["tx"] for r in rounds), "ratio": med(r["tx"] / r["plain"] for r in rounds),
            "round_ratios": [r["tx"] / r["plain"] for r in rounds],
            "plain_broker_us_per_msg": sum(r["plain_cpu"] for r in rounds) / total * 1e6,
            "tx_broker_us_per_msg": sum(r["tx_cpu"] for r in rounds) / total * 1e6}  # fmt: skip


async def _pull_all(b: BrokerProcess, c: PullConsumer, topic: str, expression: str, expression_type: str) -> dict:
    """Read the whole queue; messages per second and the broker's CPU microseconds per delivered message."""
    mq = (await c.fetch_queues(topic))[0]
    offset, got = 0, 0
    cpu0, t0 = b.cpu_seconds(), time.perf_counter()
    while True:
        r = await c.pull(mq, offset, 32, expression, expression_type)
        if r.status is PullStatus.NO_NEW_MSG:
            break
        got += len(r.messages)
        offset = r.next_begin_offset
    wall, cpu = time.perf_counter() - t0, b.cpu_seconds() - cpu0
    return {"msgs_per_s": got / wall, "messages": got, "broker_us_per_msg": cpu / got * 1e6}


async def filter_phase(b: BrokerProcess) -> dict:
    topic = "BenchFilter"
    await _create(b, topic, 1)
    total = _n(FILTER_COUNT)
    body = b"y" * BODY
    async with Producer("bench_filter", b.namesrv_addr) as p, PullConsumer("bench_filter", b.namesrv_addr) as c:
        def one(i: int):
            red = i % 2 == 0
            return p.send(Message(topic, body, tags="TagA" if red else "TagB", keys=f"k{i}",
                                  properties={"color": "red" if red else "blue", "n": str(i)}))  # fmt: skip

        print("  [filling the queue]", flush=True)
        await _rate(c, topic, total, one)
        tag, sql = [], []
        for _ in range(ROUNDS):
            print("  [pull, tag filter / SQL92 filter]", flush=True)
            tag.append(await _pull_all(b, c, topic, "TagA", "TAG"))
            sql.append(await _pull_all(b, c, topic, "color = 'red' AND n >= 0", "SQL92"))
    assert {r["messages"] for r in tag + sql} == {total // 2 + total % 2}, (tag, sql)
    # The machine is shared: a round's two pulls run back to back, so their ratio is the fairest figure; the
    # median over the rounds is reported (and the broker's CPU per message, which a busy neighbour disturbs less).
    ratios = [q["msgs_per_s"] / t["msgs_per_s"] for t, q in zip(tag, sql, strict=True)]
    med = statistics.median
    return {"messages_in_queue": total, "matching": tag[0]["messages"],
            "tag_msgs_per_s": med(r["msgs_per_s"] for r in tag), "sql92_msgs_per_s": med(r["msgs_per_s"] for r in sql),
            "ratio": med(ratios), "round_ratios": ratios,
            "tag_broker_us_per_msg": med(r["broker_us_per_msg"] for r in tag),
            "sql92_broker_us_per_msg": med(r["broker_us_per_msg"] for r in sql)}  # fmt: skip


def print_report(r: dict) -> None:
    m = r["machine"]
    print(f"machine: {m['nproc']} cores, {m['memory_gib']} GiB, {m['cpu']}, Python {m['python']}, {m['date']}")
    print(f"BENCH_SCALE={m['bench_scale']}; 1 KiB bodies, ASYNC_FLUSH, {WINDOW} in flight on 1 connection\n")
    t = r["tx"]
    print(f"plain send                     {t['plain_msgs_per_s']:>10,.0f} msgs/s  broker "
          f"{t['plain_broker_us_per_msg']:.1f} us/msg  ({t['messages']:,} messages, until consumable)")  # fmt: skip
    print(f"transactional send + commit    {t['tx_msgs_per_s']:>10,.0f} msgs/s  broker "
          f"{t['tx_broker_us_per_msg']:.1f} us/msg  = {t['ratio']:.2f} of plain (median of the rounds' ratios "
          f"{', '.join(f'{r:.2f}' for r in t['round_ratios'])})")  # fmt: skip
    f = r["filter"]
    print(f"\npull, tag filter 'TagA'        {f['tag_msgs_per_s']:>10,.0f} msgs/s  broker "
          f"{f['tag_broker_us_per_msg']:.1f} us/msg  ({f['matching']:,} of {f['messages_in_queue']:,} match; "
          f"medians of {ROUNDS} rounds)")  # fmt: skip
    print(f"pull, SQL92 filter             {f['sql92_msgs_per_s']:>10,.0f} msgs/s  broker "
          f"{f['sql92_broker_us_per_msg']:.1f} us/msg  = {f['ratio']:.2f} of tag (median of the rounds' ratios "
          f"{', '.join(f'{r:.2f}' for r in f['round_ratios'])})")  # fmt: skip
    print("\ntargets")
    for name, ok, got, want in r["targets"]:
        print(f"  {name:<48} {'met' if ok else 'NOT met':<8} {got:.2f} (target {want})")


def main() -> dict:
    with tempfile.TemporaryDirectory(prefix="mqlake-bench-txsql-", dir="/tmp") as d:
        t0 = time.perf_counter()
        results: dict = {"machine": machine()}
        b = BrokerProcess(Path(d), extra={"enablePropertyFilter": "true"})
        try:
            async def go() -> None:
                await b.wait_ready()
                results["tx"] = await tx_phase(b)
                results["filter"] = await filter_phase(b)

            run(go())
        finally:
            b.stop()
        results["targets"] = [
            ("transactional send + commit / plain send", results["tx"]["ratio"] >= TARGET_RATIO,
             results["tx"]["ratio"], TARGET_RATIO),
            ("SQL92-filtered pull / tag-filtered pull", results["filter"]["ratio"] >= TARGET_RATIO,
             results["filter"]["ratio"], TARGET_RATIO),
        ]  # fmt: skip
        results["wall_seconds"] = time.perf_counter() - t0
    return emit("bench_tx_sql92", results, print_report)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()

"""The cost of the plain ACL and of TLS: single-send throughput against three brokers in one run —
plain, ``aclEnable=true`` (every request signed by the client and checked by the broker), and
``tls.server.mode=enforcing`` (NameServer and broker).

Run: ``.venv/bin/python -m benchmarks bench_security`` (or ``make bench``).

Environment:
  BENCH_SCALE    multiplies the message counts (default 1.0; 0.1 for a smoke run)
  BENCH_JSON     a path: also write the JSON results there

What is measured, exactly:
  * Each broker is ``mqlake up`` in its own process (ASYNC_FLUSH, a temporary store, free ports); all three run
    at once and the load generator (this process, uvloop) measures them in turn, ``ROUNDS`` rounds in an
    interleaved order, so that a change in the machine's load hits every variant alike. A variant's figure is
    the median of its rounds, with the slowest and fastest round beside it.
  * One ``Producer`` per broker, 1 connection, ``Producer.send`` coroutines kept ``WINDOW`` in flight; 1 KiB
    bodies with TAGS and KEYS; topic ``BenchTopic`` with 8 queues, round-robin.
  * ACL: the producer's account has ``defaultTopicPerm: PUB``; the client signs each request (HmacSHA1 over its
    ext fields and body) and the broker recomputes the signature and checks the topic permission.
  * TLS: a self-signed certificate made for the run; the client does not verify it (RocketMQ's default
    ``tls.client.authServer=false``), so the cost measured is the encryption, not certificate checks.
  * Beside each rate, ``broker µs/msg``: the broker process's CPU seconds (``/proc/<pid>/stat``) per message
    over the round. Unlike the rate it does not depend on how much of the machine other jobs take, so the
    ACL's and TLS's own cost shows in it even on a busy machine.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.bench_broker import QUEUES, TOPIC, WARMUP, BrokerProcess, _n, send_rate
from benchmarks.report import emit, machine
from broker.client import Admin, Producer
from broker.remoting.loop import run
from broker.remoting.signing import Credentials
from broker.remoting.tls import client_context
from tests.tls_certs import self_signed

COUNT = 20_000
WINDOW = 128
ROUNDS = 5
ACL_YAML = """\
accounts:
- accessKey: bench-admin
  secretKey: bench-admin-secret
  admin: true
- accessKey: bench-producer
  secretKey: bench-producer-secret
  defaultTopicPerm: PUB
  defaultGroupPerm: SUB
"""


def variants(root: Path) -> dict[str, tuple[dict[str, str], dict, dict]]:
    """name -> (broker.conf keys, the admin's client options, the producer's client options)."""
    home = root / "rocketmq_home"
    (home / "conf").mkdir(parents=True)
    (home / "conf" / "plain_acl.yml").write_text(ACL_YAML)
    cert, key = self_signed(root / "certs")
    tls = {"ssl_context": client_context()}
    return {
        "plain": ({}, {}, {}),
        "acl": ({"aclEnable": "true", "rocketmqHome": str(home)},
                {"credentials": Credentials("bench-admin", "bench-admin-secret")},
                {"credentials": Credentials("bench-producer", "bench-producer-secret")}),
        "tls": ({"tls.server.mode": "enforcing", "tls.server.certPath": str(cert), "tls.server.keyPath": str(key)},
                tls, tls),
    }  # fmt: skip


async def prepare(b: BrokerProcess, admin_opts: dict, producer_opts: dict) -> Producer:
    await b.wait_ready()
    async with Admin(b.namesrv_addr, **admin_opts) as admin:
        await admin.create_topic(TOPIC, broker_addr=b.broker_addr, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
    producer = await Producer("bench_security", b.namesrv_addr, **producer_opts).start()
    deadline = time.monotonic() + 30
    while len(await producer.publish_queues(TOPIC, refresh=True)) < QUEUES:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{TOPIC} route never showed {QUEUES} queues")
        await asyncio.sleep(0.2)
    await send_rate(producer, _n(WARMUP), 32)
    return producer


async def measure(root: Path) -> dict:
    configs = variants(root)
    brokers: dict[str, BrokerProcess] = {}
    producers: dict[str, Producer] = {}
    rates: dict[str, list[float]] = {name: [] for name in configs}
    cpu: dict[str, list[float]] = {name: [] for name in configs}
    try:
        for name, (conf, admin_opts, _) in configs.items():
            (root / name).mkdir()
            brokers[name] = BrokerProcess(root / name, extra=conf, client=admin_opts)
        for name, b in brokers.items():
            producers[name] = await prepare(b, configs[name][1], configs[name][2])
        names = list(configs)
        for r in range(ROUNDS):
            order = names[r % len(names):] + names[: r % len(names)]  # rotate who goes first
            for name in order:
                d: dict = {}
                with brokers[name].measured(d):
                    d["msgs_per_s"] = await send_rate(producers[name], _n(COUNT), WINDOW)
                rates[name].append(d["msgs_per_s"])
                cpu[name].append(d["broker_us_per_msg"])
                print(f"  [round {r + 1}] {name}: {d['msgs_per_s']:,.0f} msgs/s, broker {d['broker_us_per_msg']:.0f} "
                      f"us/msg, bg cpu {d['bg_cpu_cores']:.2f}", flush=True)  # fmt: skip
    finally:
        for p in producers.values():
            await p.shutdown()
        for b in brokers.values():
            b.stop()
    out: dict = {"count": _n(COUNT), "window": WINDOW, "rounds": ROUNDS, "variants": {}}
    for name, values in rates.items():
        out["variants"][name] = {"msgs_per_s": statistics.median(values), "min": min(values), "max": max(values),
                                 "broker_us_per_msg": statistics.median(cpu[name])}  # fmt: skip
    plain = out["variants"]["plain"]
    for name in ("acl", "tls"):
        v = out["variants"][name]
        v["vs_plain"] = v["msgs_per_s"] / plain["msgs_per_s"]
        v["cpu_vs_plain"] = v["broker_us_per_msg"] / plain["broker_us_per_msg"]
    return out


def print_report(results: dict) -> None:
    print(f"Single-send throughput, 1 connection, {results['window']} in flight, {results['count']:,} messages "
          f"per round, median of {results['rounds']} interleaved rounds")  # fmt: skip
    print(f"{'variant':<8} {'msgs/s':>10} {'min':>10} {'max':>10} {'vs plain':>9} {'broker us/msg':>14} "
          f"{'vs plain':>9}")  # fmt: skip
    for name, v in results["variants"].items():
        ratio = f"{v['vs_plain']:.1%}" if "vs_plain" in v else "-"
        cpu_ratio = f"{v['cpu_vs_plain']:.1%}" if "cpu_vs_plain" in v else "-"
        print(f"{name:<8} {v['msgs_per_s']:>10,.0f} {v['min']:>10,.0f} {v['max']:>10,.0f} {ratio:>9} "
              f"{v['broker_us_per_msg']:>14.1f} {cpu_ratio:>9}")  # fmt: skip


def main() -> dict:
    t0 = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="mqlake-bench-security-"))
    try:
        results = run(measure(root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results["machine"] = machine()
    results["wall_seconds"] = time.perf_counter() - t0
    return emit("bench_security", results, print_report)


if __name__ == "__main__":
    main()

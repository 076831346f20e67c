"""The common end of every benchmark: the machine it ran on, a readable report, the wall time and one
machine-readable JSON line."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

from broker.config import build_configs
from broker.remoting.loop import run
from broker.server.controller import BrokerController
from store import dispatch_loop
from store.format import native


def machine() -> dict:
    cpu = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = 0
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
                break
    return {"nproc": os.cpu_count(), "memory_gib": round(mem / 2**30, 1), "cpu": cpu,
            "python": platform.python_version(), "platform": platform.platform(),
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "bench_scale": float(os.environ.get("BENCH_SCALE", "1") or 1),
            "codecs": native.active(), "codecs_why_python": native.missing_cause,
            "dispatch": "compiled" if dispatch_loop.available() else "reference"}  # fmt: skip


def emit(name: str, results: dict, print_report: Callable[[dict], None], json_results: dict | None = None) -> dict:
    """Print the report, the wall time and ``JSON {...}`` (``json_results`` if slimmer); write ``$BENCH_JSON``."""
    print()
    print_report(results)
    print(f"\n({name} wall time {results['wall_seconds']:.1f} s)")
    print("JSON " + json.dumps(results if json_results is None else json_results, sort_keys=True, default=str))
    path = os.environ.get("BENCH_JSON")
    if path:
        Path(path).write_text(json.dumps(results, indent=2, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()
    return results


def run_on_broker(
    name: str, measure: Callable[[BrokerController], Awaitable[dict]], print_report: Callable[[dict], None],
    settings: dict[str, str] | None = None,
) -> dict:
    """``measure`` of a BrokerController started in this process (ASYNC_FLUSH, 256 MiB segments, a temporary
    store, no NameServer; broker.conf ``settings`` on top) on its event loop, then :func:`emit` of the results
    with the machine and the wall time."""
    async def on_broker(store_dir: str) -> dict:
        bc, sc = build_configs({"listenPort": "0", "storePathRootDir": store_dir, "flushDiskType": "ASYNC_FLUSH",
                                "mappedFileSizeCommitLog": str(256 * 1024 * 1024), **(settings or {})})  # fmt: skip
        controller = BrokerController(bc, sc)
        await controller.start()
        try:
            return await measure(controller)
        finally:
            await controller.shutdown()

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as d:
        results = run(on_broker(d))
    results["machine"] = machine()
    results["wall_seconds"] = time.perf_counter() - t0
    return emit(name, results, print_report)

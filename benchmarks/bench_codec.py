"""The codec twins side by side: µs per call of each twinned function, pure-Python and compiled, on the
same inputs in the same process, next to a raw baseline of the same run (``struct.unpack_from`` of one record's
TOTALSIZE and MAGICCODE: the least any reader of a record does).

Run: ``.venv/bin/python -m benchmarks bench_codec`` (a few seconds; part of ``make bench``).

Inputs are bench_store's 1 KiB messages (KEYS, TAGS, WAIT, UNIQ_KEY; 1,209-byte records).  Each figure is the best
of 5 repeats of a loop over 20,000 distinct inputs (BENCH_SCALE scales the count).
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable

from benchmarks.bench_store import TOPIC, build_messages, encode_all
from benchmarks.report import emit, machine
from store.format import native, properties

SCALE = float(os.environ.get("BENCH_SCALE", "1") or 1)
COUNT = 20_000
REPEATS = 5


def _best_us(fn: Callable[[], object], calls: int) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best / calls * 1e6


def cases(n: int) -> dict[str, tuple[str, str, Callable[[Callable], Callable[[], object]]]]:
    """name -> (module, function, a loop over the inputs given that function)."""
    msgs = build_messages(1024, n)
    recs = [bytes(r) for r in encode_all(msgs)]
    props = [m.properties for m in msgs]
    keys = [f"{TOPIC}#{properties.decode_properties(p)['UNIQ_KEY']}" for p in props]
    tags = ["TagA"] * n
    patch_buf = bytearray(recs[0])

    def loop_check(f: Callable, crc: bool) -> Callable[[], object]:
        return lambda: [f(r, 0, check_crc=crc, size=len(r)) for r in recs]

    return {
        "check_record (dispatch: no CRC)": ("store.format.records", "check_record", lambda f: loop_check(f, False)),
        "check_record (recovery: CRC)": ("store.format.records", "check_record", lambda f: loop_check(f, True)),
        "encode_record": ("store.format.records", "encode_record", lambda f: lambda: [f(m) for m in msgs]),
        "patch_record": ("store.format.records", "patch_record",
                         lambda f: lambda: [f(patch_buf, 0, i, i, i) for i in range(n)]),
        "index_key_hash (topic#UNIQ_KEY)": ("store.format.hashing", "index_key_hash",
                                            lambda f: lambda: [f(k) for k in keys]),
        "java_string_hash (tags)": ("store.format.hashing", "java_string_hash", lambda f: lambda: [f(t) for t in tags]),
        "decode_properties": ("store.format.properties", "decode_properties", lambda f: lambda: [f(p) for p in props]),
    }  # fmt: skip


def main() -> dict:
    t0 = time.perf_counter()
    n = max(100, int(COUNT * SCALE))
    results: dict = {"machine": machine(), "calls": n, "functions": {}}
    recs = [bytes(r) for r in encode_all(build_messages(1024, n))]
    unpack = struct.Struct(">ii").unpack_from
    results["raw_us"] = _best_us(lambda: [unpack(r, 0) for r in recs], n)
    for name, (module, fn_name, make) in cases(n).items():
        twins = native.TWINS[module]
        row = {"python_us": _best_us(make(twins.python[fn_name]), n)}
        if fn_name in twins.compiled:
            row["compiled_us"] = _best_us(make(twins.compiled[fn_name]), n)
        results["functions"][name] = row
    results["wall_seconds"] = time.perf_counter() - t0
    return emit("bench_codec", results, print_report)


def print_report(r: dict) -> None:
    m = r["machine"]
    print(f"machine: {m['nproc']} cores, {m['cpu']}, Python {m['python']}, {m['date']}; {r['calls']:,} inputs")
    raw = r["raw_us"]
    print(f"raw baseline: struct.unpack_from('>ii') of a record's first 8 bytes, {raw:.3f} us a call")
    print("x raw = the function's cost in raw-baseline units; speed-up = python / compiled\n")
    hdr = f"{'function':<36}{'python us':>11}{'x raw':>8}{'compiled us':>13}{'x raw':>8}{'speed-up':>10}"
    print(hdr)
    print("-" * len(hdr))
    for name, row in r["functions"].items():
        py, c = row["python_us"], row.get("compiled_us")
        tail = f"{c:>13.3f}{c / raw:>8.1f}{py / c:>10.1f}" if c else f"{'not built':>13}"
        print(f"{name:<36}{py:>11.3f}{py / raw:>8.1f}{tail}")


if __name__ == "__main__":
    main()

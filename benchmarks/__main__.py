"""Run every ``benchmarks/bench_*.py`` module's ``main()`` in name order (or only those named)."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import benchmarks


def run(selected: list[str]) -> int:
    names = sorted(m.name for m in pkgutil.iter_modules(benchmarks.__path__) if m.name.startswith("bench_"))
    if selected:
        unknown = sorted(set(selected) - set(names))
        if unknown:
            print(f"unknown benchmarks: {', '.join(unknown)} (have: {', '.join(names) or 'none'})")
            return 2
        names = [n for n in names if n in selected]
    if not names:
        print("no benchmarks")
        return 0
    for name in names:
        print(f"== {name}", flush=True)
        importlib.import_module(f"benchmarks.{name}").main()
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))

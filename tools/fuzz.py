"""Differential fuzzing of the codec twins with atheris (`make fuzz`): every target of tests/differential.py,
each in its own process, for FUZZ_RUNS inputs (default one million), coverage-guided by the Python twin.

    python tools/fuzz.py                 # every target, one after another
    python tools/fuzz.py check_record    # one target; extra arguments go to libFuzzer (-max_len=..., a corpus dir)

A disagreement or a crash stops the target with the input that caused it (libFuzzer writes ``crash-*``);
exits non-zero when any target failed.  Run from the project root.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = os.environ.get("FUZZ_RUNS")  # unset: a million, or the target's own count (differential.FUZZ_RUNS)


def fuzz_one(target: str, runs: int, extra: list[str]) -> None:
    """In this process: hand the target to atheris (it never returns)."""
    import atheris

    sys.path.insert(0, str(ROOT))
    with atheris.instrument_imports(include=["store.format", "broker.remoting"]):
        from tests import differential
    atheris.Setup([sys.argv[0], f"-runs={runs}", "-max_len=512", *extra], differential.TARGETS[target])
    atheris.Fuzz()


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--child":
        fuzz_one(argv[1], int(argv[2]), argv[3:])
        return 0
    sys.path.insert(0, str(ROOT))
    from tests import differential

    targets = [a for a in argv if not a.startswith("-")] or sorted(differential.TARGETS)
    extra = [a for a in argv if a.startswith("-")]
    failed = []
    for target in targets:
        runs = int(RUNS) if RUNS else differential.FUZZ_RUNS.get(target, 1_000_000)
        started = time.monotonic()
        print(f"fuzz {target}: {runs:,} inputs", flush=True)
        done = subprocess.run([sys.executable, __file__, "--child", target, str(runs), *extra], cwd=ROOT)
        took = time.monotonic() - started
        status = "ok" if done.returncode == 0 else f"FAILED (exit {done.returncode})"
        print(f"fuzz {target}: {status} in {took:.0f} s", flush=True)
        if done.returncode != 0:
            failed.append(target)
    if failed:
        print(f"fuzz: {', '.join(failed)} failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The common end of every benchmark: a readable report, the wall time and one machine-readable JSON line."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path


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

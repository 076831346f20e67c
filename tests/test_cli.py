"""The ``mqlake`` console script, run as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

MQLAKE = Path(sys.executable).with_name("mqlake")


def test_up_prints_plan_and_exits_0(tmp_path: Path) -> None:
    out = subprocess.run([MQLAKE, "up"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "NameServer  127.0.0.1:9876" in out.stdout
    assert "Broker      127.0.0.1:10911" in out.stdout and ".mqlake/store" in out.stdout


def test_store_group_is_registered() -> None:
    out = subprocess.run([MQLAKE, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "store" in out.stdout and "up" in out.stdout

"""The ``mqlake`` console script, run as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

MQLAKE = Path(sys.executable).with_name("mqlake")


def test_up_documents_its_options(tmp_path: Path) -> None:
    # `mqlake up` itself runs until stopped (tests/test_broker_cli.py runs it); here only its help.
    out = subprocess.run([MQLAKE, "up", "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for option in ("--config", "--namesrv-port", "--broker-port", "--store-dir"):
        assert option in out.stdout
    assert "9876" in out.stdout and "10911" in out.stdout and ".mqlake/store" in out.stdout


def test_store_group_is_registered() -> None:
    out = subprocess.run([MQLAKE, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "store" in out.stdout and "up" in out.stdout

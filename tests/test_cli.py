"""The ``mqlake`` console script, run as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import cli_env

pytestmark = pytest.mark.integration

MQLAKE = Path(sys.executable).with_name("mqlake")


def mqlake(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([MQLAKE, *args], cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=60)


def test_up_documents_its_options(tmp_path: Path) -> None:
    # `mqlake up` itself runs until stopped (tests/test_broker_cli.py runs it); here only its help.
    out = mqlake("up", "--help", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    for option in ("--config", "--namesrv-port", "--broker-port", "--store-dir"):
        assert option in out.stdout
    assert "9876" in out.stdout and "10911" in out.stdout and ".mqlake/store" in out.stdout


def test_store_group_is_registered() -> None:
    # The group and its commands answer their own help; a name that is not registered is a usage error (2),
    # so a missing registration fails here whatever the app's description says.
    for args in (("store", "--help"), ("store", "dump", "--help"), ("up", "--help")):
        out = mqlake(*args)
        assert out.returncode == 0, (args, out.stdout + out.stderr)
    assert "dump" in mqlake("store", "--help").stdout
    unknown = mqlake("no-such-group", "--help")
    assert unknown.returncode == 2 and "no-such-group" in unknown.stdout + unknown.stderr

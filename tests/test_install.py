"""The install step ``make up`` and ``make test`` run first, as a newcomer sees it in a fresh clone.

A first install downloads Spark, Airflow and the rest for minutes; the test gives the new virtual environment this
checkout's packages through a ``.pth`` file, so pip finds every dependency satisfied and still builds and installs
mqlake itself (the compiled twins included) with its own output, as on a first run.
"""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.helpers import cli_env

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_the_install_step_shows_each_step_with_pips_output_and_its_time(tmp_path):
    clone = tmp_path / "mqlake"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=120)
    subprocess.run([sys.executable, "-m", "venv", str(clone / ".venv")], check=True, timeout=300)
    site = Path(sysconfig.get_paths(vars={"base": str(clone / ".venv"), "platbase": str(clone / ".venv")})["purelib"])
    (site / "_shared_checkout.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = cli_env()
    env.pop("MAKEFLAGS", None)
    env.pop("PYTHONPATH", None)
    done = subprocess.run(["make", ".venv/.installed"], cwd=clone, env=env, capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("==> .venv: Python packages"))
    pip_line = re.compile(r"(Requirement already satisfied|Successfully installed|Building|Obtaining|Collecting)")
    pip_lines = [i for i, line in enumerate(lines) if pip_line.match(line.strip())]
    finished = [i for i, line in enumerate(lines) if re.fullmatch(r"==> \.venv done in \d+ s", line)]
    assert pip_lines and finished, out[-4000:]
    assert start < pip_lines[0] and pip_lines[-1] < finished[0], "the step's line, pip's own lines, then its time"
    assert any("Successfully installed" in line and "mqlake" in line for line in lines)
    assert (clone / ".venv/.installed").exists()
    # What was installed is the clone's mqlake, compiled twins and all.
    probe = subprocess.run([str(clone / ".venv/bin/python"), "-c",
                            "import store.format.native as n, store; print(store.__file__, n.active())"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    path, built = probe.stdout.split()
    assert Path(path).is_relative_to(clone) and built == "compiled"

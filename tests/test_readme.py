"""README.md as a newcomer follows it: its ``sh`` blocks, in order, in a fresh clone of the repository, and every
``python`` block as pasted against a live broker.

The fresh clone reuses this checkout's virtual environments, fetched jars, generated gRPC stubs and compiled
twins (symlinks and copies) and ages its install inputs, so ``make up`` finds its stamps current and installs
nothing; ``UP_ARGS`` and ``NAMESRV_ADDR`` move the servers to free ports, as the README's commands take them.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from broker.embedded import ready_address
from tests.helpers import cli_env, kill_process_tree, wait_until

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.S | re.M)
# What `make up` reads to decide whether to install: made older than the stamps of the shared venv and jars.
INSTALL_INPUTS = ("pyproject.toml", "constraints.txt", "setup.py", "tools/gen_grpc_stubs.py", "tools/peers")
GENERATED = ("broker/proxy/v2/*_pb2*.py", "broker/proxy/v2/*_pb2.pyi", "store/_*.so", "store/format/_*.so",
             "broker/remoting/_*.so", "pipelines/index_rebuild/_*.so")  # fmt: skip
OLD = 946_684_800  # 2000-01-01


def blocks(language: str) -> list[str]:
    return [body for lang, body in BLOCK.findall(README.read_text()) if lang == language]


def _fresh_clone(dest: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(REPO), str(dest)], check=True, timeout=120)
    for link in (".venv", ".venv-rmq5", ".peers"):
        (dest / link).symlink_to((REPO / link).resolve())
    for pattern in GENERATED:
        for f in REPO.glob(pattern):
            shutil.copy2(f, dest / f.relative_to(REPO))
            os.utime(dest / f.relative_to(REPO))  # newer than the aged generator
    for name in INSTALL_INPUTS:
        for f in [dest / name, *(dest / name).rglob("*")]:
            if f.exists():
                os.utime(f, (OLD, OLD))
    twins = [*REPO.glob("store/**/_*.p*"), *REPO.glob("broker/remoting/_*.p*"), *REPO.glob("pipelines/**/_*.p*")]
    for source in twins:
        if source.suffix in (".pyx", ".pxd"):
            os.utime(dest / source.relative_to(REPO), (OLD, OLD))
    return dest


@pytest.mark.spark
@pytest.mark.timeout(1800)
def test_the_first_hour_sh_blocks_run_as_written_in_a_fresh_clone(tmp_path):
    sh = blocks("sh")
    assert sh and "make up" in sh[0], "the README's first sh block starts the broker"
    clone = _fresh_clone(tmp_path / "mqlake")
    # every port the OS's pick (the broker's HA port too), learnt from the log: a port chosen here could be taken
    env = cli_env(PYTHONPATH=str(clone), UP_ARGS="--namesrv-port 0 --broker-port 0 --no-proxy",
                  MQLAKE_LOG_DIR=str(tmp_path / "logs"))  # fmt: skip
    env.pop("MAKEFLAGS", None)
    log = tmp_path / "make-up.log"
    with log.open("wb") as out:
        up = subprocess.Popen(["sh", "-ec", sh[0]], cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT,
                              start_new_session=True)  # fmt: skip
    try:
        # the server's line (with its address), not the box's mention of it
        wait_until(lambda: ready_address(log.read_text(), "Broker") or up.poll() is not None, 120,
                   what="make up ready")  # fmt: skip
        text = log.read_text()
        assert up.poll() is None, text
        learnt = ready_address(text, "NameServer")
        assert learnt is not None, text
        env["NAMESRV_ADDR"] = learnt  # the sh blocks' client commands read it
        assert "pip install" not in text and "mvn " not in text, text  # the stamps held: nothing installed
        assert ".venv/bin/mqlake send" in text and ".mqlake/lake" in text  # the box of next steps
        outputs = []
        for block in sh[1:]:
            done = subprocess.run(["sh", "-ec", block], cwd=clone, env=env, capture_output=True, text=True,
                                  timeout=1200)  # fmt: skip
            assert done.returncode == 0, (block, done.stdout, done.stderr)
            outputs.append(done.stdout)
        joined = "\n".join(outputs)
        assert "SEND_OK" in joined and "BODY: first message" in joined  # sent, then read back
        assert re.search(r"step 5/5: replay .*\n(.*\n)*?-- step 5 took", joined)  # the demo's last step ran
        assert (clone / ".mqlake" / "store" / "commitlog").is_dir()  # make up's store, where the box says
        assert "great_expectations" not in joined  # the tier step's console is the job's own lines
    finally:
        os.killpg(up.pid, signal.SIGTERM)
        try:
            up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            kill_process_tree(up.pid)
            up.wait()


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_every_python_block_runs_as_pasted_against_a_live_broker(mqlake_server, tmp_path):
    python = blocks("python")
    assert python, "README.md has python blocks"
    for i, code in enumerate(python):
        ast.parse(code)  # a block is a whole program, not a fragment
        script = tmp_path / f"block{i}.py"
        script.write_text(code)
        env = cli_env(PYTHONPATH=str(REPO), NAMESRV_ADDR=mqlake_server.namesrv_addr)
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                              timeout=120, env=env)  # fmt: skip
        assert done.returncode == 0, (code, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr

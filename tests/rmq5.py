"""Running the official RocketMQ 5.x Python client (``tests/rmq5_client.py``) from its own virtual environment.

``make install`` creates ``.venv-rmq5`` with PyPI ``rocketmq-python-client``; its package ``rocketmq`` would
shadow the 4.x C++ client's in this interpreter, so each call is a subprocess printing one JSON document.
The client writes its log under ``$HOME/logs``: each call gets the test's own directory as HOME.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON = REPO / ".venv-rmq5" / "bin" / "python"
SCRIPT = Path(__file__).with_name("rmq5_client.py")


def client(command: str, endpoint: str, home: Path, *args: str, timeout: float = 120.0,
           trust: Path | None = None) -> dict:
    """Run one ``rmq5_client.py`` command against ``endpoint``; its JSON output, or AssertionError with stderr.
    ``trust``: a CA certificate: the client speaks TLS and trusts it (gRPC's default-roots variable)."""
    if not PYTHON.exists():
        raise AssertionError(f"{PYTHON} is missing: run `make install` (it creates the 5.x client's environment)")
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HOME": str(home)}
    if trust is not None:
        env["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = str(trust)
        args = (*args, "--tls")
    proc = subprocess.run([str(PYTHON), str(SCRIPT), command, "--endpoint", endpoint, *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=home)  # fmt: skip
    if proc.returncode != 0:
        log = "\n".join(p.read_text(errors="replace")[-3000:] for p in home.glob("logs/**/*.log"))
        raise AssertionError(f"rmq5_client {command} exited {proc.returncode}:\n{proc.stderr[-4000:]}\n{log}")
    return json.loads(proc.stdout)

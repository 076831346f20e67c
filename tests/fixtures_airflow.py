"""The Airflow fixture: ``airflow_home`` (session scope), the environment of every child process that runs a DAG
(tests/airflow_run.py): a temporary AIRFLOW_HOME migrated once for the whole run (``airflow db migrate`` takes
most of a minute), with this repo's DAG folder. Each DAG run is its own DagRun in it, so the tests share it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory) -> dict[str, str]:
    """The environment of every child: a migrated temporary AIRFLOW_HOME with this repo's DAG folder."""
    home = tmp_path_factory.mktemp("airflow_home")
    env = {
        k: v for k, v in os.environ.items()
        if not k.startswith(("AIRFLOW", "MQLAKE_"))  # nothing from the developer's own Airflow or shell
    }  # fmt: skip
    env |= {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "airflow_dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # spark-submit, as `make airflow` sets it
        "JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1",  # the JVM starts ~2 s faster; speed is not tested here
    }
    subprocess.run([str(BIN / "airflow"), "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    return env

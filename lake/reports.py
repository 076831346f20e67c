"""The jobs' JSON run reports: one name for each, whatever started the run.

A run of the tier, verify-index or replay job, started by ``mqlake``, by an Airflow DAG or by the broker's own
tier schedule, leaves ``<reports dir>/<job>-<run>.json`` (:func:`report_path`; the directory is
:func:`lake.objectstore.reports_dir`), and the broker's ``/metrics`` reads the newest of each job by that
name (:func:`report_job`).  What started a run shows in ``<run>`` only (the DAGs' runs are ``airflow-...``).
"""

from __future__ import annotations

import os
from pathlib import Path

from lake.objectstore import reports_dir

JOBS = ("tier", "verify", "replay")
SUFFIX = ".json"


def report_path(lake: str | os.PathLike[str], job: str, run: str) -> Path:
    """Where run ``run`` of ``job`` (one of :data:`JOBS`) writes its report for the lake ``lake``."""
    if job not in JOBS:
        raise ValueError(f"job {job!r} is not one of {JOBS}")
    return reports_dir(lake) / f"{job}-{run}{SUFFIX}"


def report_job(file_name: str) -> str | None:
    """The job whose report a file of the reports directory is (None: not a run report)."""
    job, sep, run = file_name.partition("-")
    return job if sep and run.endswith(SUFFIX) and job in JOBS else None

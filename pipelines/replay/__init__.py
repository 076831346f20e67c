"""Replay history (the Delta ``messages`` table and the live CommitLog) into a new topic through the broker:
ordered per source queue, rate limited, resumable without duplicates: the ``mqlake replay`` command
(``python -m pipelines.replay``), run by the ``mqlake_replay`` Airflow DAG; the job is
:func:`pipelines.replay.job.replay`.

Imports here stay light (no pyspark), so the CLI starts fast.
"""

from pipelines.replay.spec import ReplaySpec, ReplaySpecError

__all__ = ["ReplaySpec", "ReplaySpecError"]

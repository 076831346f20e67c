"""Tier expired CommitLog segments into the lake's Delta tables and keep them compact: the ``mqlake tier``
command (``python -m pipelines.compaction``; ``--compact`` compacts), run by the ``mqlake_tier`` Airflow DAG
and by the broker's own tier schedule.  See :mod:`pipelines.compaction.job`."""

"""Rebuild ConsumeQueue and IndexFile from the CommitLog with Spark; verify the live files; repair them: the
``mqlake verify-index`` command (``python -m pipelines.index_rebuild``), run by the ``mqlake_verify_index``
Airflow DAG, and ``mqlake store adopt-index``, which installs a repair.

``verify_index`` (job.py) is the entry point; ``adopt_index`` (adopt.py) installs a repair.
"""

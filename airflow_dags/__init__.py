"""Airflow DAGs for mqlake: ``mqlake_tier``, ``mqlake_verify_index`` and ``mqlake_replay``.

This directory is both the DAG folder (``make airflow`` points Airflow's ``dags_folder`` here) and an
installed package, so the DAG files share ``airflow_dags.config`` and ``airflow_dags.spark_job``.
"""

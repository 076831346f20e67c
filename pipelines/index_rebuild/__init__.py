"""Rebuild ConsumeQueue and IndexFile from the CommitLog with Spark; verify the live files; repair them.

``verify_index`` (job.py) is the entry point; ``adopt_index`` (adopt.py) installs a repair.
"""

"""``python -m pipelines.compaction``: the same command as ``mqlake tier``."""

from pipelines.compaction.cli import main

main()

"""Tier expired CommitLog segments into Delta (``mqlake tier`` / ``python -m pipelines.compaction``) and
keep the tier's tables compact (``--compact``).  See :mod:`pipelines.compaction.job`."""

"""Tiered history served by the broker: the Delta tables under ``lakePath`` read back as CommitLog records."""

"""The broker's side of the lake: its own tier schedule.  Reading the tiered history is lake/'s (lake.reader)."""

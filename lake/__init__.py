"""The lake: the tier's Delta tables, between the native store (below) and the broker and the Spark jobs (above).

The table names and the one schema every reader and writer takes its columns from, the codecs between
CommitLog records and table rows, the object-store settings, the Delta commit and read helpers (delta-rs, no
Spark), and the broker's reader of tiered history with its cache and cursors.
"""

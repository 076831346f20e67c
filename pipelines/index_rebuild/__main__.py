"""``python -m pipelines.index_rebuild --store-dir DIR ...``: the same command as ``mqlake verify-index``."""

from pipelines.index_rebuild.cli import main

main()

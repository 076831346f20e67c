"""``python -m cli``: the same program as ``mqlake``."""

from cli.main import main

main()

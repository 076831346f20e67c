"""The ``--lake`` option of the pipeline commands: a local directory or an ``s3://bucket/prefix`` URI."""

from __future__ import annotations

from pathlib import Path

import typer

from lake.objectstore import ObjectStoreError, lake_location


def lake_option(value: str | Path) -> str | Path:
    """``--lake`` as the jobs take it (an ``s3://`` URI stays text: ``Path`` would fold its ``//``)."""
    try:
        return lake_location(value)
    except ObjectStoreError as e:
        raise typer.BadParameter(str(e), param_hint="--lake") from None

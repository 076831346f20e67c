"""``mqlake lake schema set|show|rebuild``: declare a topic's body schema, show it, rebuild its typed table from
``messages`` (lake/typed.py, lake/typed_tables.py; docs/lake.md, "Typed tables").

Only typer is imported here: pyarrow, the schema libraries and delta-rs load when a command runs.  A declaration
that cannot be used, or an incompatible change, ends as one ``error:`` line (exit 1), changing nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipelines.objectstore_cli import lake_option
from store.console import console, print_error

schema_app = typer.Typer(
    help="Typed tables: a topic's declared body schema (JSON Schema, Avro, Protobuf) and its typed table.",
    no_args_is_help=True,
)
LakeOption = Annotated[str, typer.Option("--lake", help="The lake directory or s3://bucket/prefix.")]
TopicArg = Annotated[str, typer.Argument(help="The topic.")]


@schema_app.command("set")
def set_command(
    topic: TopicArg,
    file: Annotated[
        Path,
        typer.Argument(help="The schema: .json (JSON Schema), .avsc (Avro) or .desc (Protobuf descriptor set, "
                       "protoc --include_imports --descriptor_set_out).", exists=True, dir_okay=False),
    ],  # fmt: skip
    lake: LakeOption,
    message: Annotated[
        str | None,
        typer.Option("--message", help="Protobuf: the message type's full name (needed when the set has several)."),
    ] = None,
) -> None:
    """Declare or change TOPIC's body schema; a compatible change (an added optional field) adds its columns."""
    from lake import delta as lk
    from lake import tables, typed

    location = lake_option(lake)
    try:
        added = typed.declare(location, topic, typed.kind_of(file), file.read_bytes(), message)
    except typed.SchemaError as e:
        print_error(e)
        raise typer.Exit(1) from None
    kind = typed.kind_of(file)
    out = console()
    out.print(f"{topic}: {kind} schema declared ({typed.schemas_location(location)})", highlight=False)
    if added:
        out.print(f"columns added to the typed table: {', '.join(added)}", highlight=False)
    if not lk.is_table(tables.typed_table_uri(location, topic)):
        out.print(f"the next tier run types {topic}'s new rows; `mqlake lake schema rebuild {topic} --lake {lake}` "
                  "types what is tiered already", highlight=False)  # fmt: skip


@schema_app.command("show")
def show_command(topic: TopicArg, lake: LakeOption) -> None:
    """TOPIC's declared schema: kind, columns and where its typed table is."""
    from lake import delta as lk
    from lake import tables, typed

    location = lake_option(lake)
    schema = typed.load(location, topic)
    if schema is None:
        raise typer.BadParameter(f"{topic} has no declared schema under {location}", param_hint="TOPIC")
    out = console()
    uri = tables.typed_table_uri(location, topic)
    out.print(f"topic: {topic}\nkind: {schema.kind}" + (f"\nmessage: {schema.message}" if schema.message else ""),
              highlight=False)  # fmt: skip
    out.print(f"typed table: {uri}" + ("" if lk.is_table(uri) else " (none yet)"), highlight=False)
    for f in schema.fields:
        out.print(f"  {f.name}: {f.type}{'' if f.nullable else ' (required)'}", highlight=False)


@schema_app.command("rebuild")
def rebuild_command(topic: TopicArg, lake: LakeOption) -> None:
    """Rewrite TOPIC's typed table (and its decode_errors rows) from every row the messages table holds."""
    from lake.typed_tables import rebuild

    done = rebuild(lake_option(lake), topic)
    console().print(f"{topic}: {done.rows} typed rows, {done.errors} decode errors", highlight=False)

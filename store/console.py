"""Terminal output for every command: ``mqlake`` and the pipelines' ``python -m`` entry points.

In a terminal, rich behaves as usual (the terminal's width, colour), and table cells fold rather than being
cut.  Anywhere else — a pipe, a file, an Airflow task log, CI — every value is printed in full: no width
limit, so no table cell ends in ``…`` and no line is wrapped mid-phrase; each row and each error is one line
that a reader or ``grep`` finds whole.  Usage errors follow the same rule (typer's boxed panel in a
terminal, click's plain lines elsewhere).  Rich markup is off: a value such as ``[topicName=T]`` or a body
with brackets prints as it is; style goes through ``style=`` or :func:`styled`.

It lives in the lowest layer, as store/errors.py does, so that the commands of every layer share this one.
"""

from __future__ import annotations

import sys
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from store.errors import MQLakeError

if TYPE_CHECKING:
    import typer

# Columns outside a terminal: wider than any value, so rich never wraps, crops or ellipsizes one.
UNLIMITED_WIDTH = 1_000_000


def console(file: TextIO | None = None, *, stderr: bool = False) -> Console:
    """A rich Console on ``file`` (default stdout, or stderr): the terminal's width in a terminal, unlimited
    (no wrapping, no cropping) anywhere else.  Build one per command run, so that the streams in effect then
    apply (test runners swap them)."""
    out = Console(file=file, stderr=stderr, markup=False)
    if out.is_terminal:
        return out
    return Console(file=file, stderr=stderr, markup=False, width=UNLIMITED_WIDTH, soft_wrap=True)


def styled(*parts: str | tuple[str, str]) -> Text:
    """One line from plain strings and ``(text, style)`` pairs, e.g. ``styled(("error:", "red"), " ", msg)``."""
    return Text.assemble(*parts)


def table(*columns: str, title: str | None = None, **kwargs: Any) -> Table:
    """A rich Table whose cells are never cut: in a narrow terminal a long value folds onto more lines.

    When stdout is not a terminal the table has no box: a header line and one line per row, columns padded and
    two spaces apart, as mqadmin prints them, so ``grep``, ``awk`` and ``cut`` read it."""
    if not console().is_terminal:
        kwargs = {"box": None, "show_edge": False, "pad_edge": False, **kwargs}
    t = Table(title=title, **kwargs)
    for name in columns:
        t.add_column(name, overflow="fold")
    return t


def time_text(ms: int) -> str:
    """An epoch-millisecond timestamp as mqadmin prints one (``UtilAll.timeMillisToHumanString2``): local time,
    ``yyyy-MM-dd HH:mm:ss,SSS``; ``-`` for none."""
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3] if ms > 0 else "-"


def print_error(message: object) -> None:
    """``error: <message>`` on stderr."""
    console(stderr=True).print(styled(("error:", "red"), " ", str(message)), highlight=False)


def _show_plain(e: Exception) -> None:
    """click's plain usage error, with the ``error:`` every other error line of mqlake starts with."""
    ctx = getattr(e, "ctx", None)
    out = sys.stderr
    if ctx is not None:
        print(ctx.get_usage(), file=out)
        if ctx.command.get_help_option(ctx) is not None:
            print(f"Try '{ctx.command_path} {ctx.help_option_names[0]}' for help.\n", file=out)
    format_message = getattr(e, "format_message", None)
    print(f"error: {format_message() if format_message else e}", file=out)


def run_app(app: typer.Typer, args: list[str] | None = None) -> NoReturn:
    """Run ``app`` as a program and exit with its code.

    Usage errors (exit 2) print as typer's panel in a terminal and as click's plain lines elsewhere; an
    :class:`MQLakeError` a command did not handle prints one ``error:`` line and exits 1.
    """
    import typer
    from typer._click import ClickException  # typer vendors click; what its own main catches has no public name

    try:
        code = app(args=args, standalone_mode=False)
    except ClickException as e:  # usage errors, bad parameters
        # NoArgsIsHelpError: building it printed the help already, as typer itself leaves it
        if type(e).__name__ != "NoArgsIsHelpError":
            if console(stderr=True).is_terminal:
                from typer import rich_utils

                rich_utils.rich_format_error(e)
            else:
                _show_plain(e)
        sys.exit(e.exit_code)
    except typer.Abort:
        print_error("aborted")
        sys.exit(1)
    except MQLakeError as e:
        print_error(e)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)

"""store/console.py, the one output path of every command: outside a terminal every value is printed whole, on
one line, whatever COLUMNS says; inside a terminal a table cell folds instead of being cut; values are never
read as rich markup; usage errors outside a terminal are click's plain lines."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from rich.console import Console

from store.console import console, print_error, table

LONG_TOPIC = "Topic" + "x" * 160 + "End"
LONG_PATH = "/data/" + "/".join(["a-rather-long-directory-name"] * 12) + "/store"


def _render(out: io.StringIO, rows: list[tuple[str, ...]]) -> str:
    t = table("kind", "topic/queue", "file", title="mismatches")
    for row in rows:
        t.add_row(*row)
    console(file=out).print(t)
    return out.getvalue()


@pytest.mark.unit
def test_outside_a_terminal_table_rows_and_lines_are_whole_whatever_columns_says(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")  # rich would otherwise lay the table out in 40 columns
    text = _render(io.StringIO(), [("ConsumeQueue", f"{LONG_TOPIC}-3", f"{LONG_PATH}/consumequeue/x/3/0")])

    assert "…" not in text
    row = next(line for line in text.splitlines() if "ConsumeQueue" in line)
    assert f"{LONG_TOPIC}-3" in row and f"{LONG_PATH}/consumequeue/x/3/0" in row
    assert any("topic/queue" in line and "kind" in line for line in text.splitlines())  # header cells whole too

    out = io.StringIO()
    message = f"{LONG_PATH} has no commitlog directory"
    console(file=out).print(message)
    assert out.getvalue() == message + "\n"


@pytest.mark.unit
def test_in_a_narrow_terminal_cells_fold_instead_of_being_cut():
    out = io.StringIO()
    t = table("kind", "topic/queue")
    t.add_row("ConsumeQueue", f"{LONG_TOPIC}-3")
    Console(file=out, width=40, force_terminal=True, color_system=None, markup=False).print(t)
    text = out.getvalue()
    assert "…" not in text
    cells = "".join(ch for ch in text if ch.isalnum() or ch == "-")  # the folded pieces, in order
    assert f"{LONG_TOPIC}-3" in cells


@pytest.mark.unit
def test_values_are_printed_as_they_are_not_read_as_markup(monkeypatch):
    out = io.StringIO()
    console(file=out).print("TopicConfig [topicName=Orders, perm=6] body [bold]x[/bold]")
    assert out.getvalue() == "TopicConfig [topicName=Orders, perm=6] body [bold]x[/bold]\n"

    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    print_error(f"[red]{LONG_PATH}[/red] is locked")
    assert err.getvalue() == f"error: [red]{LONG_PATH}[/red] is locked\n"


@pytest.mark.integration
def test_usage_errors_outside_a_terminal_are_plain_unwrapped_lines(tmp_path):
    missing = tmp_path / ("deep-" * 30) / "nothing"
    res = subprocess.run([sys.executable, "-m", "pipelines.compaction", "--store-dir", str(missing), "--lake",
                          str(tmp_path / "lake")], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "COLUMNS": "40"})  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert f"error: Invalid value for --store-dir: {missing} has no commitlog directory\n" in res.stderr
    assert "╭" not in res.stderr and "Traceback" not in res.stderr

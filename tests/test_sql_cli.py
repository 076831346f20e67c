"""`mqlake sql` over a lake: the rows it prints in each format, and its errors."""

from __future__ import annotations

import base64
import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from pipelines.sql_cli import OutputFormat, print_rows
from tests.fixtures_spark import LONG_TOPIC

runner = CliRunner()


def sealed(spark_store) -> list[dict]:
    return list(spark_store.sealed_rows().values())


def sql(lake, query, *extra):
    return runner.invoke(app, ["sql", "--lake", str(lake), query, *extra])


QUERY = (
    "SELECT commitlog_offset, topic, tags, keys, properties, body, store_date FROM messages "
    "WHERE topic = 'Orders' ORDER BY commitlog_offset"
)


@pytest.mark.spark
def test_json_lines(spark, spark_lake, spark_store):
    result = sql(spark_lake, QUERY, "--format", "json")
    assert result.exit_code == 0, result.output
    got = [json.loads(line) for line in result.stdout.splitlines()]
    want = [r for r in sealed(spark_store) if r["topic"] == "Orders"]
    assert [g["commitlog_offset"] for g in got] == [w["commitlog_offset"] for w in want]
    for g, w in zip(got, want, strict=True):
        assert (g["tags"], g["keys"], g["properties"]) == (w["tags"], w["keys"], w["properties"])
        assert base64.b64decode(g["body"]) == w["body"]  # bodies are binary: base64 in JSON
        assert len(g["store_date"]) == 10  # ISO date


@pytest.mark.spark
def test_csv_and_limit(spark, spark_lake, spark_store):
    result = sql(spark_lake, QUERY, "--format", "csv", "--limit", "5")
    assert result.exit_code == 0, result.output
    rows = list(csv.reader(io.StringIO(result.stdout)))
    assert rows[0] == ["commitlog_offset", "topic", "tags", "keys", "properties", "body", "store_date"]
    want = [r for r in sealed(spark_store) if r["topic"] == "Orders"][:5]
    assert [int(r[0]) for r in rows[1:]] == [w["commitlog_offset"] for w in want]
    assert [r[2] for r in rows[1:]] == [w["tags"] or "" for w in want]  # NULL is empty
    assert [json.loads(r[4]) for r in rows[1:]] == [w["properties"] for w in want]


@pytest.mark.spark
def test_table_with_decoded_bodies(spark, spark_lake, spark_store):
    want = [r for r in sealed(spark_store) if r["topic"] == "Payments"][:3]
    result = sql(
        spark_lake,
        "SELECT commitlog_offset, CAST(body AS STRING) AS text FROM messages WHERE topic = 'Payments' "
        "ORDER BY commitlog_offset LIMIT 3",
    )
    assert result.exit_code == 0, result.output
    for w in want:
        assert str(w["commitlog_offset"]) in result.stdout
        assert w["body"].decode()[:20] in result.stdout
    counts = sql(spark_lake, "SELECT topic, count(*) AS n FROM messages GROUP BY topic ORDER BY topic", "--format",
                 "json")  # fmt: skip
    by_topic: dict[str, int] = {}
    for r in sealed(spark_store):
        by_topic[r["topic"]] = by_topic.get(r["topic"], 0) + 1
    assert {d["topic"]: d["n"] for d in map(json.loads, counts.stdout.splitlines())} == by_topic


@pytest.mark.spark
def test_errors(spark, spark_lake, tmp_path):
    bad = sql(spark_lake, "SELECT nope FROM messages")
    assert bad.exit_code == 1 and "error:" in bad.stderr and "nope" in bad.stderr
    missing = sql(tmp_path / "absent", "SELECT 1")
    assert missing.exit_code == 2 and "does not exist" in missing.stderr
    conf = sql(spark_lake, "SELECT 1", "--conf", "novalue")
    assert conf.exit_code == 2 and "not k=v" in conf.output
    fmt = sql(spark_lake, "SELECT 1", "--format", "xml")
    assert fmt.exit_code == 2


@pytest.mark.unit
def test_print_rows_renders_nested_and_binary_values():
    out = io.StringIO()
    rows = [(b"\x00\xff", {"k": "v"}, None, [1, 2])]
    print_rows(["b", "m", "n", "l"], rows, OutputFormat.csv, out)
    assert out.getvalue().splitlines() == ["b,m,n,l", 'AP8=,"{""k"": ""v""}",,"[1, 2]"']


@pytest.mark.spark
def test_the_console_script(spark_lake, spark_store):
    """The real entry point in its own process (its own JVM)."""
    env = dict(os.environ, JAVA_TOOL_OPTIONS="-XX:TieredStopAtLevel=1")
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("mqlake")), "sql", "--lake", str(spark_lake), "--master", "local[1]",
         "--format", "csv", "SELECT count(*) AS n, count(DISTINCT msg_id) AS ids FROM messages"],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    n = len(sealed(spark_store))
    assert proc.stdout.splitlines() == ["n,ids", f"{n},{n}"]


@pytest.mark.spark
def test_piped_table_prints_long_values_whole_and_json_is_a_flag_too(spark, spark_lake, spark_store):
    """Outside a terminal no cell is cut (a terminal table stops at 60 characters a cell)."""
    want = [r for r in sealed(spark_store) if r["topic"] == LONG_TOPIC and r["body"].startswith(b"message")][:3]
    offsets = ", ".join(str(w["commitlog_offset"]) for w in want)
    query = (f"SELECT commitlog_offset, topic, keys, CAST(body AS STRING) AS text FROM messages "
             f"WHERE topic = '{LONG_TOPIC}' AND commitlog_offset IN ({offsets}) ORDER BY commitlog_offset")  # fmt: skip
    result = runner.invoke(app, ["sql", "--lake", str(spark_lake), query], env={"COLUMNS": "60"})
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout
    for w in want:
        [row] = [line for line in result.stdout.splitlines() if line.split()[:1] == [str(w["commitlog_offset"])]]
        assert LONG_TOPIC in row and w["keys"] in row and w["body"].decode() in row

    as_json = sql(spark_lake, query, "--json")
    assert as_json.exit_code == 0, as_json.output
    assert [json.loads(line)["commitlog_offset"] for line in as_json.stdout.splitlines()] == [
        w["commitlog_offset"] for w in want]  # fmt: skip
    assert sql(spark_lake, query, "--json", "--format", "csv").exit_code == 2


@pytest.mark.spark
@pytest.mark.timeout(900)  # six Delta commands, each a Spark job, on a busy machine
def test_delta_sql_history_time_travel_delete_merge_and_restore(spark, spark_lake, spark_store, tmp_path):
    root = tmp_path / "lake"
    shutil.copytree(spark_lake, root)  # a private copy: the commands below change it

    def rows(query: str) -> list[dict]:
        result = sql(root, query, "--format", "json")
        assert result.exit_code == 0, result.output
        return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]

    want = sealed(spark_store)
    n_audit = sum(r["topic"] == "Audit" for r in want)
    n_orders = sum(r["topic"] == "Orders" for r in want)
    history = rows("DESCRIBE HISTORY messages")
    latest = history[0]["version"]
    assert [h["version"] for h in history] == list(range(latest, -1, -1))  # one commit per sealed segment

    rows("DELETE FROM messages WHERE topic = 'Audit'")
    assert rows("SELECT count(*) AS n FROM messages") == [{"n": len(want) - n_audit}]
    assert rows(f"SELECT count(*) AS n FROM messages VERSION AS OF {latest}") == [{"n": len(want)}]
    rows(
        "MERGE INTO messages t USING (SELECT commitlog_offset FROM messages WHERE topic = 'Orders') s "
        "ON t.commitlog_offset = s.commitlog_offset WHEN MATCHED THEN UPDATE SET tags = 'merged'"
    )
    assert rows("SELECT count(*) AS n FROM messages WHERE tags = 'merged'") == [{"n": n_orders}]
    rows(f"RESTORE TABLE messages TO VERSION AS OF {latest}")
    assert rows("SELECT count(*) AS n FROM messages WHERE tags = 'merged'") == [{"n": 0}]
    assert rows("SELECT count(*) AS n FROM messages") == [{"n": len(want)}]
    assert [h["operation"] for h in rows("DESCRIBE HISTORY messages")][:3] == ["RESTORE", "MERGE", "DELETE"]


@pytest.mark.unit
def test_shell_statements_end_at_a_semicolon_and_quit_ends_the_input():
    from pipelines.sql_cli import CANCEL, statements

    lines = ["\n", "SELECT 1;\n", "SELECT topic\n", "  FROM messages\n", "  WHERE a = 'x';\n", "SELECT half\n",
             CANCEL, "  ;\n", "EXIT;\n", "SELECT never;\n"]  # fmt: skip
    assert list(statements(lines)) == ["SELECT 1", "SELECT topic\n  FROM messages\n  WHERE a = 'x'"]
    assert list(statements(["SELECT 1;", "SELECT 2"])) == ["SELECT 1", "SELECT 2"]  # the last needs no ';'
    assert list(statements(["\\q", "SELECT 1;"])) == []


@pytest.mark.spark
def test_the_shell_runs_statements_in_one_session_and_a_failing_one_is_one_line(spark_lake, spark_store):
    """``mqlake sql --shell`` (the console script, its own JVM) fed on standard input: every statement answers,
    a failing one prints one line and the next still runs in the same session."""
    env = dict(os.environ, JAVA_TOOL_OPTIONS="-XX:TieredStopAtLevel=1")
    script = (
        "SET mqlake.test.marker = same-session;\n"
        "SELECT count(*) AS n FROM messages;\n"
        "SELECT nope FROM messages;\n"
        "SELECT topic, count(*) AS n\n  FROM messages GROUP BY topic ORDER BY topic;\n"
        "SELECT '${mqlake.test.marker}' AS marker;\n"
        "quit\n"
        "SELECT 'after quit' AS never;\n"
    )
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("mqlake")), "sql", "--lake", str(spark_lake), "--master", "local[1]",
         "--format", "csv", "--shell"],
        input=script, capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr  # a statement failed
    rows = sealed(spark_store)
    by_topic: dict[str, int] = {}
    for r in rows:
        by_topic[r["topic"]] = by_topic.get(r["topic"], 0) + 1
    out = proc.stdout.splitlines()
    set_rows = out.index("n")  # SET prints its key and value first
    assert out[set_rows:] == ["n", str(len(rows)), "topic,n",
                              *(f"{t},{n}" for t, n in sorted(by_topic.items())), "marker", "same-session"]  # fmt: skip
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "nope" in errors[0], proc.stderr
    assert "UNRESOLVED_COLUMN" in errors[0]
    for trace in ("\tat org.apache", "JVM stacktrace", "Traceback", "UnresolvedRelation", "'Project"):
        assert trace not in proc.stderr, proc.stderr
    stats = [line for line in proc.stderr.splitlines() if line.startswith("(") and line.endswith(" s)")]
    assert [s.split(",")[0] for s in stats] == ["(1 row", "(1 row", f"({len(by_topic)} rows", "(1 row"]
    assert "after quit" not in proc.stdout


@pytest.mark.unit
def test_a_query_or_the_shell_not_both():
    result = runner.invoke(app, ["sql", "--lake", ".", "--shell", "SELECT 1"])
    assert result.exit_code == 2 and "one of them" in result.output
    assert runner.invoke(app, ["sql", "--lake", "."]).exit_code == 2


@pytest.mark.unit
def test_the_prompt_continues_a_statement_and_ctrl_c_drops_it(monkeypatch):
    from pipelines import sql_cli

    typed = iter(["SELECT 1", KeyboardInterrupt, "SELECT 2", "  + 1;", EOFError])
    prompts: list[str] = []

    def fake_input(prompt: str) -> str:
        prompts.append(prompt)
        value = next(typed)
        if isinstance(value, type):
            raise value
        return value

    monkeypatch.setattr("builtins.input", fake_input)
    buffer: list[str] = []
    got = list(sql_cli.statements(sql_cli._prompted_lines(buffer), buffer))
    assert got == ["SELECT 2\n  + 1"]  # the statement Ctrl-C interrupted is dropped, not run
    assert prompts == [sql_cli.PROMPT, sql_cli.CONTINUATION, sql_cli.PROMPT, sql_cli.CONTINUATION, sql_cli.PROMPT]

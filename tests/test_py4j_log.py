"""py4j's report of a connection the JVM reset (logged at ERROR on the root logger, with the failure also raised
to the command's caller) goes on as a WARNING; any other ERROR on the root logger stays one."""

from __future__ import annotations

import logging

import py4j.java_gateway
import pytest

from pipelines.logs import quiet_python_loggers


@pytest.mark.unit
@pytest.mark.expected_errors("a root error of anyone else")
def test_py4js_lost_connection_is_a_warning_and_other_root_errors_stay_errors(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("MQLAKE_LOG_DIR", str(tmp_path))
    quiet_python_loggers()
    seen: list[tuple[str, str, str]] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append((record.levelname, record.name, record.getMessage()))

    keep = Keep(logging.DEBUG)
    root = logging.getLogger()
    root.addHandler(keep)
    try:
        # the statement py4j runs when a command's connection is reset, compiled as py4j's own file
        exec(compile('import logging\ntry:\n    raise ConnectionResetError(104, "reset")\nexcept OSError:\n'
                     '    logging.exception("Exception while sending command.")\n',
                     py4j.java_gateway.__file__, "exec"), {})  # fmt: skip
        root.error("a root error of anyone else")
    finally:
        root.removeHandler(keep)
    assert seen == [("WARNING", "py4j.java_gateway", "Exception while sending command."),
                    ("ERROR", "root", "a root error of anyone else")]  # fmt: skip

"""Guards of the test run itself, so that a test passes only when nothing went wrong around it.

Registered as a pytest plugin by tests/conftest.py; each guard fails the test it belongs to:

- **Logged errors.** A record of level ERROR or above logged in the pytest process (an in-process broker, an
  event loop's exception handler, any library), and an ERROR/CRITICAL line or a traceback in the log of a
  broker subprocess the test watched (``watch(source)``, which tests/fixtures_broker.py does for every
  ``mqlake`` server it starts), fail the test during which they appeared. A test that provokes errors on
  purpose says which with ``@pytest.mark.expected_errors("regex", ...)`` (each line or message is matched with
  ``re.search``; no pattern allows any error).
- **Thread and event-loop failures.** An exception that ends a thread, or one handed to an event loop's
  exception handler (``loop_exception_handler``), fails the test that started the thread or the loop: while it
  runs, at its teardown, or, when the failure comes after that test has ended, as an error reported against
  that same test (never against whichever test happens to be running).
- **Unit isolation.** A test marked ``unit`` that binds or connects an IP socket, or starts a child process
  (fork, exec, subprocess, posix_spawn), fails, even when the test catches the error the guard raises.

Broker and loop failures are kept per test and reported in its teardown, after its fixtures are torn down, so a
fixture's own server shutdown is covered too.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import sys
import threading
import traceback
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import pytest

ERROR_LINE = re.compile(r" (ERROR|CRITICAL) |^Traceback \(most recent call last\)")

_IP_FAMILIES = (socket.AF_INET, socket.AF_INET6)
_PROCESS_EVENTS = frozenset(
    {"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.system", "os.spawn"}
)


_ISOLATION = "a unit test may open no socket and start no process"


class UnitIsolationError(RuntimeError):
    """Raised into a ``unit`` test that tried to use the network or start a process."""


class LogSource(Protocol):
    """Something whose log a test watches, e.g. a broker subprocess."""

    name: str

    def new_log_lines(self) -> list[str]:
        """The lines logged since the last call."""
        ...


@dataclass
class _TestState:
    nodeid: str
    location: tuple[str, int | None, str]
    unit: bool
    patterns: list[re.Pattern[str]] | None  # None: no error expected; []: any error expected
    problems: list[str] = field(default_factory=list)
    ended: bool = False

    def expects(self, text: str) -> bool:
        return self.patterns is not None and (not self.patterns or any(p.search(text) for p in self.patterns))


_active: Harness | None = None  # the harness of the innermost running session (a pytester run nests one)


_WATCHED = _PROCESS_EVENTS | {"socket.bind", "socket.connect"}


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event not in _WATCHED:  # first: every audited event of the process (each open(), each import) comes here
        return
    harness = _active
    if harness is None or harness.current is None or not harness.current.unit:
        return
    if threading.current_thread() is not threading.main_thread():
        # a thread that outlived an earlier test of this worker (py4j's gateway of a Spark session kept for the
        # session) is not the unit test's doing; a unit test's own code runs on the main thread
        return
    if event in ("socket.bind", "socket.connect"):
        sock = args[0]
        if getattr(sock, "family", None) not in _IP_FAMILIES:
            return  # a Unix socket pair (an event loop's self-pipe) is no network
        what = f"{event} {args[1]!r}"
    else:
        what = f"{event} {args[0]!r}" if args else event
    message = f"{_ISOLATION}; it did: {what} (mark it integration)"
    harness.current.problems.append(message)
    raise UnitIsolationError(message)


_audit_installed = False


def _install_audit_hook() -> None:
    global _audit_installed
    if not _audit_installed:  # an audit hook cannot be removed: one for the process, dispatching to _active
        sys.addaudithook(_audit)
        _audit_installed = True


class _ErrorLogHandler(logging.Handler):
    def __init__(self, harness: Harness) -> None:
        super().__init__(logging.ERROR)
        self.harness = harness

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = f"{record.levelname} {record.name}: {record.getMessage()}"
            if record.exc_info and record.exc_info[1] is not None:
                text += "\n" + "".join(traceback.format_exception(*record.exc_info))
        except Exception:  # a record that cannot be formatted is still an error logged
            text = f"{record.levelname} {record.name}: {record.msg!r}"
        self.harness.record(self.harness.current, f"logged during the test: {text}", text)


class Harness:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.current: _TestState | None = None
        self.sources: weakref.WeakSet[Any] = weakref.WeakSet()
        self.late: list[tuple[_TestState, str]] = []  # failures of ended tests not reported yet
        self.outside: list[str] = []  # failures when no test ran (collection, session teardown)
        self._lock = threading.Lock()
        self._previous: Harness | None = None
        self._log_handler = _ErrorLogHandler(self)
        self._old_excepthook = threading.excepthook
        self._old_start = threading.Thread.start

    # --- wiring -------------------------------------------------------------------------------------------
    def install(self) -> None:
        global _active
        self._previous, _active = _active, self
        _install_audit_hook()
        logging.getLogger().addHandler(self._log_handler)
        threading.excepthook = self._excepthook
        harness, original_start = self, self._old_start

        def start(thread: threading.Thread) -> None:
            thread._mqlake_owner = harness.current  # type: ignore[attr-defined]
            original_start(thread)

        threading.Thread.start = start  # type: ignore[method-assign]

    def uninstall(self) -> None:
        global _active
        threading.Thread.start = self._old_start  # type: ignore[method-assign]
        threading.excepthook = self._old_excepthook
        logging.getLogger().removeHandler(self._log_handler)
        _active = self._previous

    # --- recording ----------------------------------------------------------------------------------------
    def record(self, owner: _TestState | None, problem: str, text: str) -> None:
        """A failure belonging to ``owner`` (None: no test); ``text`` is what an expected_errors pattern sees."""
        with self._lock:
            if owner is None:
                self.outside.append(problem)
            elif owner.expects(text):
                return
            elif owner.ended:
                self.late.append((owner, problem))
            else:
                owner.problems.append(problem)

    def _excepthook(self, args: threading.ExceptHookArgs) -> None:
        thread = args.thread
        owner = getattr(thread, "_mqlake_owner", self.current)
        name = thread.name if thread is not None else "?"
        tb = "".join(traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback))
        when = " after the test ended" if owner is not None and owner.ended else ""
        self.record(owner, f"thread {name!r} started by this test raised{when}:\n{tb}", tb)

    def check_sources(self) -> None:
        for source in list(self.sources):
            for line in source.new_log_lines():
                if ERROR_LINE.search(line):
                    self.record(self.current, f"{source.name} logged during the test: {line}", line)

    # --- per test -----------------------------------------------------------------------------------------
    def begin(self, item: pytest.Item) -> None:
        self.check_sources()  # what a shared server logged between tests belongs to no test
        root = logging.getLogger()
        if self._log_handler not in root.handlers:  # a test (or the code it ran) reset the root logger's handlers
            root.addHandler(self._log_handler)
        marker = item.get_closest_marker("expected_errors")
        patterns = None if marker is None else [re.compile(p) for p in marker.args]
        self.current = _TestState(item.nodeid, item.location, item.get_closest_marker("unit") is not None, patterns)

    def end(self) -> list[str]:
        self.check_sources()
        state = self.current
        assert state is not None
        with self._lock:
            state.ended = True
            problems, state.problems = state.problems, []
        self.current = None
        return problems

    def take_late(self) -> list[tuple[_TestState, str]]:
        with self._lock:
            late, self.late = self.late, []
        return late


_KEY = pytest.StashKey[Harness]()


def watch(source: LogSource) -> None:
    """Check ``source``'s new log lines for errors at the start and the end of every test while it lives."""
    if _active is not None:
        _active.sources.add(source)


def expect_errors(*patterns: str) -> None:
    """For a fixture that provokes errors on purpose: the errors matching ``patterns`` are expected in the test
    being set up (a module-scoped fixture is set up by whichever of its tests a worker runs first, so a marker on
    one test cannot say it)."""
    harness = _active
    if harness is None or harness.current is None:
        return
    state = harness.current
    with harness._lock:
        if state.patterns is None:
            state.patterns = [re.compile(p) for p in patterns]
        elif state.patterns:  # [] already expects any error
            state.patterns.extend(re.compile(p) for p in patterns)


def loop_exception_handler() -> Any:
    """An exception handler for an event loop started now: what the loop reports (a task's unretrieved
    exception, a failed callback) fails the running test, or is reported against it if it has ended."""
    harness = _active
    owner = harness.current if harness is not None else None

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        text = str(context.get("message", ""))
        if exc is not None:
            text += "\n" + "".join(traceback.format_exception(exc))
        if harness is None:
            loop.default_exception_handler(context)
        else:
            harness.record(owner, f"event loop of this test reported: {text}", text)

    return handler


# --- pytest hooks ----------------------------------------------------------------------------------------------
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "expected_errors(*patterns): errors this test provokes on purpose (see tests/harness.py)"
    )
    harness = Harness(config)
    config.stash[_KEY] = harness
    harness.install()


def pytest_unconfigure(config: pytest.Config) -> None:
    harness = config.stash.get(_KEY, None)
    if harness is not None:
        harness.uninstall()


def _report_late(harness: Harness, item: pytest.Item | None) -> None:
    for owner, problem in harness.take_late():
        report = pytest.TestReport(
            nodeid=owner.nodeid, location=owner.location, keywords={}, outcome="failed", longrepr=problem,
            when="teardown",
        )  # fmt: skip
        hook = item.ihook if item is not None else harness.config.hook
        hook.pytest_runtest_logreport(report=report)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    harness = item.config.stash[_KEY]
    _report_late(harness, item)
    harness.begin(item)
    try:
        return (yield)
    finally:
        if harness.current is not None:  # the teardown hook below did not run (an interrupted run)
            harness.end()
        _report_late(harness, item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    harness = item.config.stash[_KEY]
    try:
        return (yield)
    except UnitIsolationError:  # the test fails with it already: teardown need not say it again
        if harness.current is not None:
            harness.current.problems = [p for p in harness.current.problems if not p.startswith(_ISOLATION)]
        raise


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    harness = item.config.stash[_KEY]
    try:
        return (yield)
    finally:
        problems = harness.end()
        if problems:
            pytest.fail("\n\n".join(problems), pytrace=False)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reports that it has finished
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    harness = session.config.stash.get(_KEY, None)
    if harness is None:
        return
    harness.check_sources()
    _report_late(harness, None)
    if harness.outside:  # logged while no test ran (between tests): a failure of the run, named as such
        report = pytest.TestReport(
            nodeid="tests/harness.py::outside-any-test", location=("tests/harness.py", None, "outside any test"),
            keywords={}, outcome="failed", longrepr="\n\n".join(harness.outside), when="teardown",
        )  # fmt: skip
        session.config.hook.pytest_runtest_logreport(report=report)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

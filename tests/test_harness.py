"""The guards of tests/harness.py, proven on small test sessions run in a child pytest (pytester): a broker's
ERROR, a thread's exception (late ones included) and a unit test's socket or child process each fail the run,
and each is reported against the test it belongs to."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

CONFTEST = """
pytest_plugins = ["tests.harness", "tests.fixtures_broker", "tests.live_broker"]

def pytest_configure(config):
    for kind in ("unit", "integration"):
        config.addinivalue_line("markers", kind)
"""


REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """``run(source)`` -> the outcome of a child pytest session over one test module."""
    pytester.makeconftest(CONFTEST)
    # the child runs in a temporary directory: the repository's `tests` package must be importable from there
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))

    def go(source: str) -> pytest.RunResult:
        pytester.makepyfile(test_inner=source)
        return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:threadexception", "-rA")

    return go


def test_an_in_process_broker_error_fails_its_test(run):
    result = run("""
import pytest
from broker.remoting.codes import ResponseCode

async def boom(cmd, channel):
    raise RuntimeError("injected fault")

def call_failing_handler(broker):
    broker.controller.server.register(9999, boom)
    assert broker.call(9999).code == ResponseCode.SYSTEM_ERROR

@pytest.mark.integration
def test_injected(fresh_broker):
    call_failing_handler(fresh_broker())

@pytest.mark.integration
def test_next():
    pass

@pytest.mark.integration
@pytest.mark.expected_errors("injected fault")
def test_declared(fresh_broker):
    call_failing_handler(fresh_broker())
""")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_injected*", "logged during the test: ERROR *failed*"])
    assert "injected fault" in result.stdout.str()
    assert "ERROR at teardown of test_declared" not in result.stdout.str()


def test_an_error_a_shared_fixture_expects_passes_whichever_test_sets_it_up(run):
    result = run("""
import logging
import pytest
from tests.harness import expect_errors

@pytest.fixture(scope="module")
def faulty():
    expect_errors("provoked by the fixture")
    logging.getLogger("inner").error("tier run failed: provoked by the fixture")

@pytest.mark.integration
def test_first(faulty):
    pass

@pytest.mark.integration
def test_second(faulty):
    logging.getLogger("inner").error("provoked by the fixture, but now by a test")
""")
    result.assert_outcomes(passed=2, errors=1)
    out = result.stdout.str()
    assert "ERROR at teardown of test_second" in out and "ERROR at teardown of test_first" not in out


def test_a_broker_subprocess_error_fails_its_test(run):
    # a slave whose master HA address has no port: the broker logs an ERROR while it runs, and keeps running
    result = run("""
import pytest
from tests.helpers import wait_until

@pytest.mark.integration
def test_bad_master_address(mqlake_server_factory):
    server = mqlake_server_factory(brokerRole="SLAVE", brokerId="1", haMasterAddress="127.0.0.1")
    wait_until(lambda: "bad master HA address" in server.run_log(), 30, "the broker's error")
""")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of test_bad_master_address*",
        "mqlake up (mqlake-0) logged during the test: * ERROR *bad master HA address*",
    ])  # fmt: skip


def test_thread_exceptions_fail_the_test_that_started_the_thread(run):
    result = run("""
import threading
import pytest

release = threading.Event()
late = []

def fail(message):
    raise RuntimeError(message)

@pytest.mark.unit
def test_thread_fails_in_time():
    t = threading.Thread(target=fail, args=("failed in time",))
    t.start()
    t.join(30)
    assert not t.is_alive()

@pytest.mark.unit
def test_thread_fails_late():
    def run():
        release.wait()
        fail("failed late")
    late.append(threading.Thread(target=run, name="late-thread"))
    late[0].start()

@pytest.mark.unit
def test_innocent_bystander():
    release.set()
    late[0].join(30)
    assert not late[0].is_alive()
""")
    result.assert_outcomes(passed=3, errors=2)
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of test_thread_fails_in_time*",
        "thread * started by this test raised:",
        "*ERROR at teardown of test_thread_fails_late*",
        "thread 'late-thread' started by this test raised after the test ended:",
    ])  # fmt: skip
    assert "ERROR at teardown of test_innocent_bystander" not in result.stdout.str()


def test_a_unit_test_may_open_no_socket_and_start_no_process(run):
    result = run("""
import asyncio
import socket
import subprocess
import pytest

@pytest.mark.unit
def test_binds_and_hides_it():
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", 0))
        except Exception:
            pass

@pytest.mark.unit
def test_starts_a_process():
    subprocess.run(["true"], check=True)

@pytest.mark.unit
def test_event_loop_is_no_network():
    asyncio.run(asyncio.sleep(0))

@pytest.mark.integration
def test_integration_may():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
    subprocess.run(["true"], check=True)
""")
    result.assert_outcomes(passed=3, failed=1, errors=1)
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of test_binds_and_hides_it*",
        "a unit test may open no socket and start no process; it did: socket.bind ('127.0.0.1', 0) (mark it *",
        "*_ test_starts_a_process _*",
        "E *UnitIsolationError: a unit test may open no socket and start no process; it did: subprocess.Popen *",
    ])  # fmt: skip

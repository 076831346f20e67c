"""Shared fixtures; the helpers themselves live in tests/helpers.py."""

from __future__ import annotations

import os

import pytest

# Before any test module imports grpc (the in-process gRPC tests do): with gRPC's fork handlers on, a broker
# subprocess forked by this process afterwards can abort between fork and exec (see broker/proxy/__init__.py).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from tests import host_disk
from tests.helpers import local_zone, make_config

pytest_plugins = [
    "pytester",  # tests/test_harness.py runs small test sessions to prove the guards of tests/harness.py
    "tests.harness",
    "tests.fixtures_airflow",
    "tests.fixtures_spark",
    "tests.fixtures_broker",
    "tests.fixtures_vectors",
    "tests.live_broker",
    "tests.twins",
]


@pytest.fixture
def store_config(tmp_path):
    """Factory: ``store_config(**overrides)`` -> MessageStoreConfig with small segment sizes under tmp_path."""

    def factory(**overrides):
        return make_config(tmp_path, **overrides)

    return factory


# A zone that is not UTC (where a local/UTC mix-up would go unseen) and has no daylight saving (no test meets
# a missing or repeated hour), whatever zone the host is in.
PINNED_ZONE = "Asia/Shanghai"


@pytest.fixture
def pinned_zone():
    """Run the test in PINNED_ZONE (TZ + tzset, restored after): for tests of local time (deleteWhen hours,
    day boundaries, the month start in message ids), which must not depend on the host's zone."""
    with local_zone(PINNED_ZONE):
        yield PINNED_ZONE


KINDS = ("unit", "integration", "spark", "airflow")  # registered in pyproject.toml

# Session fixtures that run Apache RocketMQ's classes in a JVM (tests/fixtures_vectors.py): their tests share a
# worker, so the JVM runs once.
VECTOR_FIXTURES = frozenset({"rmq", "stored"})


def xdist_group(item: pytest.Item, kind: str) -> str | None:
    """The worker group of a test under ``--dist loadgroup`` (`make test`): all Spark tests on one worker (one
    SparkSession, one JVM at a time: several local sessions at once overload a 2-core machine, a run that spread
    them took longer), all Airflow tests on one (one migrated Airflow home), the tests of the RocketMQ vectors on
    one; an integration module's tests together (its module-scoped brokers start once); unit tests wherever a
    worker is free."""
    if kind in ("spark", "airflow"):
        return kind
    if VECTOR_FIXTURES & set(getattr(item, "fixturenames", ())):
        return "rocketmq-vectors"
    if kind == "integration":
        return item.nodeid.split("::", 1)[0]
    return None


# The order the workers are handed the groups in, heaviest first, so that a long group does not start last and run on
# alone: the JVM-bound kinds first, then the brokers, then the many short unit tests that fill the gaps at the end.
KIND_ORDER = {"airflow": 0, "spark": 0, "integration": 1, "unit": 2}


def _declared_timeout(item: pytest.Item) -> float:
    """The test's own ``timeout`` mark (a long one says the test is long), else pytest-timeout's setting."""
    mark = item.get_closest_marker("timeout")
    if mark is not None and (value := mark.kwargs.get("timeout", mark.args[0] if mark.args else None)) is not None:
        return float(value)
    return float(item.config.getini("timeout") or 0)


def heaviest_first(items: list[pytest.Item], units: dict[str, str], kinds: dict[str, str]) -> None:
    """Sort ``items`` (stably) by their scheduling unit's weight: its kind, the JVM vectors with the JVM kinds, then
    the longest timeout a test of the unit declares.  ``units`` and ``kinds`` map a nodeid to its group and kind."""
    weight: dict[str, tuple[int, float]] = {}
    for item in items:
        unit = units[item.nodeid]
        rank = 0 if unit == "rocketmq-vectors" else KIND_ORDER[kinds[item.nodeid]]
        key = (rank, -_declared_timeout(item))
        weight[unit] = min(weight.get(unit, key), key)
    items.sort(key=lambda item: weight[units[item.nodeid]])


def pytest_configure(config: pytest.Config) -> None:
    host_disk.pin()  # the stores of this process read a half-full disk, whatever the host's holds
    # xdist would hand out the groups by their number of tests, largest first; heaviest_first's order is kept instead
    if getattr(config.option, "dist", "no") == "loadgroup":
        config.option.loadscopereorder = False


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: every collected test is checked, whatever runs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Fail the run unless each test carries exactly one kind (a module's ``pytestmark`` or its own mark); give each
    its xdist group; on an xdist worker, order the tests heaviest group first."""
    wrong = []
    units: dict[str, str] = {}
    kinds: dict[str, str] = {}
    for item in items:
        found = sorted({mark.name for mark in item.iter_markers() if mark.name in KINDS})
        if len(found) != 1:
            wrong.append(f"  {item.nodeid}: {' and '.join(found) if found else 'none'}")
            continue
        kinds[item.nodeid] = found[0]
        if (group := xdist_group(item, found[0])) is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
        marked = item.get_closest_marker("xdist_group")
        units[item.nodeid] = str(marked.kwargs.get("name", *marked.args[:1])) if marked else item.nodeid
    if wrong:
        raise pytest.UsageError(
            f"each test needs exactly one of the marks {', '.join(KINDS)} (see pyproject.toml); these have\n"
            + "\n".join(wrong)
        )
    if hasattr(config, "workerinput"):  # the workers' collections are the order xdist schedules in
        heaviest_first(items, units, kinds)

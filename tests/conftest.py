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


def pytest_configure(config: pytest.Config) -> None:
    host_disk.pin()  # the stores of this process read a half-full disk, whatever the host's holds


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
    SparkSession, one JVM at a time), all Airflow tests on one (one migrated Airflow home), the tests of the
    RocketMQ vectors on one; an integration module's tests together (its module-scoped brokers start once);
    unit tests wherever a worker is free."""
    if kind in ("spark", "airflow"):
        return kind
    if VECTOR_FIXTURES & set(getattr(item, "fixturenames", ())):
        return "rocketmq-vectors"
    if kind == "integration":
        return item.nodeid.split("::", 1)[0]
    return None


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: every collected test is checked, whatever runs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Fail the run unless each test carries exactly one kind (a module's ``pytestmark`` or its own mark); give each
    its xdist group."""
    wrong = []
    for item in items:
        kinds = sorted({mark.name for mark in item.iter_markers() if mark.name in KINDS})
        if len(kinds) != 1:
            wrong.append(f"  {item.nodeid}: {' and '.join(kinds) if kinds else 'none'}")
        elif (group := xdist_group(item, kinds[0])) is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
    if wrong:
        raise pytest.UsageError(
            f"each test needs exactly one of the marks {', '.join(KINDS)} (see pyproject.toml); these have\n"
            + "\n".join(wrong)
        )

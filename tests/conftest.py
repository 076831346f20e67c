"""Shared fixtures; the helpers themselves live in tests/helpers.py."""

from __future__ import annotations

import os

import pytest

# Before any test module imports grpc (the in-process gRPC tests do): with gRPC's fork handlers on, a broker
# subprocess forked by this process afterwards can abort between fork and exec (see broker/proxy/__init__.py).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from tests import host_disk
from tests.helpers import make_config

pytest_plugins = [
    "pytester",  # tests/test_harness.py runs small test sessions to prove the guards of tests/harness.py
    "tests.harness",
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


KINDS = ("unit", "integration", "spark", "airflow")  # registered in pyproject.toml


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: every collected test is checked, whatever runs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Fail the run unless each test carries exactly one kind (a module's ``pytestmark`` or its own mark)."""
    wrong = []
    for item in items:
        kinds = sorted({mark.name for mark in item.iter_markers() if mark.name in KINDS})
        if len(kinds) != 1:
            wrong.append(f"  {item.nodeid}: {' and '.join(kinds) if kinds else 'none'}")
    if wrong:
        raise pytest.UsageError(
            f"each test needs exactly one of the marks {', '.join(KINDS)} (see pyproject.toml); these have\n"
            + "\n".join(wrong)
        )

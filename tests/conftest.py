"""Shared fixtures; the helpers themselves live in tests/helpers.py."""

from __future__ import annotations

import pytest

from tests import host_disk
from tests.helpers import make_config

pytest_plugins = ["tests.fixtures_spark", "tests.fixtures_broker"]


def pytest_configure(config: pytest.Config) -> None:
    host_disk.pin()  # the stores of this process read a half-full disk, whatever the host's holds


@pytest.fixture
def store_config(tmp_path):
    """Factory: ``store_config(**overrides)`` -> MessageStoreConfig with small segment sizes under tmp_path."""

    def factory(**overrides):
        return make_config(tmp_path, **overrides)

    return factory

"""The staging tasks name partition directories themselves: as Spark names them, and read back to the same values."""

from __future__ import annotations

import pytest

from lake.delta import partition_path, partition_values_from_path

pytestmark = pytest.mark.unit


def test_partition_directories_are_escaped_as_spark_names_them_and_read_back():
    # Spark's escapePathName: '%' -> %25, '=' -> %3D, '/' -> %2F, ':' -> %3A; '|', '-' and '_' stay
    values = {"topic": "%RETRY%group|a=b/c:d_e-f", "store_date": "2026-11-24", "broker": None}
    path = partition_path(values)
    assert path == "topic=%25RETRY%25group|a%3Db%2Fc%3Ad_e-f/store_date=2026-11-24/broker=__HIVE_DEFAULT_PARTITION__"
    assert partition_values_from_path(f"{path}/part-0.parquet", list(values)) == values

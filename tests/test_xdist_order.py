"""The order tests/conftest.py hands the xdist groups out in (`make test`): the heaviest first, so that a long group
does not start last and run on alone while the other workers idle."""

from __future__ import annotations

import pytest

from tests.conftest import KINDS, heaviest_first, xdist_group

pytestmark = pytest.mark.unit


def _module(*marks: str) -> str:
    """A test module of two tests, each with ``marks``."""
    decorators = "".join(f"@pytest.mark.{m}\n" for m in marks)
    return "import pytest\n" + "".join(f"\n{decorators}def test_{n}(): pass\n" for n in range(2))


def test_groups_are_handed_out_heaviest_first(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_a_unit=_module("unit"),
        test_b_broker=_module("integration"),
        test_c_spark=_module("spark"),
        test_d_spark_long=_module("spark", "timeout(900)"),
        test_e_airflow=_module("airflow"),
    )
    items, _ = pytester.inline_genitems()
    kinds = {i.nodeid: next(m.name for m in i.iter_markers() if m.name in KINDS) for i in items}
    units = {i.nodeid: xdist_group(i, kinds[i.nodeid]) or i.nodeid for i in items}
    heaviest_first(items, units, kinds)
    # the Spark group first (it declares the longest timeout), then Airflow's; then the integration module; the
    # unit tests (each a unit of its own) last.  A group's tests stay together.
    assert [i.nodeid.split("::")[0] for i in items] == [
        "test_c_spark.py", "test_c_spark.py", "test_d_spark_long.py", "test_d_spark_long.py",
        "test_e_airflow.py", "test_e_airflow.py", "test_b_broker.py", "test_b_broker.py",
        "test_a_unit.py", "test_a_unit.py",
    ]  # fmt: skip
    assert {units[i.nodeid] for i in items if kinds[i.nodeid] == "spark"} == {"spark"}
    assert {units[i.nodeid] for i in items if kinds[i.nodeid] == "airflow"} == {"airflow"}
    assert len({units[i.nodeid] for i in items if kinds[i.nodeid] == "unit"}) == 2  # each where a worker is free

"""The xdist groups tests/conftest.py gives (`make test`): each runs on one worker, and they are handed out heaviest
first, so that a long group does not start last and run on alone while the other workers idle."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import KINDS, heaviest_first, xdist_group

REPO = Path(__file__).resolve().parents[1]


def _module(*marks: str) -> str:
    """A test module of two tests, each with ``marks``."""
    decorators = "".join(f"@pytest.mark.{m}\n" for m in marks)
    return "import pytest\n" + "".join(f"\n{decorators}def test_{n}(): pass\n" for n in range(2))


@pytest.mark.unit
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


# A child session's conftest: the suite's own grouping hooks, and each test writing down the worker it ran on.
GROUPING_CONFTEST = """
import os
from tests import conftest

pytest_collection_modifyitems = conftest.pytest_collection_modifyitems

def pytest_configure(config):
    for kind in conftest.KINDS:
        config.addinivalue_line("markers", kind)
    conftest.pytest_configure(config)

def pytest_runtest_call(item):
    with open(os.path.join(os.environ["RAN_ON"], item.nodeid.replace("/", "_").replace(":", "_")), "w") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"])
"""


@pytest.mark.integration
def test_each_group_runs_on_one_worker_under_loadgroup(pytester: pytest.Pytester, monkeypatch, tmp_path) -> None:
    """Under `make test`'s ``-n 2 --dist loadgroup``, the Spark tests of two modules all run on one worker, and an
    integration module's on one (its module-scoped fixtures start once). pytest-xdist groups by a suffix it adds to
    each test's node id; a pytest whose node ids ignore it (9.2) hands the tests out one by one instead."""
    pytester.makeconftest(GROUPING_CONFTEST)
    four = "import pytest\n" + "".join(f"\n@pytest.mark.{{kind}}\ndef test_{n}(): pass\n" for n in range(4))
    pytester.makepyfile(test_a_spark=four.format(kind="spark"), test_b_spark=four.format(kind="spark"),
                        test_c_broker=four.format(kind="integration"), test_d_unit=four.format(kind="unit"))
    ran_on = tmp_path / "ran-on"
    ran_on.mkdir()
    monkeypatch.setenv("RAN_ON", str(ran_on))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup")
    result.assert_outcomes(passed=16)
    workers = {f.name: f.read_text() for f in ran_on.iterdir()}

    def ran(*modules: str) -> set[str]:
        return {w for name, w in workers.items() if name.startswith(modules)}

    assert len(ran("test_a_spark", "test_b_spark")) == 1, workers
    assert len(ran("test_c_broker")) == 1, workers

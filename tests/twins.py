"""The ``twin`` fixture: runs a test once on the pure-Python codecs and once on their compiled twins.

``store.format.native`` records both forms of every twinned function; the fixture puts the chosen one wherever
the project holds it (the codec module itself and any project module that imported the name), then restores.
The compiled run fails, rather than skips, when the extension is not built, unless ``MQLAKE_NO_EXTENSIONS`` asks
for the Python twin alone.
"""

from __future__ import annotations

import sys

import pytest

from store.format import native

PROJECT_PACKAGES = ("store", "broker", "pipelines", "expectations", "cli", "benchmarks", "tests")


def twin_functions(kind: str) -> dict[str, object]:
    """``"module.name" -> function`` of one twin; fails the test when the compiled one is missing."""
    out: dict[str, object] = {}
    for mod, twins in native.TWINS.items():
        chosen = twins.python if kind == "python" else twins.compiled
        if not chosen:
            if native.disabled():
                pytest.skip(f"{native.ENV_DISABLE} is set: the compiled twins are not loaded")
            pytest.fail(f"{twins.extension} is not built ({native.missing_cause}); run `make install`")
        out.update({f"{mod}.{name}": fn for name, fn in chosen.items()})
    return out


def use_twin(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    chosen = twin_functions(kind)
    by_identity: dict[int, object] = {}
    for twins in native.TWINS.values():
        for name in twins.python:
            want = chosen[f"{twins.module}.{name}"]
            for form in (twins.python, twins.compiled):
                if name in form:
                    by_identity[id(form[name])] = want
    for modname, module in list(sys.modules.items()):
        if module is None or modname.split(".", 1)[0] not in PROJECT_PACKAGES:
            continue
        for attr, value in list(vars(module).items()):
            want = by_identity.get(id(value))
            if want is not None and want is not value:
                monkeypatch.setattr(module, attr, want)


@pytest.fixture(params=["python", "compiled"])
def twin(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    use_twin(monkeypatch, request.param)
    return request.param

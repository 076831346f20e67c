"""The compiled twins (store/_*.pyx, store/format/_*.pyx) against their pure-Python references: which one a process
runs, that a missing extension leaves a working package with one warning, and a quick differential fuzz of every
twinned function (the long run is `make fuzz`)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from store.format import hashing, native, records
from tests import differential

ROOT = Path(__file__).resolve().parent.parent

# A child that reports which twin its codecs run and every warning it got at import.
CHILD = """
import json, warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    %s
    from store.format import native, records, hashing, properties
    raw = records.encode_record(records.MessageRecord("T", 1, b"body", b"TAGS\\x01TagA\\x02"))
    req = records.check_record(raw, 0).request
print(json.dumps({
    "active": native.active(),
    "check_record": type(records.check_record).__name__,
    "warnings": [f"{w.category.__name__}: {w.message}" for w in seen],
    "tags_code": req.tags_code,
}))
"""

# Makes the compiled twins fail to import, as they would with no compiler at install.
BLOCK = """import sys
    class _Block:
        def find_spec(self, name, path=None, target=None):
            if name.startswith("store.format._"):
                raise ImportError(f"no compiled module {name} (blocked by the test)")
    sys.meta_path.insert(0, _Block())"""


def _child(env_extra: dict[str, str], prelude: str = "pass") -> dict:
    env = {k: v for k, v in os.environ.items() if k != native.ENV_DISABLE} | env_extra
    out = subprocess.run(
        [sys.executable, "-c", CHILD % prelude],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    import json

    return json.loads(out.stdout)


@pytest.mark.integration
def test_compiled_twin_is_chosen_when_built():
    got = _child({})
    assert got == {"active": "compiled", "check_record": "cython_function_or_method", "warnings": [],
                   "tags_code": hashing.java_string_hash("TagA")}  # fmt: skip


@pytest.mark.integration
def test_no_extensions_switch_forces_the_python_twin_without_a_warning():
    got = _child({native.ENV_DISABLE: "1"})
    assert got["active"] == "python"
    assert got["check_record"] == "function"
    assert got["warnings"] == []  # asked for: nothing to warn about
    assert got["tags_code"] == hashing.java_string_hash("TagA")


@pytest.mark.integration
def test_missing_extension_runs_the_python_twin_with_one_warning_naming_the_cause():
    got = _child({}, BLOCK)
    assert got["active"] == "python"
    assert got["check_record"] == "function"
    assert got["tags_code"] == hashing.java_string_hash("TagA")
    assert len(got["warnings"]) == 1, got["warnings"]  # three codec modules, one warning
    assert got["warnings"][0].startswith("ExtensionWarning: mqlake runs its pure-Python codecs: ")
    assert "store.format._hashing does not import (no compiled module store.format._hashing" in got["warnings"][0]


@pytest.mark.integration
def test_build_without_a_compiler_succeeds_and_builds_nothing(tmp_path):
    """setup.py's extensions are optional: a compiler that fails leaves a good build, and says why."""
    # the compiler's failure is the case under test, so a run that switched the extensions off must not leak in
    env = {k: v for k, v in os.environ.items() if k != "MQLAKE_NO_EXTENSIONS"} | {"CC": "false", "LDSHARED": "false"}
    out = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path / "lib"),
         "--build-temp", str(tmp_path / "tmp")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "not built" in out.stderr
    assert not list(tmp_path.rglob("*.so"))


@pytest.mark.unit
def test_twin_fixture_puts_the_chosen_twin_in_place(twin):
    want = getattr(native.TWINS["store.format.records"], twin)["check_record"]
    assert records.check_record is want
    assert hashing.java_string_hash is getattr(native.TWINS["store.format.hashing"], twin)["java_string_hash"]


@pytest.mark.unit
@pytest.mark.parametrize("target", sorted(differential.TARGETS))
def test_differential_fuzz_smoke(target):
    """A few thousand seeded inputs per target; `make fuzz` runs a million, coverage-guided."""
    rng = random.Random(f"mqlake-{target}")
    fn = differential.TARGETS[target]
    for _ in range(differential.SMOKE_RUNS.get(target, 3000)):
        fn(rng.randbytes(rng.randrange(0, 260)))


@pytest.mark.unit
def test_differential_harness_catches_a_twin_that_disagrees(monkeypatch):
    """The smoke above would be vacuous if `same` compared a twin with itself."""
    twins = native.TWINS["store.format.hashing"]
    monkeypatch.setitem(twins.compiled, "java_string_hash", lambda s: twins.python["java_string_hash"](s) ^ 1)
    with pytest.raises(differential.Disagreement, match="java_string_hash"):
        differential.hashes(b"abc")
    monkeypatch.setitem(twins.compiled, "java_string_hash", lambda s: 1 // 0)
    with pytest.raises(differential.Disagreement, match="ZeroDivisionError"):
        differential.hashes(b"abc")


# JSON headers where a hand-written parser is easy to get wrong; each must decode (or fail) as the reference does.
TRICKY_HEADERS = [
    b'{"code":1}',
    b' {"code":1}',
    b'{ "code" : 1 , "extFields" : { } }\r\n\t ',
    b'{"code":1}\xc2\xa0',  # a trailing no-break space: str.strip() takes it, JSON does not
    b'\xef\xbb\xbf{"code":1}',
    b'{"code":1,"code":2,"extFields":{"a":"1","a":"2","b":"3"},"extFields":{"c":"4"}}',
    b'{"code":-0,"opaque":-2147483648,"flag":9999999999999999999999,"version":12345678901234567890123}',
    b'{"code":1.0}',
    b'{"code":1e3}',
    b'{"code":01}',
    b'{"code":-}',
    b'{"code":"12","flag":"3"}',
    b'{"code":true}',
    b'{"code":NaN}',
    b'{"code":1,"extFields":null,"remark":null,"language":null}',
    b'{"code":1,"remark":5,"language":7}',
    b'{"code":1,"language":"\xd9\xa3"}',  # ARABIC-INDIC DIGIT THREE: str.isdigit() is true
    b'{"code":1,"extFields":{"k":"\\u0001\\u0002\\\\\\"\\/\\b\\f\\n\\r\\t"}}',
    b'{"code":1,"extFields":{"k":"\\ud83d\\ude00 \\ud83d \\ude00 \\ud83d\\u0041 \\uDBFF\\uDFFF"}}',
    b'{"code":1,"extFields":{"k":"\\ud83d\\uZZZZ"}}',
    b'{"code":1,"extFields":{"k":"\\x"}}',
    b'{"code":1,"extFields":{"k":"tab\there"}}',
    b'{"code":1,"extFields":{"k":"\xff"}}',
    b'{"code":1,"extFields":{"k":"\xed\xa0\x80"}}',  # a surrogate encoded in UTF-8: strict decoding refuses it
    b'{"code":1,"extFields":{"k":"\xe6\xa0\x87\xf0\x9f\x98\x80"}}',
    b'{"code":1,"extFields":{"k":1,"j":true,"n":null,"o":{"x":1}}}',
    b'{"code":1,"extFields":{1:"int key, fastjson style"}}',
    b'{"code":1,"nested":{"a":[1,2]},"f":1.5,"t":true,"n":null,"s":"x"}',
    b'{"code":1,}',
    b'{"code":1',
    b'{"code":1}}',
    b'{"code":1}{"code":2}',
    b"[1]",
    b"",
]


@pytest.mark.unit
@pytest.mark.parametrize("header", TRICKY_HEADERS, ids=range(len(TRICKY_HEADERS)))
def test_tricky_json_headers_decode_alike_in_both_twins(header):
    frame = len(header).to_bytes(4, "big") + header + b"body"
    differential.same("broker.remoting.command", "decode_frame", frame)

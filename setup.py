"""The compiled twins of the hot codec functions (the frame and header codec, record encode/check/decode, hashing,
the dispatch loop): Cython builds of functions whose pure-Python module stays the reference, as asyncpg and aiokafka
do; everything else is in pyproject.toml.

Each extension is optional: without a C compiler (or with a failed build) `pip install` still succeeds and
mqlake runs the pure-Python reference modules, saying so once at start-up (store/format/native.py).
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

TWINS = [
    "store.format._hashing",
    "store.format._properties",
    "store.format._records",
    "store.format._units",
    "store._dispatch",
    "broker.remoting._command",
    "store.format._runs",
    "broker.remoting._send",
    "store.format._transaction",
    "broker.remoting._tx",
    "store.format._appender",
    "store._commitlog",
    "pipelines.index_rebuild._scan",
]
# C libraries a twin links against (the record and run encoders call zlib's crc32 directly).
LIBRARIES = {"store.format._runs": ["z"], "store.format._records": ["z"], "store.format._appender": ["z"]}


class OptionalBuildExt(build_ext):
    """A twin that fails to build (no compiler, no Python headers) is a warning, not a failed install."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # setuptools raises PlatformError / CompileError subclasses of Exception
            print(f"mqlake: compiled codecs not built ({e}); the pure-Python twins will run", file=sys.stderr)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as e:
            print(f"mqlake: {ext.name} not built ({e}); its pure-Python twin will run", file=sys.stderr)


def extensions() -> list[Extension]:
    if os.environ.get("MQLAKE_NO_EXTENSIONS", "") not in ("", "0"):
        return []
    try:
        from Cython.Build import cythonize
    except ImportError as e:
        print(f"mqlake: Cython is not importable ({e}); the pure-Python twins will run", file=sys.stderr)
        return []
    exts = [
        Extension(name, [name.replace(".", "/") + ".pyx"], libraries=LIBRARIES.get(name, []), optional=True)
        for name in TWINS
    ]
    return cythonize(exts, compiler_directives={"language_level": "3"}, quiet=True)


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})

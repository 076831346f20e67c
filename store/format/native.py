"""The choice, at import, between a codec module's compiled twin and its pure-Python reference. The hot pure
functions are compiled where it pays; the Python module stays the reference the tests and Java vectors hold both to.

A codec module ends with ``native.install(globals(), "store.format._hashing", ("java_string_hash", ...))``: when
the Cython extension imports and ``MQLAKE_NO_EXTENSIONS`` is unset, the named functions are replaced by the
compiled ones; otherwise the module keeps its own.  Both are recorded in :data:`TWINS`, so tests and the
differential fuzzers can run either (``tests/twins.py``).  A missing extension gives one warning per process,
naming the cause, and the package runs on the Python twin.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

ENV_DISABLE = "MQLAKE_NO_EXTENSIONS"


class ExtensionWarning(RuntimeWarning):
    """The compiled codec is not in use: the cause is in the message."""


@dataclass
class Twins:
    """One codec module's functions in both forms: ``python`` always, ``compiled`` when the extension loaded."""

    module: str
    extension: str
    python: dict[str, Callable[..., Any]] = field(default_factory=dict)
    compiled: dict[str, Callable[..., Any]] = field(default_factory=dict)


# Keyed by the codec module's name (``store.format.hashing``).
TWINS: dict[str, Twins] = {}
# Why no compiled twin is in use, once any codec module has asked; None while they all are.
missing_cause: str | None = None


def disabled() -> bool:
    return os.environ.get(ENV_DISABLE, "") not in ("", "0")


def load_extension(extension: str) -> tuple[Any, str | None]:
    """(the compiled module, None), or (None, why not): an ImportError of a missing build, or the switch."""
    try:
        return importlib.import_module(extension), None
    except ImportError as e:  # no compiler at install, a build for another Python, a failed build
        return None, f"{extension} does not import ({e})"


def install(namespace: MutableMapping[str, Any], extension: str, names: tuple[str, ...]) -> None:
    """Record ``names`` of the module whose globals are ``namespace`` and put the compiled twins in their place."""
    global missing_cause
    twins = TWINS[namespace["__name__"]] = Twins(namespace["__name__"], extension)
    twins.python = {name: namespace[name] for name in names}
    ext, cause = load_extension(extension)
    if ext is not None:
        twins.compiled = {name: getattr(ext, name) for name in names}
    if disabled():
        cause = f"{ENV_DISABLE} is set"
    elif cause is not None:
        _warn_missing(cause)
    if cause is not None:
        missing_cause = missing_cause or cause
        return
    namespace.update(twins.compiled)


def _warn_missing(cause: str) -> None:
    """Once per process: the first compiled module found missing names the cause."""
    if missing_cause is None:
        warnings.warn(
            f"mqlake runs its pure-Python codecs: {cause}; `make install` builds the compiled ones",
            ExtensionWarning,
            stacklevel=3,
        )


def compiled_module(extension: str) -> Any | None:
    """A compiled module whose reference is a whole Python code path rather than a function of the same shape (the
    dispatch loop: ``store.dispatch_loop``): the module, or None when the switch is set or it does not import
    (warned as for the codec twins)."""
    global missing_cause
    ext, cause = load_extension(extension)
    if disabled():
        return None
    if cause is not None:
        _warn_missing(cause)
        missing_cause = missing_cause or cause
    return ext


def fast_crc32() -> Callable[..., int] | None:
    """ISA-L's folding CRC-32 (the ``isal`` package), which the compiled twins use for the body CRC of bodies
    from a few hundred bytes on (five times zlib 1.2's table CRC on 1 KiB here, a Python call included); None
    without it, and they keep zlib's.  The Python twins always use zlib: the differential tests compare the two."""
    try:
        from isal.isal_zlib import crc32
    except ImportError:
        return None
    return crc32


def active() -> str:
    """Which twin the process runs: ``"compiled"`` or ``"python"``."""
    return "python" if missing_cause is not None else "compiled"

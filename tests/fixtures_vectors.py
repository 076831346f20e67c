"""Test vectors computed by Apache RocketMQ's own classes, once per session: tests/java/vectors/ runs the 4.9.7
store and common jars (StoreVectors, with FormatVectors' edge cases under "format"), tests/java/vectors5/ the
5.4.0 store for the records 4.x cannot write (V2, long topics)."""

from __future__ import annotations

import json

import pytest

from tests.peers import JAVA_SOURCES, compile_java, java


def run_vectors(tmp_path_factory, folder: str, main: str, peer: str) -> dict:
    work = tmp_path_factory.mktemp(folder)
    classes = compile_java(sorted((JAVA_SOURCES / folder).glob("*.java")), peer, work / "classes")
    proc = java(main, peer, str(work / "scratch"), classes=classes, home=work / "home")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


@pytest.fixture(scope="session")
def rmq(tmp_path_factory) -> dict:
    """What the 4.9.7 classes (the newest 4.x store Maven Central serves) computed."""
    return run_vectors(tmp_path_factory, "vectors", "StoreVectors", "rocketmq-4-broker")


@pytest.fixture(scope="session")
def stored(rmq, tmp_path_factory) -> list[dict]:
    """Records the 4.9.7 store wrote, and those the 5.4.0 store wrote (V2 records for long topics among them)."""
    return rmq["records"] + run_vectors(tmp_path_factory, "vectors5", "StoreVectors5", "rocketmq-5")["records"]


def java_string(utf16_hex: str) -> str:
    """A Java String sent as its UTF-16 code units (JSON cannot carry a lone surrogate)."""
    return bytes.fromhex(utf16_hex).decode("utf-16-be", "surrogatepass")

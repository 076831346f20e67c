"""The committed vectors are what the committed generator prints: tests/vectors/Vectors.java compiled and run
by the JDK (CI has Java 17), its output compared with tests/vectors/java_vectors.json."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

VECTORS_DIR = Path(__file__).parent / "vectors"


def test_vectors_are_the_output_of_the_committed_generator(tmp_path):
    if not (shutil.which("java") and shutil.which("javac")):
        pytest.skip("no JDK on PATH: tests/test_format.py still checks the vectors' generator by its SHA-256")
    subprocess.run(["javac", "-d", str(tmp_path), str(VECTORS_DIR / "Vectors.java")], check=True,
                   capture_output=True, timeout=120)  # fmt: skip
    out = subprocess.run(["java", "-cp", str(tmp_path), "Vectors"], cwd=VECTORS_DIR, check=True,
                         capture_output=True, timeout=120).stdout  # fmt: skip
    fresh = json.loads(out)
    stored = json.loads((VECTORS_DIR / "java_vectors.json").read_text(encoding="utf-8"))
    fresh.pop("java_version")
    stored.pop("java_version")
    assert fresh == stored

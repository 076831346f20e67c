"""Segment preallocation (``store.mapped_file.preallocate``): a file of exactly the segment's size, all zeros, made
atomically, whether the kernel writes the zeros (``sendfile`` from /dev/zero) or the process does."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from store import mapped_file
from store.mapped_file import MappedFile, preallocate

pytestmark = pytest.mark.unit

SIZE = 3 * 1024 * 1024 + 4096  # not a multiple of the 1 MiB write chunk of the fallback


def _assert_zeros(path: Path, size: int) -> None:
    data = path.read_bytes()
    assert len(data) == size
    assert data.count(0) == size
    assert not path.with_name(path.name + ".tmp").exists()


def test_preallocate_writes_exactly_size_zeros(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000"
    preallocate(path, SIZE)
    _assert_zeros(path, SIZE)


def test_preallocate_overwrites_stale_bytes_of_an_interrupted_attempt(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000"
    path.with_name(path.name + ".tmp").write_bytes(b"\xff" * (SIZE + 100))  # longer, and not zeros
    preallocate(path, SIZE)
    _assert_zeros(path, SIZE)


@pytest.mark.parametrize("kernel_writes", [0, 1024 * 1024 + 17], ids=["no-sendfile", "sendfile-stops-early"])
def test_preallocate_falls_back_to_write_for_what_sendfile_did_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel_writes: int
) -> None:
    """Where sendfile cannot read /dev/zero (or stops), the process writes the rest, after what the kernel wrote."""
    real = os.sendfile
    left = [kernel_writes]

    def limited(out_fd: int, in_fd: int, offset: int | None, count: int) -> int:
        if left[0] == 0:
            raise OSError(22, "sendfile refused (simulated: no /dev/zero splice on this system)")
        n = real(out_fd, in_fd, offset, min(count, left[0]))
        left[0] -= n
        return n

    monkeypatch.setattr(mapped_file.os, "sendfile", limited)
    path = tmp_path / "00000000000000000000"
    preallocate(path, SIZE)
    _assert_zeros(path, SIZE)


def test_a_preallocated_segment_maps_and_reads_back_what_is_written(tmp_path: Path) -> None:
    mf = MappedFile(tmp_path / "00000000000000000000", SIZE, create=True)
    try:
        mf.view[SIZE - 5 :] = b"tail!"
        mf.wrote = SIZE
        assert mf.flush() == SIZE
    finally:
        mf.close()
    data = (tmp_path / "00000000000000000000").read_bytes()
    assert data[-5:] == b"tail!" and data.count(0) == SIZE - 5

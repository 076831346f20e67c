"""The disk the tests' stores measure: half full, whatever the host's disk holds.

A store reads its disk's usage to expire segments early (over 75 % or 85 %) and to refuse puts (over 90 %), as
RocketMQ does. A test about anything else must behave the same on a new machine with an empty disk and on a
crowded one, so every store the suite runs — in the pytest process and in the brokers and writers it starts —
reads this figure instead. Tests of those thresholds set their own figures on top (monkeypatch), and the
measurement itself is tested on the statvfs values it is fed.
"""

from __future__ import annotations

HALF_FULL = 0.50  # below every threshold: 75 % (diskMaxUsedSpaceRatio), 85 % and 90 %

# Python code a child process runs before the program it stands for (``python -c PIN + "..."``); the child's
# PYTHONPATH must hold the repository root so that ``tests`` imports.
PIN = "import tests.host_disk as _host_disk; _host_disk.pin(); "


def pin(ratio: float = HALF_FULL) -> None:
    """Make every MessageStore of this process read ``ratio`` as its disk's usage."""
    import store.message_store

    store.message_store.disk_used_ratio = lambda _path: ratio

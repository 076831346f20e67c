"""``BrokerStats``: the counters GET_BROKER_RUNTIME_INFO reports."""

from __future__ import annotations

import time


class BrokerStats:
    def __init__(self) -> None:
        self.boot_timestamp = int(time.time() * 1000)
        self.put_total = 0
        self.get_total = 0

    def put(self, n: int) -> None:
        self.put_total += n

    def got(self, n: int) -> None:
        self.get_total += n

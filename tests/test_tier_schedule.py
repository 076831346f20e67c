"""The embedded default of tiering: ``mqlake up`` with ``lakePath`` runs the tier job itself at ``deleteWhen``;
without it the broker says how many bytes wait for tiering and where to point a lake."""

from __future__ import annotations

import asyncio
import re

import pytest
from deltalake import DeltaTable

from store.retention import SegmentManifest, SegmentState
from tests.fixtures_broker import MqlakeServer, stop_servers
from tests.helpers import wait_until
from tests.test_tier_fallthrough import COUNT, TOPIC
from tests.tiering_broker import EVERY_HOUR, SEGMENT, in_queue, produce, walk


def _server(tmp_path, **conf) -> MqlakeServer:
    return MqlakeServer(
        tmp_path / "server", mappedFileSizeCommitLog=SEGMENT, defaultTopicQueueNums=4, deleteWhen=EVERY_HOUR,
        cleanResourceInterval=200, fileReservedTime=0, **conf,
    ).start()  # fmt: skip


@pytest.mark.integration
def test_without_a_lake_the_broker_reports_the_bytes_waiting_for_tiering(tmp_path) -> None:
    server = _server(tmp_path)
    try:
        asyncio.run(produce(server.namesrv_addr, TOPIC, COUNT, "tiered"))

        def waiting() -> list[tuple[int, int]]:
            line = r"(\d+) bytes in (\d+) expired CommitLog segment\(s\) wait for tiering"
            found = re.findall(line, server.log_text())
            return [(int(b), int(n)) for b, n in found]

        wait_until(lambda: any(n > 0 for _, n in waiting()), 30, what="the broker to report segments waiting")
        assert waiting()[0] == (0, 0)  # at start-up
        size, count = next(w for w in waiting() if w[1] > 0)
        assert size == count * SEGMENT
        assert "set lakePath in broker.conf" in server.log_text()
        states = [e.state for e in SegmentManifest(server.store_dir).entries()]
        assert SegmentState.DELETED not in states  # nothing untiered leaves the disk
    finally:
        stop_servers([server])


@pytest.mark.spark
@pytest.mark.timeout(600)  # a cold Spark child process
def test_with_a_lake_mqlake_up_tiers_at_delete_when_and_serves_what_it_deleted(tmp_path) -> None:
    lake = tmp_path / "lake"
    server = _server(tmp_path, lakePath=lake)
    try:
        sent = asyncio.run(produce(server.namesrv_addr, TOPIC, COUNT, "tiered"))

        def deleted() -> int:
            return sum(e.state == SegmentState.DELETED for e in SegmentManifest(server.store_dir).entries())

        wait_until(lambda: deleted() >= 2, 300, what="the embedded tier run and the clean pass after it")
        wait_until(lambda: re.search(r"tier run \S+: \d+ tiered", server.log_text()), 120,
                   what="the tier run's report in the broker's log")  # fmt: skip
        assert asyncio.run(walk(server.namesrv_addr, TOPIC, 0)) == [s.body for s in in_queue(sent, 0)]
        tiered = DeltaTable(str(lake / "messages")).to_pyarrow_table(columns=["topic", "queue_id"]).to_pylist()
        assert tiered and all(r["topic"] == TOPIC for r in tiered)  # what the local store no longer holds
    finally:
        stop_servers([server])

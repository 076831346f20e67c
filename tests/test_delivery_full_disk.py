"""A delayed (delay level) or timer message that falls due while the broker's disk is full: the store refuses
its delivery, the broker keeps it and retries, and it is delivered once space returns.

A real ``mqlake up`` on a small tmpfs (the full-disk tests' ``small_disk``); another file takes every free byte
after the message is parked, the broker's disk check (every 0.5 s) marks the disk full, and the broker's log
says when the due delivery was refused and when the store took it again.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from broker.client import Message, Producer
from broker.remoting.codes import RequestCode
from tests.fixtures_broker import MqlakeServer, count_topic, read_topic, remoting_call, stop_servers
from tests.helpers import wait_until
from tests.test_full_disk import _fill, small_disk  # noqa: F401 - fixture

REFUSED = "the store refused 1 due message(s)"
TAKEN = "the store takes due messages again"


def _info(server: MqlakeServer) -> dict[str, str]:
    return json.loads(remoting_call(server.broker_addr, RequestCode.GET_BROKER_RUNTIME_INFO).body)["table"]


async def _send(server: MqlakeServer, message: Message) -> None:
    producer = Producer("due-pg", server.namesrv_addr)
    await producer.start()
    try:
        await producer.send(message)
    finally:
        await producer.shutdown()


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["delay", "timer"])
def test_a_delivery_due_on_a_full_disk_waits_and_is_delivered_once_space_returns(tmp_path, small_disk, kind):  # noqa: F811
    work = tmp_path / "broker"
    small_disk("24m", "broker/store")
    server = MqlakeServer(work, real_disk=True, cleanResourceInterval="500", messageDelayLevel="6s",
                          mappedFileSizeCommitLog=str(1024 * 1024))  # fmt: skip
    try:
        server.start()
        message = (Message("Due", b"later", delay_time_level=1) if kind == "delay"
                   else Message("Due", b"later", properties={"TIMER_DELAY_MS": "6000"}))  # fmt: skip
        asyncio.run(_send(server, message))
        wait_until(lambda: _info(server)["dispatchBehindBytes"] == "0", 10, what="the parked message dispatched")
        filler = _fill(work / "store")
        wait_until(lambda: _info(server)["commitLogDiskRatio"] == "1.0", 10, what="the broker to see a full disk")
        assert count_topic(server.namesrv_addr, "Due") == 0, "delivered before the disk was full: no test"

        wait_until(lambda: REFUSED in server.run_log(), 30, what="the due delivery to be refused")
        assert server.running
        assert count_topic(server.namesrv_addr, "Due") == 0
        if kind == "delay":
            assert _info(server)["scheduleMessageOffset_1"] == "0,1", "the level's offset waits for the delivery"

        filler.unlink()
        got = read_topic(server.namesrv_addr, "Due", 1)
        [delivered] = [m for q in got.values() for m in q]
        assert delivered.body == b"later"
        assert TAKEN in server.run_log()
        assert server.stop() == 0
    finally:
        stop_servers([server])

"""An in-process broker for tests that talk to it over real loopback connections: ``LiveBroker`` (a
BrokerController on its own event-loop thread) and the ``fresh_broker`` fixture that makes them."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.config import build_configs
from broker.remoting import headers as h
from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode
from broker.remoting.command import RemotingCommand
from broker.server.controller import BrokerController
from store.format import msgid, properties
from store.format.records import MessageRecord, decode_record
from tests import harness
from tests.helpers import wait_dispatched

SMALL = {
    "mappedFileSizeCommitLog": str(1024 * 1024),
    "mappedFileSizeConsumeQueue": str(20 * 1000),
    "maxHashSlotNum": "1000",
    "maxIndexNum": "4000",
    "maxMessageSize": str(64 * 1024),
}
SUB = 0x4  # PullSysFlag.SUBSCRIPTION


class LiveBroker:
    """A BrokerController on its own event-loop thread; tests run coroutines on that loop."""

    def __init__(self, store_dir: Path, **conf: str) -> None:
        self.store_dir = store_dir
        self.conf = {**SMALL, "listenPort": "0", "storePathRootDir": str(store_dir), **conf}
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(harness.loop_exception_handler())
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.controller: BrokerController | None = None
        self.client: RemotingClient | None = None

    def run(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self, pull_recheck_s: float | None = None) -> LiveBroker:
        """``pull_recheck_s``: the period of the parked-pull re-check (RocketMQ's safety net, 5 s), for a test that
        must see a parked pull woken by nothing else than a message's arrival."""
        bc, sc = build_configs(self.conf)
        self.controller = BrokerController(bc, sc)
        if pull_recheck_s is not None:
            self.controller.hold._check_interval = pull_recheck_s
        self.run(self.controller.start())
        self.addr = self.controller.addr
        self.client = self.run(_new_client())
        return self

    def stop(self) -> None:
        if self.client is not None:
            self.run(self.client.close())
        if self.controller is not None:
            self.run(self.controller.shutdown())
        self.client = self.controller = None

    def close(self) -> None:
        self.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        assert not self.thread.is_alive(), "the broker's event-loop thread did not stop"
        self.loop.close()

    def call(self, code: int, header: h.Header | None = None, body: bytes = b"", timeout: float = 10.0, **ext):
        cmd = RemotingCommand.request(code, header, body, ext=ext or None)
        return self.run(self.client.invoke(self.addr, cmd, timeout), timeout + 5)

    # --- conveniences -----------------------------------------------------------------------------------
    def send(self, topic: str, body: bytes, queue_id: int = 0, tags: str | None = None, keys: str | None = None,
             v2: bool = True, **props: str) -> RemotingCommand:  # fmt: skip
        p = {"UNIQ_KEY": msgid.UniqKeyGenerator().next(), **props}
        if tags:
            p["TAGS"] = tags
        if keys:
            p["KEYS"] = keys
        v1 = h.SendMessageRequestHeader(
            producer_group="pg", topic=topic, default_topic="TBW102", default_topic_queue_nums=4, queue_id=queue_id,
            sys_flag=0, born_timestamp=int(time.time() * 1000), flag=0,
            properties=properties.encode_properties(p).decode(),
        )  # fmt: skip
        if v2:
            resp = self.call(RequestCode.SEND_MESSAGE_V2, h.SendMessageRequestHeaderV2.from_v1(v1), body)
        else:
            resp = self.call(RequestCode.SEND_MESSAGE, v1, body)
        self.dispatched()
        return resp

    def dispatched(self) -> None:
        """Reads see a message once the store's reput has dispatched it (a millisecond or so after the put)."""
        wait_dispatched(self.controller.store)

    def pull(self, topic: str, queue_id: int, offset: int, expr: str = "*", group: str = "g", flags: int = SUB,
             suspend_ms: int = 0, commit_offset: int = 0, timeout: float = 10.0) -> RemotingCommand:  # fmt: skip
        hdr = h.PullMessageRequestHeader(
            consumer_group=group, topic=topic, queue_id=queue_id, queue_offset=offset, max_msg_nums=32,
            sys_flag=flags, commit_offset=commit_offset, suspend_timeout_millis=suspend_ms, subscription=expr,
            sub_version=0, expression_type="TAG",
        )  # fmt: skip
        return self.call(RequestCode.PULL_MESSAGE, hdr, timeout=timeout)


async def _new_client(**kwargs) -> RemotingClient:
    return RemotingClient(**kwargs)


def records(body: bytes) -> list[MessageRecord]:
    out, pos = [], 0
    while pos < len(body):
        rec = decode_record(body, pos, check_crc=True)
        out.append(rec)
        pos += rec.total_size
    return out


@pytest.fixture
def fresh_broker(tmp_path):
    made: list[LiveBroker] = []

    def factory(**conf: str) -> LiveBroker:
        b = LiveBroker(tmp_path / f"store{len(made)}", **conf).start()
        made.append(b)
        return b

    yield factory
    for b in made:
        b.close()


@contextlib.asynccontextmanager
async def running_broker(store_dir: Path, **conf: str) -> AsyncIterator[BrokerController]:
    """A started BrokerController on the caller's event loop (small store, an OS-chosen port), shut down after."""
    controller = BrokerController(*build_configs({**SMALL, "listenPort": "0", "storePathRootDir": str(store_dir),
                                                  **conf}))  # fmt: skip
    await controller.start()
    try:
        yield controller
    finally:
        await controller.shutdown()

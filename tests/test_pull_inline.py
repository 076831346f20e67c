"""PULL_MESSAGE answered without a task when the local store has the answer at once (``PullProcessor.pull_message``).

The remoting layer answers a handler's returned RemotingCommand in the same pass of the loop and runs a returned
coroutine as a task; a pull that must park (or read the tier) is such a coroutine.  Each test drives the broker's
own handler on its loop and checks the answer it gives, and that a client over loopback sees the same.
"""

from __future__ import annotations

import asyncio
import inspect

import pytest

from broker.remoting import headers as h
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.server.pull import FLAG_COMMIT_OFFSET, FLAG_SUBSCRIPTION, FLAG_SUSPEND, PullProcessor
from tests.helpers import wait_until
from tests.live_broker import LiveBroker, records

TOPIC = "InlinePulls"


@pytest.fixture
def broker(tmp_path):
    b = LiveBroker(tmp_path / "store").start(pull_recheck_s=3600)  # a parked pull wakes only by an arrival
    yield b
    b.close()


def _request(offset: int, flags: int = FLAG_SUBSCRIPTION, commit_offset: int = 0) -> RemotingCommand:
    hdr = h.PullMessageRequestHeader(
        consumer_group="g", topic=TOPIC, queue_id=0, queue_offset=offset, max_msg_nums=32, sys_flag=flags,
        commit_offset=commit_offset, suspend_timeout_millis=60_000, subscription="*", sub_version=0,
        expression_type="TAG",
    )  # fmt: skip
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, hdr)


def _handle(b: LiveBroker, cmd: RemotingCommand) -> object:
    """The broker's pull handler called on its loop, as the remoting layer calls it; its raw result."""

    async def call() -> object:
        return PullProcessor(b.controller).pull_message(cmd, None)  # type: ignore[arg-type]

    return b.run(call())


@pytest.mark.integration
def test_a_pull_that_finds_messages_is_answered_by_the_handler_itself(broker: LiveBroker) -> None:
    b = broker
    for body in (b"one", b"two"):
        assert b.send(TOPIC, body).code == ResponseCode.SUCCESS
    resp = _handle(b, _request(0, FLAG_SUBSCRIPTION | FLAG_SUSPEND | FLAG_COMMIT_OFFSET, commit_offset=1))
    assert isinstance(resp, RemotingCommand), "a pull with messages waiting went to a task"
    assert resp.code == ResponseCode.SUCCESS and [r.body for r in records(resp.body)] == [b"one", b"two"]
    assert resp.read_header(h.PullMessageResponseHeader).next_begin_offset == 2
    assert b.controller.offsets.query("g", TOPIC, 0) == 1  # the offset the pull carried is committed here too
    wire = b.pull(TOPIC, 0, 1)  # and a client over loopback gets the same answer
    assert wire.code == ResponseCode.SUCCESS and [r.body for r in records(wire.body)] == [b"two"]


@pytest.mark.integration
def test_a_pull_at_the_end_answers_not_found_at_once_or_parks_until_a_message_arrives(broker: LiveBroker) -> None:
    b = broker
    assert b.send(TOPIC, b"first").code == ResponseCode.SUCCESS
    resp = _handle(b, _request(1))  # no SUSPEND flag: nothing to wait for
    assert isinstance(resp, RemotingCommand) and resp.code == ResponseCode.PULL_NOT_FOUND
    pending = _handle(b, _request(1, FLAG_SUBSCRIPTION | FLAG_SUSPEND))
    assert inspect.iscoroutine(pending), "a pull that must wait was answered at once"
    answered = asyncio.run_coroutine_threadsafe(pending, b.loop)
    wait_until(lambda: b.controller.hold.parked_count == 1, 10, what="the pull to park")
    assert not answered.done()
    assert b.send(TOPIC, b"second").code == ResponseCode.SUCCESS
    resp = answered.result(30)  # well within its 60 s suspend: the arrival answered it
    assert resp.code == ResponseCode.SUCCESS and [r.body for r in records(resp.body)] == [b"second"]


@pytest.mark.integration
def test_a_refused_pull_is_answered_with_its_code(broker: LiveBroker) -> None:
    b = broker  # the refusal is raised by the handler itself now: the remoting layer still answers it
    hdr = _request(0).read_header(h.PullMessageRequestHeader)
    hdr.topic = "NoSuchTopic"
    assert b.call(RequestCode.PULL_MESSAGE, hdr).code == ResponseCode.TOPIC_NOT_EXIST

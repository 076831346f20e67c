"""Recovery seen from outside: a real ``mqlake up`` is stopped, its store damaged, and it is restarted on the same
store.

- A record in the middle of the last CommitLog segment is damaged, so recovery truncates there.  Queries by key must
  then find nothing for the records cut off, never the message written at their offset since, and must find the
  keys of the messages sent after the restart (mqlake's client, Apache RocketMQ's mqadmin, the broker's raw answer).
- A ConsumeQueue file is deleted or cut short while the broker is stopped: it is rebuilt from the CommitLog.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from broker.client import Admin, Message, MessageQueue, Producer
from broker.remoting import headers as h
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.loop import run
from store.format import msgid, records
from tests.fixtures_broker import REPO, TEST_CONF, read_topic, remoting_call
from tests.helpers import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOPIC = "RecoveryKeys"
N = 40
CUT = 20  # the record damaged: it and every later one are cut off
SEGMENT = int(TEST_CONF["mappedFileSizeCommitLog"])
ROCKETMQ_4_LIB = REPO / ".peers" / "rocketmq-4" / "lib"


def _send(server, prefix: str, n: int) -> list[tuple[int, str]]:
    """Send ``n`` messages keyed ``{prefix}-0000``...; returns their (CommitLog offset, message id).  Every prefix
    has the same length and every body too, so each message takes the same number of bytes."""

    async def go() -> list[tuple[int, str]]:
        async with Producer("pg_recovery_keys", server.namesrv_addr) as p:
            mq = MessageQueue(TOPIC, "broker-a", 0)
            sent = [await p.send(Message(TOPIC, f"{prefix}-body-{i:04d}", keys=[f"{prefix}-{i:04d}"]), mq)
                    for i in range(n)]  # fmt: skip
        return [(msgid.decode_offset_msg_id(r.offset_msg_id)[1], r.msg_id) for r in sent]

    return run(go())


def _create_topic(server) -> None:
    async def go() -> None:
        async with Admin(server.namesrv_addr) as a:
            await a.create_topic(TOPIC, broker_addr=server.broker_addr, read_queue_nums=1, write_queue_nums=1)

    run(go())


def _client_query(server, key: str) -> list[bytes]:
    async def go() -> list[bytes]:
        async with Admin(server.namesrv_addr) as a:
            return [m.body for m in await a.query_msg_by_key(TOPIC, key)]

    return run(go())


def _broker_answer(server, key: str) -> list[records.MessageRecord] | None:
    """The broker's own QUERY_MESSAGE answer (before any client-side filtering): the records, None if not found."""
    now = int(time.time() * 1000)
    hdr = h.QueryMessageRequestHeader(topic=TOPIC, key=key, max_num=32, begin_timestamp=0,
                                      end_timestamp=now + 60_000)  # fmt: skip
    resp = remoting_call(server.broker_addr, RequestCode.QUERY_MESSAGE, hdr)
    if resp.code == ResponseCode.QUERY_NOT_FOUND:
        return None
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    out, pos = [], 0
    while pos < len(resp.body):
        rec = records.decode_record(resp.body, pos)
        out.append(rec)
        pos += rec.total_size
    return out


def _mqadmin_query(server, home: Path, key: str) -> str:
    """Apache RocketMQ's own ``mqadmin queryMsgByKey`` (4.9.8 tools) against the NameServer: its table of message
    ids, or "not found" when it reports that no message carries the key.  ``home`` is its ROCKETMQ_HOME (the tool
    reads conf/logback_tools.xml from there)."""
    conf = home / "conf" / "logback_tools.xml"
    if not conf.exists():
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text("<configuration><root level='OFF'/></configuration>\n")
    cmd = ["java", "-Xms64m", "-Xmx256m", "-cp", f"{ROCKETMQ_4_LIB}/*",
           "org.apache.rocketmq.tools.command.MQAdminStartup", "queryMsgByKey", "-n", server.namesrv_addr,
           "-t", TOPIC, "-k", key]  # fmt: skip
    env = {**os.environ, "ROCKETMQ_HOME": str(home)}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    if "query message by key finished, but no message" in out.stderr:
        return "not found"
    assert out.returncode == 0 and "Exception" not in out.stderr, out.stdout + out.stderr
    return out.stdout


def _damage(store_dir: Path, offset: int) -> None:
    """Overwrite the MAGIC of the record at ``offset``: it and everything after it become unreadable."""
    path = store_dir / "commitlog" / f"{offset - offset % SEGMENT:020d}"
    with open(path, "r+b") as f:
        f.seek(offset % SEGMENT + 4)
        f.write(b"\xde\xad\xbe\xef")


@pytest.mark.parametrize("graceful", [True, False], ids=["clean-stop", "killed"])
def test_query_by_key_after_recovery_truncates_the_commitlog(mqlake_server_factory, tmp_path, graceful):
    server = mqlake_server_factory()
    _create_topic(server)
    old = _send(server, "old", N)
    wait_until(lambda: _client_query(server, f"old-{N - 1:04d}"), 30, what="the last key indexed")
    assert [r.body for r in _broker_answer(server, f"old-{CUT + 5:04d}") or []] == [f"old-body-{CUT + 5:04d}".encode()]

    if graceful:
        server.stop()
    else:
        server.kill()
    cut = old[CUT][0]
    _damage(server.store_dir, cut)
    server.start()
    assert f"CommitLog truncated at offset {cut}" in server.run_log()
    # after a kill the index file is newer than the checkpoint and rebuilt whole, as in RocketMQ; after a clean
    # stop it is kept, and cut back to the CommitLog
    dropped = "newer than the checkpoint" if not graceful else f"at or past CommitLog offset {cut}"
    assert dropped in server.run_log()

    # before any new message: the cut keys are gone, the kept ones answer with their own message
    assert _broker_answer(server, f"old-{CUT + 5:04d}") is None
    assert _client_query(server, f"old-{CUT - 1:04d}") == [f"old-body-{CUT - 1:04d}".encode()]

    new = _send(server, "new", N - CUT)
    assert [off for off, _ in new] == [off for off, _ in old[CUT:]], "the new messages take the cut ones' offsets"
    wait_until(lambda: _client_query(server, f"new-{N - CUT - 1:04d}"), 30, what="the last new key indexed")
    for i in range(N - CUT):
        assert _client_query(server, f"new-{i:04d}") == [f"new-body-{i:04d}".encode()]
        assert _broker_answer(server, f"old-{CUT + i:04d}") is None  # never the new message at its offset
    for i in range(CUT):
        assert [r.body for r in _broker_answer(server, f"old-{i:04d}") or []] == [f"old-body-{i:04d}".encode()]

    # Apache RocketMQ's admin tool sees the same
    home = tmp_path / "rocketmq-home"
    found = _mqadmin_query(server, home, "new-0003").split()
    assert new[3][1] in found and old[CUT + 3][1] not in found
    assert _mqadmin_query(server, home, f"old-{CUT + 3:04d}") == "not found"


@pytest.mark.parametrize("damage", ["file-deleted", "file-short"])
def test_consume_queue_lost_while_stopped_cleanly_is_rebuilt(mqlake_server_factory, damage):
    """A ConsumeQueue file deleted (or cut short) while the broker was stopped cleanly: the restarted broker
    rebuilds it from the CommitLog, says so in its log, and serves every message of the queue again."""
    server = mqlake_server_factory()
    _create_topic(server)
    sent = _send(server, "cq", 30)
    wait_until(lambda: _client_query(server, "cq-0029"), 30, what="the last message dispatched")
    server.stop()
    (cq_file,) = (server.store_dir / "consumequeue" / TOPIC / "0").iterdir()
    if damage == "file-deleted":
        cq_file.unlink()
    else:
        with open(cq_file, "r+b") as f:
            f.truncate(20 * 10)
    server.start()
    assert f"ConsumeQueue {TOPIC}-0 rebuilt from the CommitLog: queue offsets 0 to 30" in server.run_log()
    got = read_topic(server.namesrv_addr, TOPIC, 30)
    assert [m.body for m in got[0]] == [f"cq-body-{i:04d}".encode() for i in range(30)]
    assert [m.commit_log_offset for m in got[0]] == [off for off, _ in sent]

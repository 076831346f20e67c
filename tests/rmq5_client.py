"""Drives the official RocketMQ 5.x Python client (PyPI ``rocketmq-python-client``) for the gRPC tests.

Run with the Python of ``.venv-rmq5`` (``tests/rmq5.py`` does), never imported by pytest: that client's top-level
package ``rocketmq`` is also the 4.x C++ client's.  Prints one JSON document on stdout.

    produce  --endpoint E --topic T [--count N] [--tag T] [--keys K...] [--group G] [--delay-ms D]
             [--tx commit|rollback|check-commit|check-rollback]  (check-*: left open for the broker's check-back)
             [--recall N]  (then recall the first N messages sent, by their receipts' recall handles)
    produce_until  --endpoint E --topic T --stop FILE  (sends one after the other until FILE exists)
    receive  --endpoint E --topic T --group G --expect N [--invisible S] [--ack] [--deadline S] [--filter TAG]
    receive_renew  as receive, then ChangeInvisibleDuration on each message before acking it
    push     --endpoint E --topic T --group G --expect N [--fail-first] [--deadline S]  (a PushConsumer)

Every command takes --ak/--sk (the client signs its calls), --namespace and --report-error (a failure is printed as
``{"error": ...}``, with the client's logged errors, rather than failing the command).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import threading
import time
from pathlib import Path

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)


class _Checker(TransactionChecker):
    """Answers the broker's check-back of a transaction left open with ``resolution``; records what it was asked."""

    def __init__(self, resolution: TransactionResolution) -> None:
        self.resolution = resolution
        self.checked: list[str] = []
        self.done = threading.Event()

    def check(self, message: Message) -> TransactionResolution:
        self.checked.append(message.message_id)
        self.done.set()
        return self.resolution


TLS = False  # --tls: the channel is TLS (the client trusts the roots in GRPC_DEFAULT_SSL_ROOTS_FILE_PATH)
CREDENTIALS = Credentials()  # --ak/--sk: the client signs its calls (its credentials provider); none by default
NAMESPACE = ""  # --namespace: the client's topics and groups are of this namespace


def _config(endpoint: str) -> ClientConfiguration:
    return ClientConfiguration(endpoint, CREDENTIALS, namespace=NAMESPACE, request_timeout=5)


def produce(a: argparse.Namespace) -> dict:
    # a check-back racing the producer's own commit or rollback answers the same
    resolution = TransactionResolution.COMMIT if a.tx in ("commit", "check-commit") else TransactionResolution.ROLLBACK
    checker = _Checker(resolution)
    producer = Producer(_config(a.endpoint), (a.topic,), checker=checker if a.tx else None, tls_enable=TLS)
    producer.startup()
    sent = []
    try:
        for i in range(a.count):
            msg = Message()
            msg.topic = a.topic
            msg.body = f"{a.prefix}-{i}".encode()
            if a.tag:
                msg.tag = a.tag
            for key in a.keys or ():
                msg.keys = key
            msg.add_property("index", str(i))
            if a.group:
                msg.message_group = a.group
            if a.delay_ms:
                msg.delivery_timestamp = int(time.time() * 1000 + a.delay_ms) // 1000 + 1
            if a.tx:
                tx = producer.begin_transaction()
                receipt = producer.send(msg, tx)
                if a.tx == "commit":
                    tx.commit()
                elif a.tx == "rollback":
                    tx.rollback()  # check-*: left open, for the broker's check-back to resolve
            else:
                receipt = producer.send(msg)
            sent.append({"message_id": receipt.message_id, "offset": receipt.offset,
                         "transaction_id": receipt.transaction_id, "queue": receipt.message_queue.message_queue0().id,
                         "recall_handle": receipt.recall_handle})  # fmt: skip
        out: dict = {"sent": sent}
        if a.recall:
            out["recalled"] = [producer.recall_message(a.topic, m["recall_handle"]) for m in sent[: a.recall]]
        if a.tx and a.tx.startswith("check"):
            checker.done.wait(a.deadline)
            out["checked"] = checker.checked
            if a.consume_group:  # the producer stays up (its EndTransaction may still be on its way) until then
                a.group, a.ack = a.consume_group, True
                out.update(receive(a))
    finally:
        producer.shutdown()
    return out


def produce_until(a: argparse.Namespace) -> dict:
    """Sends ``<prefix>-<i>`` one after the other until the file ``--stop`` exists, through whatever fails (a
    broker killed, no master yet: the client's own retries and route refresh are what is tested); what it got
    acknowledged, how many failed, and the first failures' messages."""
    producer = Producer(_config(a.endpoint), (a.topic,), tls_enable=TLS)
    producer.startup()
    acked: list[str] = []
    failures: list[str] = []
    failed = 0
    stop = Path(a.stop)
    try:
        i = 0
        while not stop.exists():
            msg = Message()
            msg.topic = a.topic
            msg.body = f"{a.prefix}-{i}".encode()
            try:
                producer.send(msg)
                acked.append(f"{a.prefix}-{i}")
            except Exception as e:  # noqa: BLE001 - a failed send is counted; the loop goes on
                failed += 1
                if len(failures) < 5:
                    failures.append(str(e))
                time.sleep(0.2)  # the client's pace while no master serves (not a wait for a state)
            i += 1
    finally:
        producer.shutdown()
    return {"acked": acked, "failed": failed, "failures": failures}


def receive(a: argparse.Namespace) -> dict:
    expression = FilterExpression(a.filter) if a.filter else FilterExpression()
    consumer = SimpleConsumer(_config(a.endpoint), a.group, {a.topic: expression}, await_duration=a.await_s,
                              tls_enable=TLS)
    consumer.startup()
    got = []
    errors = []
    acked = []
    end = time.monotonic() + a.deadline
    try:
        while len(got) < a.expect and time.monotonic() < end:
            for m in consumer.receive(min(32, a.expect - len(got)), a.invisible) or []:
                item = {"body": m.body.decode(errors="replace"), "message_id": m.message_id, "tag": m.tag,
                        "topic": m.topic, "namespace": m.namespace, "keys": sorted(m.keys),
                        "attempt": m.delivery_attempt,
                        "group": m.message_group, "properties": dict(m.properties),
                        "receipt_handle": m.receipt_handle, "delivery_timestamp": m.delivery_timestamp,
                        "received_at": time.time(), "len": len(m.body), "md5": hashlib.md5(m.body).hexdigest(),
                        "corrupted": m.corrupted}  # fmt: skip
                if len(m.body) <= 64:
                    item["hex"] = m.body.hex()
                if a.mode == "renew":
                    consumer.change_invisible_duration(m, a.invisible)
                    item["renewed_handle"] = m.receipt_handle
                if a.ack or a.mode == "renew":
                    consumer.ack(m)
                    acked.append(m)
                got.append(item)
        if a.ack_again:  # acking a handle twice: the second must fail
            for m in acked[:1]:
                try:
                    consumer.ack(m)
                except Exception as e:  # noqa: BLE001 - the failure is the result reported
                    errors.append({"code": getattr(e, "code", None), "message": str(e)})
    finally:
        consumer.shutdown()
    return {"received": got, "errors": errors}


class _Listener(MessageListener):
    """Records each delivery; fails a message's first delivery when asked to (``--fail-first``)."""

    def __init__(self, fail_first: bool, expect: int) -> None:
        self.fail_first = fail_first
        self.expect = expect
        self.deliveries: list[dict] = []
        self.succeeded: set[str] = set()
        self.lock = threading.Lock()
        self.done = threading.Event()

    def consume(self, message: Message) -> ConsumeResult:
        ok = not (self.fail_first and message.delivery_attempt == 1)
        with self.lock:
            self.deliveries.append({"body": message.body.decode(), "attempt": message.delivery_attempt, "ok": ok})
            if ok:
                self.succeeded.add(message.message_id)
            if len(self.succeeded) >= self.expect:
                self.done.set()
        return ConsumeResult.SUCCESS if ok else ConsumeResult.FAILURE


def push(a: argparse.Namespace) -> dict:
    listener = _Listener(a.fail_first, a.expect)
    consumer = PushConsumer(_config(a.endpoint), a.group, listener, {a.topic: FilterExpression()})
    consumer.startup()
    try:
        listener.done.wait(a.deadline)
    finally:
        consumer.shutdown()
    with listener.lock:
        return {"deliveries": list(listener.deliveries)}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["produce", "produce_until", "receive", "receive_renew", "push"])
    p.add_argument("--endpoint", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--prefix", default="m")
    p.add_argument("--tag")
    p.add_argument("--keys", nargs="*")
    p.add_argument("--group")
    p.add_argument("--delay-ms", type=int, default=0)
    p.add_argument("--tx", choices=["commit", "rollback", "check-commit", "check-rollback"])
    p.add_argument("--recall", type=int, default=0, help="produce: recall the first N messages sent")
    p.add_argument("--expect", type=int, default=1)
    p.add_argument("--invisible", type=int, default=10)
    p.add_argument("--await-s", type=int, default=2)
    p.add_argument("--deadline", type=float, default=30)
    p.add_argument("--ack", action="store_true")
    p.add_argument("--ack-again", action="store_true")
    p.add_argument("--filter")
    p.add_argument("--fail-first", action="store_true", help="push: fail each message's first delivery")
    p.add_argument("--stop", help="produce_until: the file whose existence ends the sends")
    p.add_argument("--consume-group", help="produce --tx check-*: then receive in this group before stopping")
    p.add_argument("--tls", action="store_true")
    p.add_argument("--ak", default="", help="access key the client signs with")
    p.add_argument("--sk", default="", help="its secret key")
    p.add_argument("--namespace", default="", help="the client's namespace")
    p.add_argument("--report-error", action="store_true",
                   help="a failure is the result: {'error': {'type', 'code', 'message', 'logged'}}, exit 0")
    a = p.parse_args()
    global TLS, CREDENTIALS, NAMESPACE
    TLS = a.tls
    CREDENTIALS = Credentials(a.ak, a.sk)
    NAMESPACE = a.namespace
    a.mode = "renew" if a.command == "receive_renew" else "plain"
    try:
        commands = {"produce": produce, "produce_until": produce_until, "push": push}
        out = commands.get(a.command, receive)(a)
    except Exception as e:
        if not a.report_error:
            raise
        # a refused route lookup reaches the caller as a plain Exception: the status is in the client's log
        logged = [line for f in sorted(Path.home().glob("logs/**/*.log"))
                  for line in f.read_text(errors="replace").splitlines() if "[ERROR]" in line]  # fmt: skip
        out = {"error": {"type": type(e).__name__, "code": getattr(e, "code", None), "message": str(e),
                         "logged": logged}}  # fmt: skip
    json.dump(out, sys.stdout)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

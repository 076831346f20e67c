"""The recall handle against RocketMQ 5.4.0's own ``RecallMessageHandle`` (tests/java/recall/RecallHandles.java, run
on the pinned jars): mqlake builds the same text Java does, and accepts and refuses the same handles."""

from __future__ import annotations

import base64

import pytest

from broker.server.recall import RecallHandle
from tests.peers import JAVA_SOURCES, compile_java, java

pytestmark = pytest.mark.integration

VALID = RecallHandle("TopicA", "broker-a", "1764405000001", "7F00000100002A9F0000000000000001")
CANDIDATES = [
    VALID.encode(),
    VALID.encode().rstrip("="),  # Java's decoder does not need the padding
    "",
    "@@@",
    base64.b64encode(b"v1 a+b c 1 d>?").decode(),  # the standard alphabet's "+" and "/": not URL-safe
    base64.urlsafe_b64encode(b"v2 T b 1 id").decode(),
    base64.urlsafe_b64encode(b"v1 T b 1").decode(),
    base64.urlsafe_b64encode(b"v1 T b 1 id extra").decode(),  # more fields: the first four are taken
    base64.urlsafe_b64encode(b"v1 T  1 id").decode(),  # an empty field
]


def _python_decode(handle: str) -> str:
    try:
        h = RecallHandle.decode(handle)
    except ValueError:
        return "invalid"
    return "\t".join((h.topic, h.broker_name, h.timestamp, h.message_id))


def test_handles_encode_and_decode_as_rocketmqs_own(tmp_path) -> None:
    classes = compile_java([JAVA_SOURCES / "recall" / "RecallHandles.java"], "rocketmq-5", tmp_path / "classes")
    built = java("RecallHandles", "rocketmq-5", "build", VALID.topic, VALID.broker_name, VALID.timestamp,
                 VALID.message_id, classes=classes, home=tmp_path / "home")  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    assert built.stdout.strip() == VALID.encode()
    decoded = java("RecallHandles", "rocketmq-5", "decode", *CANDIDATES, classes=classes, home=tmp_path / "home")
    assert decoded.returncode == 0, decoded.stderr[-3000:]
    assert decoded.stdout.splitlines() == [_python_decode(c) for c in CANDIDATES]

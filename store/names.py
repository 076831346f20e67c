"""Names that come from the wire: the one place that says which topic and group names are acceptable, which topics
belong to the broker, and that a name used as a file name keeps the path inside the store.

The rules are RocketMQ 5's (``TopicValidator``): a topic or group is made of ``[%|a-zA-Z0-9_-]``, a topic is at
most 127 characters, a group at most 120.  Every path a request reaches checks a
name here once, before it is stored or becomes a directory (sends, CONSUMER_SEND_MSG_BACK, gRPC, END_TRANSACTION,
delay and timer delivery, the admin codes, configs copied from an HA master).  The store checks again, with
:func:`path_under`, wherever a name becomes a path, so a record written before these checks existed (or by another
program) cannot make it leave the store dir.
"""

from __future__ import annotations

import re
from pathlib import Path

from store.constants import (
    AUTO_CREATE_TOPIC_KEY_TOPIC,
    BENCHMARK_TOPIC,
    OFFSET_MOVED_EVENT,
    RETRY_GROUP_TOPIC_PREFIX,
    ROCKSDB_OFFSET_TOPIC,
    ROCKSDB_TRANS_HALF_TOPIC,
    ROCKSDB_TRANS_OP_HALF_TOPIC,
    SCHEDULE_TOPIC,
    SELF_TEST_TOPIC,
    SYSTEM_TOPIC_PREFIX,
    TIMER_TOPIC,
    TRACE_TOPIC,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
)
from store.errors import MQLakeError

TOPIC_MAX_LENGTH = 127  # TopicValidator.TOPIC_MAX_LENGTH
GROUP_MAX_LENGTH = 120  # TopicValidator 5.x: "%RETRY%" + the group stays within TOPIC_MAX_LENGTH
FILE_NAME_MAX_BYTES = 255  # NAME_MAX of the file systems the store lives on: one path component
LEGAL_CHARS = "^[%|a-zA-Z0-9_-]+$"  # as RocketMQ's remarks spell it
_LEGAL = re.compile(r"[%|a-zA-Z0-9_-]*")

# TopicValidator's SYSTEM_TOPIC_SET, and 5.x's timer topic.
SYSTEM_TOPICS = frozenset({
    AUTO_CREATE_TOPIC_KEY_TOPIC, SCHEDULE_TOPIC, BENCHMARK_TOPIC, TRANS_HALF_TOPIC, TRACE_TOPIC, TRANS_OP_HALF_TOPIC,
    TRANS_CHECK_MAX_TIME_TOPIC, SELF_TEST_TOPIC, OFFSET_MOVED_EVENT, ROCKSDB_OFFSET_TOPIC, ROCKSDB_TRANS_HALF_TOPIC,
    ROCKSDB_TRANS_OP_HALF_TOPIC, TIMER_TOPIC,
})  # fmt: skip
# TopicValidator's NOT_ALLOWED_SEND_TOPIC_SET, and TBW102: a client routes by it but never stores into it.
NOT_ALLOWED_SEND_TOPICS = frozenset({
    SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC, SELF_TEST_TOPIC,
    OFFSET_MOVED_EVENT, ROCKSDB_TRANS_HALF_TOPIC, ROCKSDB_TRANS_OP_HALF_TOPIC, AUTO_CREATE_TOPIC_KEY_TOPIC,
})  # fmt: skip


class IllegalName(MQLakeError, ValueError):
    """A name that cannot be stored or used as a file name in the store."""


def _illegal_chars(name: str) -> bool:
    """``TopicValidator.isTopicOrGroupIllegal`` (a full match: a trailing newline is illegal too)."""
    return _LEGAL.fullmatch(name) is None


def _name_error(kind: str, name: str | None, max_length: int) -> str | None:
    """``TopicValidator.validateTopic`` / ``validateGroup`` (RocketMQ 5): its checks in its order, its remarks."""
    if name and len(name) <= max_length and _LEGAL.fullmatch(name) is not None:
        return None  # the common case, in one test: this runs on every send the fast path does not take
    if not name or not name.strip():
        return f"The specified {kind} is blank."
    if _illegal_chars(name):
        return f"The specified {kind}: {name}, contains illegal characters, allowing only {LEGAL_CHARS}"
    return f"The specified {kind}: {name}, is longer than {kind} max length: {max_length}"


def topic_error(topic: str | None) -> str | None:
    """Why a topic from a client is refused, or None."""
    return _name_error("topic", topic, TOPIC_MAX_LENGTH)


def group_error(group: str | None) -> str | None:
    """Why a consumer or producer group from a client is refused, or None.  Its ``%RETRY%`` and ``%DLQ%`` topics
    are then legal topics too."""
    return _name_error("group", group, GROUP_MAX_LENGTH)


def stored_group_error(group: str | None) -> str | None:
    """Why a group cannot be kept (one copied from a master, named by an offset commit), or None: the client's rule,
    but as long as a group created before RocketMQ 5's 120-character limit may be while its ``%RETRY%`` topic is
    still a file name."""
    return _name_error("group", group, FILE_NAME_MAX_BYTES - len(RETRY_GROUP_TOPIC_PREFIX))


def stored_topic_error(topic: str | None) -> str | None:
    """Why a topic cannot be stored (a REAL_TOPIC about to be delivered, a topic copied from a master or named by
    deleteTopic or an offset commit), or None: the client's rule, but up to :data:`FILE_NAME_MAX_BYTES` characters
    rather than 127, as RocketMQ 5 stores longer topics (the retry topics of groups created before 5.x limited
    groups to 120 characters) with 2-byte topic lengths."""
    return _name_error("topic", topic, FILE_NAME_MAX_BYTES)


def is_system_topic(topic: str) -> bool:
    """``TopicValidator.isSystemTopic``: a topic the broker keeps for itself; clients may not create or delete one."""
    return topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIX)


def send_forbidden(topic: str) -> bool:
    """Whether a client may not send to ``topic``: RocketMQ's not-allowed set, TBW102, and every ``rmq_sys_`` topic
    (the timer's among them: a message sent there would be delivered to the REAL_TOPIC the client wrote)."""
    return topic in NOT_ALLOWED_SEND_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIX)


def forbidden_send_remark(topic: str) -> str:
    return f"Sending message to topic[{topic}] is forbidden."


def file_name_error(name: str) -> str | None:
    """Why ``name`` cannot be one component of a path in the store, or None."""
    if not name or name in (".", ".."):
        return f"{name!r} is not a file name"
    if "/" in name or "\\" in name or "\0" in name:
        return f"{name!r} holds a path separator or a NUL"
    if len(name.encode("utf-8", "surrogatepass")) > FILE_NAME_MAX_BYTES:
        return f"{name[:20]!r}... is longer than {FILE_NAME_MAX_BYTES} bytes"
    return None


def path_under(root: Path, *names: str) -> Path:
    """``root``/``names[0]``/... after checking that each name is one plain component (so the path cannot climb out
    of ``root``) and that none of them is a symbolic link leading outside ``root``; raises :class:`IllegalName`
    otherwise.  Every path the store builds from a topic goes through here: ConsumeQueue directories (created or
    loaded) and deleteTopic.  Costs an ``lstat`` per name: a start-up opens every queue through it."""
    path = root
    for name in names:
        bad = file_name_error(name)
        if bad is not None:
            raise IllegalName(f"{root}: {bad}")
        path = path / name
        if path.is_symlink() and not path.resolve().is_relative_to(root.resolve()):
            raise IllegalName(f"{path} leads outside {root}")
    return path

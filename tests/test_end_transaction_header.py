"""The END_TRANSACTION header's hand-written paths (the producer's ``end_transaction_ext``, the broker's
``read_end_transaction_header``, on both twins of ``tx_codec.read_end_transaction``) against the generic header
codec, which the rest of the protocol uses."""

from __future__ import annotations

import pytest

from broker.client.transaction_producer import end_transaction_ext
from broker.remoting.codes import RequestCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import HeaderError
from broker.remoting.headers import EndTransactionRequestHeader
from broker.server.transaction import read_end_transaction_header

pytestmark = pytest.mark.unit

CASES = [
    ("pg", 0, 0, 8, False, "AC11000100002A9F0000000000000001", "AC11000100002A9F0000000000000001"),
    ("group-ü", 2**40, 2**62, 12, True, "", None),
    ("g", 7, 4096, 0, False, "x", "t"),
]


@pytest.mark.parametrize(("group", "queue_offset", "clog_offset", "state", "check", "msg_id", "tx_id"), CASES)
def test_the_producers_header_is_the_generic_encoders(group, queue_offset, clog_offset, state, check, msg_id, tx_id,
                                                     twin):
    header = EndTransactionRequestHeader(
        producer_group=group, tran_state_table_offset=queue_offset, commit_log_offset=clog_offset,
        commit_or_rollback=state, from_transaction_check=check, msg_id=msg_id, transaction_id=tx_id,
    )  # fmt: skip
    ext = end_transaction_ext(group, queue_offset, clog_offset, state, check, msg_id, tx_id)
    assert list(ext.items()) == list(header.to_ext().items())  # same keys, same order: the same JSON header
    cmd = RemotingCommand.request(RequestCode.END_TRANSACTION, oneway=True, ext=ext)
    decoded = RemotingCommand.decode(cmd.encode()[4:])
    assert decoded.read_header(EndTransactionRequestHeader) == header
    assert read_end_transaction_header(decoded) == (group, queue_offset, clog_offset, state, check, msg_id)


@pytest.mark.parametrize(
    "ext",
    [
        {"tranStateTableOffset": "1", "commitLogOffset": "2", "commitOrRollback": "8", "msgId": "m"},
        {"producerGroup": "g", "tranStateTableOffset": "x", "commitLogOffset": "2", "commitOrRollback": "8",
         "msgId": "m"},
    ],
)  # fmt: skip
def test_a_bad_header_fails_as_the_generic_parser_fails(ext: dict[str, str], twin: str) -> None:
    cmd = RemotingCommand.request(RequestCode.END_TRANSACTION, ext=ext)
    with pytest.raises(HeaderError) as generic:
        cmd.read_header(EndTransactionRequestHeader)
    with pytest.raises(HeaderError) as fast:
        read_end_transaction_header(cmd)
    assert str(fast.value) == str(generic.value)


def test_from_transaction_check_is_read_as_java_parses_a_boolean(twin: str) -> None:
    base = {"producerGroup": "g", "tranStateTableOffset": "1", "commitLogOffset": "2", "commitOrRollback": "8",
            "msgId": "m"}  # fmt: skip
    for raw, expected in (("TRUE", True), ("true", True), ("1", False), ("yes", False)):
        cmd = RemotingCommand.request(RequestCode.END_TRANSACTION, ext={**base, "fromTransactionCheck": raw})
        assert read_end_transaction_header(cmd)[4] is expected
        assert cmd.read_header(EndTransactionRequestHeader).from_transaction_check is expected

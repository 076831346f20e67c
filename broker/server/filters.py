"""Property (SQL92) subscriptions: whether the broker accepts one, and its compiled selector.

One rule for CHECK_CLIENT_CONFIG (46) and PULL_MESSAGE (11), as Java's broker answers both: a non-TAG expression
needs ``enablePropertyFilter`` (else SYSTEM_ERROR), only SQL92 is known, and an expression that does not compile
is SUBSCRIPTION_PARSE_FAILED with the parser's message. Compiled selectors are cached by expression text, so a
subscription compiles once whatever number of pulls and heartbeats carry it.
"""

from __future__ import annotations

from broker.config import BrokerConfig
from broker.filter.sql92 import Selector, SelectorError, compile_selector
from broker.remoting.codes import ResponseCode
from broker.remoting.errors import RequestRefused
from broker.remoting.protocol.heartbeat import EXPRESSION_TYPE_SQL92


def property_selector(config: BrokerConfig, expression_type: str, expression: str) -> Selector:
    """The compiled selector of a non-TAG subscription, or the refusal (RequestRefused) Java answers."""
    if not config.enable_property_filter:
        raise RequestRefused(
            ResponseCode.SYSTEM_ERROR, f"The broker does not support consumer to filter message by {expression_type}"
        )
    if expression_type != EXPRESSION_TYPE_SQL92:
        raise RequestRefused(ResponseCode.SUBSCRIPTION_PARSE_FAILED, f"Filter type {expression_type} is unknown")
    try:
        return compile_selector(expression)
    except SelectorError as e:
        raise RequestRefused(ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(e)) from None

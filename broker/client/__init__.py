"""An asyncio RocketMQ client: ``Producer``, ``PullConsumer``, ``PushConsumer`` and ``Admin``.

Speaks the remoting protocol through ``broker.remoting.client.RemotingClient`` and decodes every received message
with store/format/records.py, so it reads exactly the bytes the broker stores.
"""

from broker.client.admin import Admin
from broker.client.errors import MQBrokerError, MQClientError
from broker.client.message import (
    ConsumeFromWhere,
    ConsumeResult,
    Message,
    MessageExt,
    MessageModel,
    MessageQueue,
    PullResult,
    PullStatus,
    SendResult,
    SendStatus,
)
from broker.client.producer import Producer
from broker.client.pull_consumer import PullConsumer
from broker.client.push_consumer import PushConsumer
from broker.client.transaction_producer import LocalTransactionState, TransactionProducer, TransactionSendResult

__all__ = [
    "Admin", "ConsumeFromWhere", "ConsumeResult", "LocalTransactionState", "MQBrokerError", "MQClientError",
    "Message", "MessageExt", "MessageModel", "MessageQueue", "Producer", "PullConsumer", "PullResult", "PullStatus",
    "PushConsumer", "SendResult", "SendStatus", "TransactionProducer", "TransactionSendResult",
]  # fmt: skip

"""RocketMQ's reserved names and well-known defaults (``MixAll``, ``TopicValidator``, ``PopAckConstants``,
``TimerMessageStore``), spelled once.

Clients, tools and Apache RocketMQ's own broker send and expect these exact strings, so the values are RocketMQ's.
This module holds names only: :mod:`store.names` says which of them a client may use, and
:mod:`store.format.properties` holds the message property names.
"""

from __future__ import annotations

# Prefixes (MixAll): a group's retry and dead-letter topics, the broker's own topics and groups.
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
SYSTEM_TOPIC_PREFIX = "rmq_sys_"
CID_RMQ_SYS_PREFIX = "CID_RMQ_SYS_"

# Topics the broker keeps for itself (TopicValidator).
AUTO_CREATE_TOPIC_KEY_TOPIC = "TBW102"  # the template clients route a topic the NameServer does not know by
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"  # delay-level messages wait here, one queue per level
BENCHMARK_TOPIC = "BenchmarkTest"
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"  # prepared transactional messages, queue 0
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"  # one op message per resolved half
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"  # halves checked transactionCheckMax times
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"  # message traces of clients with tracing on
SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
OFFSET_MOVED_EVENT = "OFFSET_MOVED_EVENT"
ROCKSDB_OFFSET_TOPIC = "CHECKPOINT_TOPIC"
# RocketMQ 5's half and op topics of its RocksDB transaction store: mqlake has none, but no client may use the names
ROCKSDB_TRANS_HALF_TOPIC = "RMQ_SYS_ROCKSDB_TRANS_HALF_TOPIC"
ROCKSDB_TRANS_OP_HALF_TOPIC = "RMQ_SYS_ROCKSDB_TRANS_OP_HALF_TOPIC"
TIMER_TOPIC = SYSTEM_TOPIC_PREFIX + "wheel_timer"  # 5.x timer messages wait here, queue 0
RECALL_MESSAGE_TAG = "_RECALL_TAG_"  # the tag of the delete mark a RECALL_MESSAGE writes (RecallMessageProcessor)
REVIVE_TOPIC_PREFIX = SYSTEM_TOPIC_PREFIX + "REVIVE_LOG_"  # + the cluster name: a POP consumer's checkpoints

# Groups the broker keeps for itself (MixAll, PopAckConstants).
TOOLS_CONSUMER_GROUP = "TOOLS_CONSUMER"  # the group admin tools pull and query offsets as
FILTERSRV_CONSUMER_GROUP = "FILTERSRV_CONSUMER"
SELF_TEST_CONSUMER_GROUP = "SELF_TEST_C_GROUP"
TRANS_CHECK_GROUP = CID_RMQ_SYS_PREFIX + "TRANS"  # its offset on the half topic is the check service's progress
REVIVE_GROUP = CID_RMQ_SYS_PREFIX + "REVIVE_GROUP"  # its offset on the revive topic is the POP revive progress

# An extField of QUERY_MESSAGE (MixAll.UNIQUE_MSG_QUERY_FLAG): the key is a UNIQ_KEY, answer up to the default number.
UNIQUE_MSG_QUERY_FLAG = "_UNIQUE_KEY_QUERY"

# Defaults of BrokerConfig and the clients.
DEFAULT_CLUSTER = "DefaultCluster"
DEFAULT_BROKER_NAME = "broker-a"  # BrokerConfig.brokerName defaults to the host name; mqlake to this
DEFAULT_REGION_ID = "DefaultRegion"  # MixAll.DEFAULT_TRACE_REGION_ID, a record's MSG_REGION
DEFAULT_NAMESRV_PORT = 9876
DEFAULT_NAMESRV_ADDR = f"127.0.0.1:{DEFAULT_NAMESRV_PORT}"

"""The JSON bodies RocketMQ's remoting protocol carries, as pydantic models shared by the broker, the NameServer
and the client (Java's ``remoting.protocol`` packages): one class per body, camelCase aliases, read leniently as
fastjson writes and written as fastjson writes.

Modules: ``fastjson`` (the JSON dialects), ``wire`` (the base model and its errors), ``topic`` (TopicConfig,
DataVersion, the registration bodies), ``route`` (TopicRouteData, ClusterInfo), ``heartbeat`` (HeartbeatData and
its producer/consumer/subscription data), ``body`` (locks, stats, connections, lists and tables).

Request and response *headers* are not here: they are the dataclasses of ``broker.remoting.headers``, which the
send and pull hot paths read without a model layer.
"""

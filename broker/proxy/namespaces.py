"""Namespaces: a 5.x client's ``resource_namespace`` on each topic and group it names, as RocketMQ 5's proxy maps
it to the broker's names (``NamespaceUtil``): topic ``T`` of namespace ``ns`` is the broker's topic ``ns%T``, group
``G`` is ``ns%G`` (retry ``%RETRY%ns%G``, dead-letter ``%DLQ%ns%G``).  A system topic, and a name that already
carries the namespace, stay as they are.  Outgoing messages name their topic without the namespace and with it in
``resource_namespace``; a client without a namespace sees the broker's names.
"""

from __future__ import annotations

from broker.proxy.v2 import definition_pb2 as pb
from store import names
from store.constants import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX

SEPARATOR = "%"
_PREFIXES = (RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX)
_system = names.is_system_topic


def wrap(resource: pb.Resource) -> str:
    """The broker's name of a topic or group resource (``NamespaceUtil.wrapNamespace``)."""
    ns, name = resource.resource_namespace, resource.name
    if not ns or not name or _system(name):
        return name
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            rest = name[len(prefix) :]
            return name if rest.startswith(ns + SEPARATOR) else prefix + ns + SEPARATOR + rest
    return name if name.startswith(ns + SEPARATOR) else ns + SEPARATOR + name


def resource(name: str) -> pb.Resource:
    """A broker name as the client is shown it (``getNamespaceFromResource`` / ``withoutNamespace``)."""
    if _system(name):
        return pb.Resource(name=name)
    prefix = next((p for p in _PREFIXES if name.startswith(p)), "")
    ns, sep, bare = name[len(prefix) :].partition(SEPARATOR)
    if not sep or not ns or not bare:
        return pb.Resource(name=name)
    return pb.Resource(name=prefix + bare, resource_namespace=ns)

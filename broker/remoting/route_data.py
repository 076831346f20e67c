"""QueueData and BrokerData: the parts of a TopicRouteData body, written by the NameServer, read by clients."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MASTER_ID = 0  # brokerAddrs key of the master; slaves are 1, 2, ...


def _int(d: dict, *names: str, default: int | None = None) -> int:
    """The first present field of ``names`` (older spellings after the current one) as an int."""
    for n in names:
        if n in d and d[n] is not None:
            return int(d[n])
    if default is None:
        raise KeyError(names[0])
    return default


@dataclass(slots=True)
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0

    def to_json(self, legacy: bool = False) -> dict[str, Any]:
        """Fields in fastjson's (alphabetical) order. ``legacy``: as RocketMQ 4.0-4.8 wrote it, whose getter was
        ``getTopicSynFlag``; 4.9.0+ and 5.x write ``topicSysFlag``."""
        return {
            "brokerName": self.broker_name,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicSynFlag" if legacy else "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }

    @classmethod
    def from_json(cls, d: dict) -> QueueData:
        """Raises KeyError / ValueError / TypeError on a malformed entry."""
        return cls(
            broker_name=str(d["brokerName"]),
            read_queue_nums=_int(d, "readQueueNums"),
            write_queue_nums=_int(d, "writeQueueNums"),
            perm=_int(d, "perm"),
            topic_sys_flag=_int(d, "topicSysFlag", "topicSynFlag", default=0),
        )


@dataclass(slots=True)
class BrokerData:
    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = field(default_factory=dict)

    @property
    def master_addr(self) -> str | None:
        return self.broker_addrs.get(MASTER_ID)

    def to_json(self, legacy: bool = False) -> dict[str, Any]:
        """Fields in fastjson's order; ``enableActingMaster`` is 5.x's, absent from ``legacy`` (4.0-4.8) output.
        brokerAddrs keeps int keys: the route encoder decides whether they are written quoted."""
        out: dict[str, Any] = {
            "brokerAddrs": dict(sorted(self.broker_addrs.items())),
            "brokerName": self.broker_name,
            "cluster": self.cluster,
        }
        if not legacy:
            out["enableActingMaster"] = False
        return out

    @classmethod
    def from_json(cls, d: dict) -> BrokerData:
        """Raises KeyError / ValueError / TypeError on a malformed entry."""
        addrs = d.get("brokerAddrs") or {}
        if not isinstance(addrs, dict):
            raise ValueError(f"brokerAddrs is not a map: {addrs!r}")
        return cls(str(d.get("cluster", "")), str(d["brokerName"]), {int(k): str(v) for k, v in addrs.items()})

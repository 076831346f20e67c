"""Store settings, named as RocketMQ's ``MessageStoreConfig`` names them (camelCase aliases)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from store.format.delay import parse_delay_levels


class FlushDiskType(StrEnum):
    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


class BrokerRole(StrEnum):
    """``brokerRole``: a master answers sends (SYNC_MASTER only once its slave holds them); a slave replicates."""

    ASYNC_MASTER = "ASYNC_MASTER"
    SYNC_MASTER = "SYNC_MASTER"
    SLAVE = "SLAVE"


class ExpiredSegmentPolicy(StrEnum):
    TIER = "tier"  # keep expired segments until an offline job marks them tiered
    DELETE = "delete"  # RocketMQ's classic behaviour


@dataclass(frozen=True)
class Setting:
    """What a config key is, beyond its type (``Annotated[int, RUNTIME]``), declared once on the model.

    ``runtime``: UPDATE_BROKER_CONFIG may change it while the broker runs; the code reads it where it is used, so a
    change acts at once.  ``safety``: a durability or security setting; a misspelled key of one stops start-up
    rather than leaving the setting at its default.
    """

    runtime: bool = False
    safety: bool = False


RUNTIME = Setting(runtime=True)
SAFETY = Setting(safety=True)


def keys_where(model: type[BaseModel], flag: str) -> frozenset[str]:
    """The keys (aliases) of ``model`` whose :class:`Setting` has ``flag`` set."""
    return frozenset(
        f.alias or name
        for name, f in model.model_fields.items()
        if any(isinstance(m, Setting) and getattr(m, flag) for m in f.metadata)
    )


def parse_delete_when(text: str) -> frozenset[int]:
    """``deleteWhen``: ';'-separated hours of the local clock (00-23) at which expired segments go."""
    hours = set()
    for h in text.split(";"):
        if not h.strip().isdigit() or not 0 <= int(h) <= 23:
            raise ValueError(f"deleteWhen must be ';'-separated hours 00-23, got {text!r}")
        hours.add(int(h))
    return frozenset(hours)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.capitalize() for w in rest)


class MessageStoreConfig(BaseModel):
    model_config = ConfigDict(alias_generator=_camel, populate_by_name=True, extra="forbid", validate_assignment=True)

    store_path_root_dir: Path = Path.home() / "store"
    store_path_commit_log: Path | None = None
    mapped_file_size_commit_log: int = Field(1024 * 1024 * 1024, ge=4096)
    mapped_file_size_consume_queue: int = Field(300_000 * 20, ge=20)
    max_hash_slot_num: int = Field(5_000_000, ge=1)
    max_index_num: int = Field(5_000_000 * 4, ge=2)
    message_index_enable: bool = True
    max_message_size: Annotated[int, RUNTIME] = Field(1024 * 1024 * 4, ge=1)

    flush_disk_type: Annotated[FlushDiskType, SAFETY] = FlushDiskType.ASYNC_FLUSH
    flush_interval_commit_log: int = Field(500, ge=1)
    flush_commit_log_least_pages: int = Field(4, ge=0)
    flush_commit_log_thorough_interval: int = Field(10_000, ge=1)
    sync_flush_timeout: Annotated[int, SAFETY] = Field(5_000, ge=1)
    flush_interval_consume_queue: int = Field(1_000, ge=1)
    flush_consume_queue_least_pages: int = Field(2, ge=0)
    flush_consume_queue_thorough_interval: int = Field(60_000, ge=1)
    check_crc_on_recover: Annotated[bool, SAFETY] = Field(True, alias="checkCRCOnRecover")

    file_reserved_time: Annotated[float, RUNTIME] = Field(72, ge=0)  # hours
    delete_when: Annotated[str, RUNTIME] = "04"
    disk_max_used_space_ratio: Annotated[int, RUNTIME] = Field(75, ge=10, le=95)
    # 5.x names and clamps (4.x reads the same ratios from system properties): writes are refused above the
    # warning level, sealed segments expire regardless of age above the clean-forcibly level
    disk_space_warning_level_ratio: Annotated[int, RUNTIME] = 90
    disk_space_clean_forcibly_ratio: Annotated[int, RUNTIME] = 85
    clean_file_forcibly_enable: Annotated[bool, RUNTIME] = True
    clean_resource_interval: int = Field(10_000, ge=10)
    expired_segment_policy: ExpiredSegmentPolicy = ExpiredSegmentPolicy.TIER

    # Replication (MessageStoreConfig's names and defaults). haListenPort None: listenPort + 1, as BrokerStartup sets
    # it; 0 lets the OS pick.  haMasterAddress None: taken from the NameServer's register reply.
    broker_role: Annotated[BrokerRole, SAFETY] = BrokerRole.ASYNC_MASTER
    ha_listen_port: int | None = Field(None, ge=0, le=65535)
    ha_master_address: str | None = None
    ha_send_heartbeat_interval: int = Field(5_000, ge=1)
    ha_housekeeping_interval: int = Field(20_000, ge=1)
    ha_transfer_batch_size: int = Field(32 * 1024, ge=1)
    ha_max_gap_not_in_sync: int = Field(256 * 1024 * 1024, ge=0)
    access_message_in_memory_max_ratio: int = Field(40, ge=0, le=100)
    # Controller mode (RocketMQ 5, docs/ha.md): a send that waits for slaves waits for every member of the sync state
    # set (else for the first slave's ack), and a slave behind for haMaxTimeSlaveNotCatchup ms leaves the set.
    all_ack_in_sync_state_set: Annotated[bool, SAFETY] = False
    ha_max_time_slave_not_catchup: int = Field(15_000, ge=1)

    message_delay_level: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    flush_delay_offset_interval: int = Field(10_000, ge=1)  # ms between delayOffset.json writes
    # 5.x timer messages (TIMER_DELIVER_MS / TIMER_DELAY_SEC / TIMER_DELAY_MS)
    timer_wheel_enable: bool = True
    timer_max_delay_sec: int = Field(3600 * 24 * 3, ge=1)
    timer_precision_ms: int = Field(1000, ge=1)
    store_host: str = "127.0.0.1:10911"  # brokerIP1:listenPort, written into every record

    @field_validator("message_delay_level")
    @classmethod
    def _delay_levels(cls, v: str) -> str:
        parse_delay_levels(v)  # a string RocketMQ could not parse either is refused at load, naming the token
        return v

    @field_validator("disk_space_warning_level_ratio")
    @classmethod
    def _warning_level(cls, v: int) -> int:
        return min(max(v, 35), 90)

    @field_validator("disk_space_clean_forcibly_ratio")
    @classmethod
    def _clean_forcibly(cls, v: int) -> int:
        return min(max(v, 30), 85)

    @field_validator("delete_when")
    @classmethod
    def _hours(cls, v: str) -> str:
        parse_delete_when(v)
        return v

    @property
    def delete_hours(self) -> frozenset[int]:
        """``deleteWhen`` as hours of the local clock."""
        return parse_delete_when(self.delete_when)

    @property
    def commitlog_dir(self) -> Path:
        return self.store_path_commit_log or self.store_path_root_dir / "commitlog"

    @property
    def consume_queue_dir(self) -> Path:
        return self.store_path_root_dir / "consumequeue"

    @property
    def index_dir(self) -> Path:
        return self.store_path_root_dir / "index"

    @property
    def config_dir(self) -> Path:
        return self.store_path_root_dir / "config"

    @property
    def quarantine_dir(self) -> Path:
        """Where recovery copies the bytes it cuts off a torn CommitLog tail."""
        return self.store_path_root_dir / "quarantine"

    @property
    def store_host_tuple(self) -> tuple[str, int]:
        host, _, port = self.store_host.rpartition(":")
        return host.strip("[]"), int(port)

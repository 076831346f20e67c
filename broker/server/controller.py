"""BrokerController: the store, the managers, the request processors and the broker's timers, wired together.

Start: bind the port (so ``listenPort=0`` works and records carry the real address), open and recover the
store off the event loop, load the config files, then take requests and register with the NameServers.
Shutdown is the reverse and graceful: unregister, answer every parked pull, let in-flight requests finish
and stop accepting, persist consumer offsets, then shut the store down (which removes the abort marker).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from broker.acl.manager import WATCH_INTERVAL, PlainAclManager
from broker.config import BrokerConfig
from broker.remoting.client import RemotingClient
from broker.remoting.codes import CURRENT_VERSION, RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Channel, Handler, HandlerResult
from broker.remoting.errors import RemotingError, RequestRefused
from broker.remoting.headers import NotifyConsumerIdsChangedRequestHeader
from broker.remoting.server import RemotingServer
from broker.server import topics as tp
from broker.server.acl_admin import AclAdminProcessor
from broker.server.admin import AdminProcessor
from broker.server.client_manage import ClientManageProcessor
from broker.server.clients import ConsumerManager, ProducerManager
from broker.server.context import Processor
from broker.server.flush_acks import FlushAcks
from broker.server.groups import SubscriptionGroupManager
from broker.server.ha_autoswitch import AutoSwitchHAClient, AutoSwitchHAService
from broker.server.ha_master import HAService
from broker.server.ha_slave import HAClient
from broker.server.half_messages import RecentHalves
from broker.server.long_polling import PullRequestHoldService
from broker.server.metrics import MetricsExporter
from broker.server.offsets import ConsumerOffsetManager
from broker.server.operations import OperationsProcessor
from broker.server.pull import PullProcessor
from broker.server.query import QueryProcessor
from broker.server.queue_locks import RebalanceLockManager
from broker.server.queue_offsets import OffsetProcessor
from broker.server.recall import RecallProcessor
from broker.server.registration import NamesrvRegistrar
from broker.server.replicas import ReplicasManager
from broker.server.schedule import ScheduleProcessor
from broker.server.send import SendProcessor
from broker.server.slave_sync import SlaveSynchronize
from broker.server.stats import BrokerStatsManager
from broker.server.transaction import TransactionProcessor
from broker.tls_settings import tls_server_context
from lake.reader import LakeReader
from store import config_files as cf
from store import identity as store_identity
from store.config import BrokerRole, MessageStoreConfig
from store.epoch_file import EpochFile
from store.format import records
from store.message_store import MessageStore, PutMessageResult, PutMessageStatus, wants_wait

log = logging.getLogger(__name__)

CLIENT_SCAN_INTERVAL = 10.0
STATS_TICK_INTERVAL = 1.0  # the store TPS samples once a second; the stats items every 10 s, 10 min, 1 h


class BrokerController:
    """The broker; also the ``BrokerContext`` its processors are built on."""

    def __init__(self, broker_config: BrokerConfig, store_config: MessageStoreConfig, host: str | None = None) -> None:
        self.config = broker_config
        self.store_config = store_config
        self.host = host or broker_config.broker_ip1
        self._store: MessageStore | None = None
        config_dir = store_config.config_dir
        self.topics = tp.TopicConfigManager(
            config_dir,
            cluster_name=broker_config.broker_cluster_name,
            broker_name=broker_config.broker_name,
            auto_create_topic_enable=broker_config.auto_create_topic_enable,
            default_topic_queue_nums=broker_config.default_topic_queue_nums,
            cluster_topic_enable=broker_config.cluster_topic_enable,
            broker_topic_enable=broker_config.broker_topic_enable,
        )
        self.offsets = ConsumerOffsetManager(config_dir)
        self.groups = SubscriptionGroupManager(config_dir, broker_config.auto_create_subscription_group)
        self.consumers = ConsumerManager(on_group_changed=self._consumer_ids_changed)
        self.producers = ProducerManager()
        self.locks = RebalanceLockManager()
        self.recent_halves = RecentHalves()
        self.transactions = TransactionProcessor(self)
        self.recalls = RecallProcessor(self)
        check = 5.0 if broker_config.long_polling_enable else broker_config.short_polling_time_mills / 1000
        self.hold = PullRequestHoldService(self._max_offset, check)
        self.stats = BrokerStatsManager(broker_config.broker_cluster_name)
        self.lake = (
            LakeReader(broker_config.lake_path, broker_config.lake_cache_bytes, lambda: self.store.min_phy_offset,
                       broker_config.broker_name)  # fmt: skip
            if broker_config.lake_path
            else None
        )
        self._os_picks_port = broker_config.listen_port == 0
        self.registrar = NamesrvRegistrar(broker_config, self.topics, self._ha_port)
        # Replication: a master serves slaves on haListenPort; a slave follows the master the NameServer names.
        self.ha_service: HAService | None = None
        self.ha_client: HAClient | None = None
        self.slave_sync: SlaveSynchronize | None = None
        self._ha_remoting: RemotingClient | None = None
        # Controller mode (broker.server.replicas): the controllers decide the role; replication is AutoSwitch's
        self.replicas: ReplicasManager | None = None
        self.epochs: EpochFile | None = None
        self.auto_ha: AutoSwitchHAService | None = None
        self.auto_client: AutoSwitchHAClient | None = None
        self._master_search: asyncio.Task | None = None
        self._checked_back = False  # the transaction check-back runs from the first time this broker is master
        # told True when the controllers make this broker master, False when they make it a slave (the gRPC
        # endpoint starts and stops its pop service with the role)
        self.role_listeners: list[Callable[[bool], Awaitable[None]]] = []
        self.server = RemotingServer(self.host, broker_config.listen_port, name="broker",
                                     tls_mode=broker_config.tls.server_mode,
                                     ssl_context=tls_server_context(broker_config.tls))  # fmt: skip
        self.acl: PlainAclManager | None = None
        self.stopping = False
        self._ready = False
        self._registered = False  # with the NameServers: a start stopped before it unregisters nothing
        self._tasks: set[asyncio.Task] = set()
        self._timers: list[asyncio.Task] = []
        self._topics_task: asyncio.Future | None = None
        self._topics_saved: asyncio.Future | None = None
        self.flush_acks: FlushAcks | None = None  # SYNC_FLUSH: sends answered a group commit at a time
        # metricsExporterType=PROM: its latency histogram times every request; its collector reads the rest at scrape
        self.metrics = MetricsExporter(self) if broker_config.metrics_exporter_type == "PROM" else None

    # --- lifecycle ------------------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self.server.port

    @property
    def addr(self) -> str:
        return self.config.broker_addr

    @property
    def is_slave(self) -> bool:
        return self.store_config.broker_role == BrokerRole.SLAVE

    def _ha_port(self) -> int:
        if self.ha_service is not None:
            return self.ha_service.port
        if self.auto_ha is not None:
            return self.auto_ha.port
        port = self.store_config.ha_listen_port
        if port is not None:
            return port
        # listenPort + 1 as BrokerStartup sets it; a broker whose own port the OS picked lets it pick this one too
        return 0 if self._os_picks_port else self.config.listen_port + 1

    async def _start_replication(self) -> None:
        if self.config.enable_controller_mode:  # the role comes later, from the controllers
            creds = self.registrar.credentials
            self._ha_remoting = RemotingClient(language="JAVA", rpc_hook=creds.sign if creds is not None else None)
            self.epochs = await asyncio.to_thread(EpochFile, self.store_config.store_path_root_dir)
            self.slave_sync = SlaveSynchronize(
                self.config, self.topics, self.offsets, self.groups, self._ha_remoting, self.store.adopt_tiered
            )
            self.slave_sync.loaded()
            self.store.add_arrival_listener(self.slave_sync.on_arrival)
            return
        if self.is_slave:
            # Signed as the registrations are: a master with aclEnable answers its slave's config copies (and the
            # runtime info the HA client compares offsets with) only for a known account.
            creds = self.registrar.credentials
            self._ha_remoting = RemotingClient(language="JAVA", rpc_hook=creds.sign if creds is not None else None)
            self.ha_client = HAClient(self.store, self.store_config, self._ha_remoting)
            self.slave_sync = SlaveSynchronize(
                self.config, self.topics, self.offsets, self.groups, self._ha_remoting, self.store.adopt_tiered
            )
            self.slave_sync.loaded()
            self.store.add_arrival_listener(self.slave_sync.on_arrival)  # a replicated record of a new topic
            self.registrar.on_registered = self._master_learned
            self.ha_client.start()
        else:
            self.ha_service = HAService(self.store, self.store_config, self.host, self._ha_port())
            await self.ha_service.start()

    def _master_learned(self, ha_server_addr: str | None, master_addr: str | None) -> None:
        assert self.ha_client is not None and self.slave_sync is not None
        self.ha_client.update_master(ha_server_addr, master_addr)
        self.slave_sync.master_addr = master_addr

    async def learn_topic(self, topic: str) -> None:
        if self.slave_sync is not None:
            await self.slave_sync.learn_topic(topic)

    def ha_runtime_info(self) -> dict[str, str]:
        info = {"brokerRole": str(self.store_config.broker_role)}
        if self.ha_service is not None:  # what a slave may delete (as the master's tiering job marked it)
            info["tieredSegments"] = ",".join(map(str, self.store.tiered_segments()))
        for part in (self.ha_service, self.ha_client, self.auto_ha, self.auto_client, self.replicas):
            if part is not None:
                info.update(part.runtime_info())
        return info

    async def _stop_replication(self) -> None:
        if self.replicas is not None:
            await self.replicas.stop()
        if self._master_search is not None:
            self._master_search.cancel()
        if self.auto_client is not None:
            await self.auto_client.stop()
        if self.auto_ha is not None:
            await self.auto_ha.stop()
        if self.ha_client is not None:
            await self.ha_client.stop()
        if self.ha_service is not None:
            await self.ha_service.stop()
        if self._ha_remoting is not None:
            await self._ha_remoting.close()

    @property
    def store(self) -> MessageStore:
        """The open store; processors only run once it is (the guard answers SERVICE_NOT_AVAILABLE before)."""
        if self._store is None:  # a bug, not an input error: keep the traceback
            raise RuntimeError(f"broker {self.config.broker_name} is not started: it has no store yet")
        return self._store

    async def start(self, before_register: Callable[[], Awaitable[None]] | None = None) -> None:
        """Open the store and serve; ``before_register``: run once the broker serves and before it registers with
        the NameServers (the gRPC endpoint opens there), so a start it stops never appears to the cluster."""
        if self.config.acl_enable:  # a missing or bad file stops start-up: never serve open by accident
            self.acl = await asyncio.to_thread(PlainAclManager, self.config.acl_file)
            log.info("ACL enabled: %s, %d accounts", self.acl.path, len(self.acl.acl.accounts))
        self._register_handlers()
        self.server.add_close_listener(self._channel_closed)
        await self.server.start()  # requests before the store is ready are answered SERVICE_NOT_AVAILABLE
        try:
            if self.config.listen_port == 0:
                self.config.listen_port = self.server.port
            self.store_config.store_host = self.config.broker_addr
            # before the store opens: a store that names another broker is refused, untouched
            await asyncio.to_thread(store_identity.record_broker, self.store_config.store_path_root_dir,
                                    self.config.broker_cluster_name, self.config.broker_name)  # fmt: skip
            self._store = MessageStore(self.store_config)
            await asyncio.to_thread(self._store.start)
            commit = self._store.group_commit
            if commit is not None:
                sc = self.store_config
                self.flush_acks = FlushAcks(asyncio.get_running_loop(), commit, lambda: sc.sync_flush_timeout / 1000)
            await asyncio.to_thread(self._store.prepare_segment)
            await asyncio.to_thread(self._load_config_files)
            await asyncio.to_thread(self.transactions.load)
            await self._start_replication()
            if self.metrics is not None:  # a taken metrics port stops the start, naming it
                self.metrics.start()
        except BaseException:
            if self.metrics is not None:
                self.metrics.stop()
            await self._stop_replication()
            await self.server.stop(grace=0)
            if self._store is not None:
                await asyncio.to_thread(self._store.shutdown)
            raise
        self.hold.start()
        self.store.add_arrival_listener(self.hold.on_arrival)
        self.topics.on_change = self._topics_changed
        self.groups.on_change = self._groups_changed
        self._ready = True
        if not self.is_slave:  # as RocketMQ, only a master checks back on half messages
            self.transactions.start()
        if before_register is not None:
            await before_register()
        self._registered = True
        if self.config.enable_controller_mode:
            await self._start_controller_mode()
        await self.registrar.register_all()
        if self.slave_sync is not None:
            self._timers.append(
                asyncio.create_task(self._every(self.config.slave_sync_interval / 1000, self.slave_sync.sync_all))
            )
            self._spawn(self.slave_sync.sync_all())  # at once: a new slave serves reads with the master's topics
        self._timers += [
            asyncio.create_task(self._every(self.config.flush_consumer_offset_interval / 1000, self._persist_offsets)),
            asyncio.create_task(self._every(self._client_scan_interval, self._scan_clients)),
            asyncio.create_task(
                self._every(self.config.register_name_server_period / 1000, self.registrar.register_all)
            ),
            asyncio.create_task(self._every(STATS_TICK_INTERVAL, self.stats.tick)),
        ]
        if self.acl is not None:
            acl = self.acl
            self._timers.append(asyncio.create_task(
                self._every(WATCH_INTERVAL, acl.reload_if_changed_async)
            ))  # fmt: skip
        log.info("broker %s (%s) serving on %s, store %s", self.config.broker_name, self.config.broker_cluster_name,
                 self.addr, self.store_config.store_path_root_dir)  # fmt: skip

    # --- controller mode (RoleTarget) -------------------------------------------------------------------------
    async def _start_controller_mode(self) -> None:
        c = self.config
        assert self._ha_remoting is not None
        self.replicas = ReplicasManager(
            cluster=c.broker_cluster_name, broker_name=c.broker_name, broker_addr=self.addr,
            controller_addrs=c.controller_addrs, store_root=self.store_config.store_path_root_dir, target=self,
            client=self._ha_remoting, heartbeat_interval=c.broker_heartbeat_interval / 1000,
            heartbeat_timeout_ms=c.controller_heart_beat_timeout_mills, election_priority=c.broker_election_priority,
            sync_broker_period=c.sync_broker_metadata_period / 1000,
            sync_controller_period=c.sync_controller_metadata_period / 1000,
        )  # fmt: skip
        await self.replicas.start(wait=c.controller_heart_beat_timeout_mills / 1000 * 3)
        self._timers.append(asyncio.create_task(self._every(c.check_sync_state_set_period / 1000,
                                                            self._check_sync_state_set)))  # fmt: skip

    def replica_state(self) -> tuple[int, int, int]:
        epoch = self.epochs.last_epoch if self.epochs is not None else 0
        end = self.store.max_phy_offset
        return epoch, end, self.auto_ha.confirm_offset() if self.auto_ha is not None else end

    def set_sync_state_set(self, members: set[int]) -> None:
        if self.auto_ha is not None:
            self.auto_ha.set_sync_state_set(members)

    def _propose_set(self, members: set[int]) -> None:
        if self.replicas is not None:
            self._spawn(self.replicas.propose_sync_state_set(members))

    async def _check_sync_state_set(self) -> None:
        """``checkSyncStateSetAndDoReport``: a slave behind for haMaxTimeSlaveNotCatchup leaves the set."""
        if self.auto_ha is not None and self.replicas is not None and self.replicas.is_master:
            shrunk = self.auto_ha.shrunk_set()
            if shrunk != self.auto_ha.sync_state_set:
                try:
                    await self.replicas.propose_sync_state_set(shrunk)
                except RemotingError as e:  # a master cut off from its controllers: the set stands, asked again
                    log.warning("sync state set %s not reported to the controllers: %s", sorted(shrunk), e)

    async def become_master(self, epoch: int, sync_state_set: set[int]) -> None:
        assert self.replicas is not None and self.epochs is not None and self.replicas.broker_id is not None
        if self._master_search is not None:
            self._master_search.cancel()
        if self.slave_sync is not None:  # no table copies while master
            self.slave_sync.master_addr = None
        if self.auto_client is not None:
            await self.auto_client.stop()
            self.auto_client = None
        await asyncio.to_thread(self.store.change_role, BrokerRole.SYNC_MASTER)
        if epoch > self.epochs.last_epoch:
            await asyncio.to_thread(self.epochs.append, epoch, self.store.max_phy_offset)
        if self.auto_ha is None:
            ha = AutoSwitchHAService(self.store, self.store_config, self.epochs, self.host, self._ha_port(),
                                     self.replicas.broker_id, self._propose_set)  # fmt: skip
            ha.set_sync_state_set(sync_state_set)
            await ha.start()
            self.auto_ha = ha  # puts wait on it only once it knows the set: before, they are not acknowledged
        else:
            self.auto_ha.set_sync_state_set(sync_state_set)
        self.config.broker_id = 0  # the NameServers route sends to brokerId 0
        self._take_state_version(epoch)
        if not self._checked_back:
            self._checked_back = True
            self.transactions.start()
        self._spawn(self.registrar.register_all())  # routes lead to this master at once
        for listener in self.role_listeners:
            await listener(True)

    async def become_slave(self, master_addr: str, epoch: int) -> None:
        assert self.replicas is not None and self.epochs is not None and self.replicas.broker_id is not None
        assert self.slave_sync is not None
        # The store stops taking puts first; then the HA service stops, answering FLUSH_SLAVE_TIMEOUT to every put
        # still waiting for the sync state set. The new master cuts this log back to its epoch's start, so no put
        # taken from here on may be acknowledged.
        await asyncio.to_thread(self.store.change_role, BrokerRole.SLAVE)
        if self.auto_ha is not None:
            ha, self.auto_ha = self.auto_ha, None
            self.store_config.ha_listen_port = ha.port  # the same port when it is master again
            await ha.stop()
        self.config.broker_id = self.replicas.broker_id
        self._take_state_version(epoch)
        for listener in self.role_listeners:
            await listener(False)
        if self.auto_client is None:
            self.auto_client = AutoSwitchHAClient(self.store, self.store_config, self.epochs, self.replicas.broker_id)
            self.auto_client.start()
        self.slave_sync.master_addr = master_addr  # the periodic table copy (started with the broker) resumes
        if self._master_search is not None:
            self._master_search.cancel()
        self._master_search = asyncio.create_task(self._learn_master_ha(master_addr))

    def _take_state_version(self, epoch: int) -> None:
        """``DataVersion.nextVersion(masterEpoch)`` on a role change, as RocketMQ's ReplicasManager: the next
        registration carries the epoch, and a NameServer keeps the broker id's route with the newer one when a
        master cut off from its controllers still registers as master."""
        self.topics.data_version = cf.next_data_version(self.topics.data_version, epoch)

    async def _learn_master_ha(self, master_addr: str) -> None:
        """The master's HA address, from the NameServers' answer to this slave's registration (as RocketMQ's
        slave learns it), once they route to the master the controller named."""
        learned = asyncio.Event()

        fixed = self.store_config.ha_master_address  # a configured route to the master's HA port wins (a relay)

        def on_registered(ha_addr: str | None, master: str | None) -> None:
            if master == master_addr and ha_addr and self.auto_client is not None:
                self.auto_client.update_master(fixed or ha_addr)
                learned.set()

        self.registrar.on_registered = on_registered
        while not learned.is_set():
            await self.registrar.register_all()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    await learned.wait()
        self._spawn(self.slave_sync.sync_all() if self.slave_sync is not None else asyncio.sleep(0))

    async def _notify_role_changed(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        if self.replicas is None:
            return cmd.response(ResponseCode.SERVICE_NOT_AVAILABLE, "broker is not in controller mode or starting")
        await self.replicas.notify_role_changed(cmd)
        return cmd.response(ResponseCode.SUCCESS)

    @property
    def _client_scan_interval(self) -> float:
        # Every 10 s as RocketMQ, but often enough that a short channelExpiredTimeout is honoured too.
        return min(CLIENT_SCAN_INTERVAL, self.config.channel_expired_timeout / 4000)

    def _load_config_files(self) -> None:
        self.topics.load()
        self.offsets.load()
        self.groups.load()

    async def shutdown(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        for t in self._timers:
            t.cancel()
        for t in self._timers:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self._registered:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await self.registrar.unregister_all()
        await self.transactions.stop()
        await self.hold.stop()  # parked pulls re-read and answer now
        await self.server.stop(grace=5.0)
        await self._stop_replication()  # before the store closes: a slave appends to it
        if self.metrics is not None:  # no scrape reads the store while it closes
            await asyncio.to_thread(self.metrics.stop)
        if self._tasks:  # config persists and notifications still under way
            await asyncio.wait(list(self._tasks), timeout=10)
        if self._ready:
            snap = self.offsets.snapshot()
            persists: list[tuple[str, Callable[[], Awaitable[None]]]] = [
                ("topics", self.topics.persist_async), ("subscription groups", self.groups.persist_async)]  # fmt: skip
            if snap is not None:
                persists.insert(0, ("consumer offsets", functools.partial(self.offsets.write_async, snap)))
            for what, persist in persists:
                try:
                    await persist()
                except OSError as e:  # a full disk: the stop goes on, the previous file stays as it was
                    log.warning("%s not saved at shutdown: %s", what, e)
        self._ready = False
        if self._store is not None:
            await asyncio.to_thread(self._store.shutdown)
        await self.registrar.close()
        log.info("broker %s stopped", self.config.broker_name)

    async def _every(self, interval: float, fn: Callable[[], Any]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                result = fn()
                if asyncio.iscoroutine(result):
                    await result
            except OSError as e:  # a full disk: the previous file stays as it was, the next round tries again
                log.error("periodic %s failed: %s", getattr(fn, "__name__", fn), e)
            except Exception:
                log.exception("periodic %s failed", getattr(fn, "__name__", fn))

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Future:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- timers ----------------------------------------------------------------------------------------------
    async def _persist_offsets(self) -> None:
        snap = self.offsets.snapshot()
        if snap is not None:
            await self.offsets.write_async(snap)

    def _scan_clients(self, now: int | None = None) -> None:
        """Close the channels silent for channelExpiredTimeout at ``now`` (epoch ms, default the clock's)."""
        timeout = self.config.channel_expired_timeout
        for conn in self.consumers.scan_expired(timeout, now) + self.producers.scan_expired(timeout, now):
            log.info("closing %s: no heartbeat for %d ms", conn.remote_addr, timeout)
            conn.close()

    def _topics_changed(self) -> None:
        # The fsync runs off the loop (aiofiles): on a busy disk it can take seconds, and the loop serves everyone.
        self._topics_saved = self._spawn(self.topics.persist_async())
        self._topics_task = self._spawn(self._after_topics_changed(self._topics_saved))

    async def topics_saved(self) -> None:
        saved = self._topics_saved
        if not self.topics.unsaved:
            return
        if saved is None or saved.done():  # the last write failed (or ran before the change): write again
            saved = self._topics_saved = self._spawn(self.topics.persist_async())
        await asyncio.shield(saved)

    async def topics_persisted(self) -> None:
        """Wait until the latest topic change is on disk (and re-registered with the NameServers)."""
        if self._topics_task is not None:
            await asyncio.shield(self._topics_task)

    async def _after_topics_changed(self, persisted: asyncio.Future) -> None:
        # Registration does not wait for the write: clients can route a new topic only once the NameServers know it.
        # Before the broker's first registration (topics made while it starts) the first one carries them.
        if self._registered and not self.stopping:
            await self.registrar.register_all()
        await persisted

    def _groups_changed(self) -> None:
        self._spawn(self.groups.persist_async())

    # --- client events ---------------------------------------------------------------------------------------
    def _channel_closed(self, conn: Channel) -> None:
        self.consumers.channel_closed(conn)
        self.producers.channel_closed(conn)

    def _consumer_ids_changed(self, group: str, conns: list[Channel]) -> None:
        """Tell every consumer of ``group`` to rebalance now instead of at its next 20 s round."""
        if not self.config.notify_consumer_ids_changed_enable or self.stopping:
            return
        cfg = self.groups.find(group, create=False)
        if cfg is not None and not cfg.notify_consumer_ids_changed_enable:
            return
        header = NotifyConsumerIdsChangedRequestHeader(consumer_group=group)
        for conn in conns:
            self._spawn(self._notify(conn, RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, header,
                                                                   oneway=True)))  # fmt: skip

    @staticmethod
    async def _notify(conn: Channel, cmd: RemotingCommand) -> None:
        cmd.language = "JAVA"
        cmd.version = CURRENT_VERSION
        try:
            await conn.send_oneway(cmd)
        except RemotingError as e:
            log.debug("notify %s failed: %s", conn.remote_addr, e)

    # --- shared by processors --------------------------------------------------------------------------------
    def _max_offset(self, topic: str, queue_id: int) -> int:
        return self._store.get_max_offset_in_queue(topic, queue_id) if self._store is not None else 0

    async def put(self, msgs: list[records.MessageRecord]) -> PutMessageResult:
        """Append; in SYNC_FLUSH wait (without blocking the loop) for the group commit that makes it durable."""
        result, fut = self.store.put_nowait(msgs)
        if fut is not None:
            try:
                async with asyncio.timeout(self.store_config.sync_flush_timeout / 1000):
                    flushed = await asyncio.wrap_future(fut)
            except TimeoutError:
                flushed = False
            if not flushed and result.status == PutMessageStatus.PUT_OK:
                result.status = PutMessageStatus.FLUSH_DISK_TIMEOUT
        if self.ha_service is not None and self.store_config.broker_role == BrokerRole.SYNC_MASTER:
            await self._wait_for_slave(msgs[0], result)
        elif self.config.enable_controller_mode:
            await self._wait_for_replicas(msgs[0], result)
        if result.ok and msgs:
            self.stats.put(msgs[0].topic, len(msgs), result.append.wrote_bytes if result.append else 0)
        return result

    async def _wait_for_slave(self, first: records.MessageRecord, result: PutMessageResult) -> None:
        """SYNC_MASTER (``handleHA``): answer once a slave holds the messages; SLAVE_NOT_AVAILABLE when none is
        connected or in sync, FLUSH_SLAVE_TIMEOUT after syncFlushTimeout. The messages are stored either way."""
        append = result.append
        if append is None or result.status != PutMessageStatus.PUT_OK or not wants_wait(first):
            return
        assert self.ha_service is not None
        end = append.wrote_offset + append.wrote_bytes
        if not self.ha_service.is_slave_ok(end):
            result.status = PutMessageStatus.SLAVE_NOT_AVAILABLE
        elif not await self.ha_service.wait_for_slave(end, self.store_config.sync_flush_timeout / 1000):
            result.status = PutMessageStatus.FLUSH_SLAVE_TIMEOUT

    async def _wait_for_replicas(self, first: records.MessageRecord, result: PutMessageResult) -> None:
        """Controller mode (``handleHA``): answer once the sync state set holds the messages (every member with
        allAckInSyncStateSet, else one slave when the set has one); FLUSH_SLAVE_TIMEOUT after syncFlushTimeout, or at
        once when the store took them while this broker changes role and has no HA service to ask."""
        append = result.append
        if append is None or result.status != PutMessageStatus.PUT_OK or not wants_wait(first):
            return
        end = append.wrote_offset + append.wrote_bytes
        ha = self.auto_ha
        if ha is None or not await ha.wait_for_replicas(end, self.store_config.sync_flush_timeout / 1000):
            result.status = PutMessageStatus.FLUSH_SLAVE_TIMEOUT

    def config_changed(self, keys: set[str]) -> None:
        c = self.config
        self.topics.default_topic_queue_nums = c.default_topic_queue_nums
        self.groups.auto_create = c.auto_create_subscription_group
        if "autoCreateTopicEnable" in keys:
            self.topics.set_auto_create(c.auto_create_topic_enable)
        if "brokerPermission" in keys or "autoCreateTopicEnable" in keys:
            self.topics.changed()  # a new data version: the NameServers take the new permissions at once

    def create_retry_topic(self, group: str, queue_nums: int = 1) -> tp.TopicConfig:
        return self.topics.create_system_topic(tp.retry_topic(group), queue_nums, tp.PERM_READ | tp.PERM_WRITE)

    def create_dlq_topic(self, group: str) -> tp.TopicConfig:
        return self.topics.create_system_topic(tp.dlq_topic(group), tp.DLQ_NUMS_PER_GROUP, tp.PERM_READ | tp.PERM_WRITE)

    # --- routing ---------------------------------------------------------------------------------------------
    def _guard(self, handler: Handler) -> Handler:
        # A plain function, not a coroutine: the remoting layer then answers a handler that returns its response
        # directly (an ASYNC_FLUSH send) without a task per request, and runs a returned coroutine as a task.
        def guarded(cmd: RemotingCommand, conn: Channel) -> HandlerResult:
            # While stopping, requests are still served until the server stops reading: a consumer's last offset
            # commit must not be refused. Only pulls no longer park.
            if not self._ready:
                state = "shutting down" if self.stopping else "starting"
                return cmd.response(ResponseCode.SERVICE_NOT_AVAILABLE, f"broker is {state}")
            return handler(cmd, conn)

        acl = self.acl
        if acl is None:
            return guarded

        def checked(cmd: RemotingCommand, conn: Channel) -> HandlerResult:
            try:
                acl.check(cmd, conn.remote_host[0])
            except RequestRefused as e:
                log.info("refused %s from %s: %s", cmd.code, conn.remote_addr, e.remark)
                return cmd.response(e.code, e.remark)
            return guarded(cmd, conn)

        return checked

    def _register_handlers(self) -> None:
        processors: list[Processor] = [
            SendProcessor(self), PullProcessor(self), OffsetProcessor(self), ClientManageProcessor(self),
            AdminProcessor(self), QueryProcessor(self), AclAdminProcessor(self.config, self.acl), self.transactions,
            OperationsProcessor(self), ScheduleProcessor(self), self.recalls,
        ]  # fmt: skip
        self.server.register(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, self._guard(self._notify_role_changed))
        for processor in processors:
            for code, handler in processor.routes().items():
                if self.metrics is not None:
                    handler = self.metrics.timed(handler)
                self.server.register(code, self._guard(handler))

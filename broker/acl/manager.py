"""PlainAclManager: the broker's ACL — ``{rocketmqHome}/conf/plain_acl.yml``, watched and reloaded, and the
updates the admin codes make to it (``PlainPermissionManager``).

At start-up a missing or bad file is an AclConfigError (the broker does not start open). Afterwards the file
is re-read when its bytes change (RocketMQ's watcher compares a hash every 500 ms; ``reload_if_changed_async`` is
called on a timer): a bad version is logged and the last good rules stay in force. Updates through the admin
codes write the file atomically and take effect at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import aiofiles

from broker.acl.access import Rules
from broker.acl.rules import MIN_KEY_LENGTH, Account, AclConfigError, AclFile, DataVersion, read_acl, write_acl
from broker.remoting.command import RemotingCommand

log = logging.getLogger(__name__)

WATCH_INTERVAL = 0.5  # seconds between checks of the file for changes (RocketMQ's FileWatchService too)


class PlainAclManager:
    """Holds the rules in force; ``check`` is called for every request."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()  # updates run in worker threads; the loop only swaps references
        self._unreadable: str | None = None
        acl, raw = read_acl(path)
        self._install(acl, raw)

    def _install(self, acl: AclFile, raw: bytes) -> None:
        rules = Rules.compile(acl)
        self._acl = acl
        self.rules = rules
        self._digest = hashlib.sha256(raw).digest()

    @property
    def acl(self) -> AclFile:
        return self._acl

    def check(self, cmd: RemotingCommand, remote_ip: str, needed: Mapping[str, int] | None = None) -> None:
        """See ``Rules.check``."""
        self.rules.check(cmd, remote_ip, needed)

    def check_admin(self, cmd: RemotingCommand, remote_ip: str) -> None:
        """See ``Rules.check_admin``."""
        self.rules.check_admin(cmd, remote_ip)

    # --- reload -------------------------------------------------------------------------------------------------

    def reload_if_changed(self) -> bool:
        """Re-read the file if its bytes changed; True when new rules were installed. Never raises for a bad
        file: it logs why and keeps the rules in force."""
        with self._lock:
            try:
                raw = self.path.read_bytes()
            except OSError as e:
                problem = f"{e.strerror or e}"
                if problem != self._unreadable:  # once per cause, not every poll
                    log.error("ACL file %s cannot be read (%s); keeping the rules loaded before", self.path, problem)
                    self._unreadable = problem
                return False
            self._unreadable = None
            digest = hashlib.sha256(raw).digest()
            if digest == self._digest:
                return False
            try:
                acl, raw = read_acl(self.path)
            except AclConfigError as e:
                log.error("ACL file changed but cannot be used, keeping the rules loaded before: %s", e)
                self._digest = digest  # log once per bad version, not on every poll
                return False
            self._install(acl, raw)
            log.info("ACL file %s reloaded: %d accounts, %d global white addresses", self.path, len(acl.accounts),
                     len(acl.global_white_remote_addresses))  # fmt: skip
            return True

    async def reload_if_changed_async(self) -> bool:
        """``reload_if_changed`` for the watcher on the event loop: each poll reads the file through aiofiles and
        compares its digest on the loop; only a changed (or unreadable) file hops to a worker thread, where the
        locked re-read, parse and install run (an admin update may hold the lock for a write and fsync)."""
        try:
            async with aiofiles.open(self.path, "rb") as f:
                raw = await f.read()
        except OSError:
            return await asyncio.to_thread(self.reload_if_changed)  # it logs the cause once
        if self._unreadable is None and hashlib.sha256(raw).digest() == self._digest:
            return False
        return await asyncio.to_thread(self.reload_if_changed)

    # --- updates (the admin codes) ------------------------------------------------------------------------------

    def _write(self, acl: AclFile) -> None:
        """Bump dataVersion, write, install (the caller holds the lock)."""
        old = acl.data_version[0] if acl.data_version else DataVersion()
        acl = acl.model_copy(update={"data_version": [DataVersion(timestamp=int(time.time() * 1000),
                                                                   counter=old.counter + 1)]})  # fmt: skip
        raw = write_acl(self.path, acl)
        self._install(acl, raw)

    def update_account(self, account: Account) -> None:
        """Create or replace the account with ``account.access_key`` (UPDATE_AND_CREATE_ACL_CONFIG)."""
        with self._lock:
            accounts = [a for a in self._acl.accounts if a.access_key != account.access_key]
            replaced = len(accounts) != len(self._acl.accounts)
            accounts.append(account)
            self._write(self._acl.model_copy(update={"accounts": accounts}))
        log.info("ACL account %s %s", account.access_key, "updated" if replaced else "created")

    def delete_account(self, access_key: str) -> bool:
        """Remove an account; False when there is none with that key (DELETE_ACL_CONFIG)."""
        with self._lock:
            accounts = [a for a in self._acl.accounts if a.access_key != access_key]
            if len(accounts) == len(self._acl.accounts):
                return False
            self._write(self._acl.model_copy(update={"accounts": accounts}))
        log.info("ACL account %s deleted", access_key)
        return True

    def update_global_white_addrs(self, patterns: list[str]) -> None:
        """Replace ``globalWhiteRemoteAddresses`` (UPDATE_GLOBAL_WHITE_ADDRS_CONFIG)."""
        with self._lock:
            acl = AclFile.model_validate({**self._acl.to_yaml(), "globalWhiteRemoteAddresses": patterns})
            self._write(acl)
        log.info("ACL global white addresses set to %s", patterns)

    def version(self) -> DataVersion:
        return self._acl.data_version[0] if self._acl.data_version else DataVersion()


def check_key_lengths(access_key: str | None, secret_key: str | None) -> None:
    """RocketMQ's rule for an account created over the wire: both keys longer than 6 characters."""
    if not access_key or len(access_key) < MIN_KEY_LENGTH or not secret_key or len(secret_key) < MIN_KEY_LENGTH:
        raise AclConfigError("The accessKey and secretKey cannot be null and their length should be longer than 6")

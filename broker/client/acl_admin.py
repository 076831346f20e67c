"""The plain ACL admin calls (``DefaultMQAdminExt``'s): create/update and delete accounts, replace the global
white list, read a broker's ACL version and its accounts (secrets masked by the broker).

Each call goes to the brokers given (``-b``) or every master of a cluster (``-c``) and returns the addresses
that took it; a broker's refusal raises MQBrokerError with its code and remark.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from broker.client.admin import Admin
from broker.client.errors import MQClientError
from broker.client.instance import check
from broker.remoting import headers as h
from broker.remoting.codes import RequestCode
from broker.remoting.command import RemotingCommand


@dataclass(frozen=True, slots=True)
class AclAccount:
    """What UPDATE_AND_CREATE_ACL_CONFIG carries; lists are ``name=PERM`` items."""

    access_key: str
    secret_key: str | None = None
    white_remote_address: str | None = None
    admin: bool = False
    default_topic_perm: str | None = None
    default_group_perm: str | None = None
    topic_perms: tuple[str, ...] = ()
    group_perms: tuple[str, ...] = ()

    def __repr__(self) -> str:  # the secret stays out of logs and tracebacks
        return f"AclAccount(access_key={self.access_key!r}, admin={self.admin})"


async def update_account(admin: Admin, addrs: list[str], account: AclAccount) -> list[str]:
    header = h.CreateAccessConfigRequestHeader(
        access_key=account.access_key, secret_key=account.secret_key,
        white_remote_address=account.white_remote_address, admin=account.admin,
        default_topic_perm=account.default_topic_perm, default_group_perm=account.default_group_perm,
        topic_perms=",".join(account.topic_perms) or None, group_perms=",".join(account.group_perms) or None,
    )  # fmt: skip
    for addr in addrs:
        resp = await admin.invoke(addr, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, header))
        check(resp, f"update ACL account {account.access_key}", addr)
    return addrs


async def delete_account(admin: Admin, addrs: list[str], access_key: str) -> list[str]:
    header = h.DeleteAccessConfigRequestHeader(access_key=access_key)
    for addr in addrs:
        resp = await admin.invoke(addr, RemotingCommand.request(RequestCode.DELETE_ACL_CONFIG, header))
        check(resp, f"delete ACL account {access_key}", addr)
    return addrs


async def update_global_white_addrs(admin: Admin, addrs: list[str], patterns: list[str]) -> list[str]:
    header = h.UpdateGlobalWhiteAddrsConfigRequestHeader(global_white_addrs=",".join(patterns))
    for addr in addrs:
        resp = await admin.invoke(addr, RemotingCommand.request(RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, header))
        check(resp, "update the ACL global white addresses", addr)
    return addrs


async def acl_config(admin: Admin, addr: str) -> dict[str, Any]:
    """``{"globalWhiteAddrs": [...], "plainAccessConfigs": [...]}`` of one broker, with its version."""
    resp = await admin.invoke(addr, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG))
    check(resp, "get the ACL config", addr)
    try:
        body = json.loads(resp.body or b"{}")
    except ValueError as e:
        raise MQClientError(f"ACL config from {addr} is not JSON: {e}") from None
    info = await admin.invoke(addr, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_ACL_INFO))
    check(info, "get the ACL version", addr)
    version = info.read_header(h.GetBrokerAclConfigResponseHeader)
    return {"brokerAddr": addr, "brokerName": version.broker_name, "version": json.loads(version.version), **body}

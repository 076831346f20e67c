"""The plain ACL admin codes (``AdminBrokerProcessor``'s): UPDATE_AND_CREATE_ACL_CONFIG (50), DELETE_ACL_CONFIG
(51), GET_BROKER_CLUSTER_ACL_INFO (52), UPDATE_GLOBAL_WHITE_ADDRS_CONFIG (53), GET_BROKER_CLUSTER_ACL_CONFIG (54).

They change ``plain_acl.yml`` (written atomically in a worker thread) and the rules in force at once. Only an
``admin`` account reaches them when ACL is on (broker.acl.access). GET_BROKER_CLUSTER_ACL_CONFIG answers with
every secret masked: secrets stay in the file.
"""

from __future__ import annotations

import asyncio
import json

from pydantic import ValidationError

from broker.acl.addresses import split_list
from broker.acl.manager import PlainAclManager, check_key_lengths
from broker.acl.rules import Account, AclConfigError
from broker.config import BrokerConfig
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Channel, Handler
from broker.remoting.headers import (
    CreateAccessConfigRequestHeader,
    DeleteAccessConfigRequestHeader,
    GetBrokerAclConfigResponseHeader,
    UpdateGlobalWhiteAddrsConfigRequestHeader,
)

MASKED = "******"


def _why(e: Exception) -> str:
    if isinstance(e, ValidationError):
        # name the field and the problem, never the input (it may be a secret)
        return "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())
    return str(e)


class AclAdminProcessor:
    def __init__(self, config: BrokerConfig, acl: PlainAclManager | None) -> None:
        self.config = config
        self.acl = acl

    def routes(self) -> dict[int, Handler]:
        return {
            RequestCode.UPDATE_AND_CREATE_ACL_CONFIG: self.update_account,
            RequestCode.DELETE_ACL_CONFIG: self.delete_account,
            RequestCode.GET_BROKER_CLUSTER_ACL_INFO: self.acl_info,
            RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG: self.update_global_white_addrs,
            RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG: self.acl_config,
        }

    def _disabled(self, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(ResponseCode.SYSTEM_ERROR, "ACL is not enabled on this broker (aclEnable=false)")

    async def update_account(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        if self.acl is None:
            return self._disabled(cmd)
        acl = self.acl
        h = cmd.read_header(CreateAccessConfigRequestHeader)
        secret = h.secret_key
        if not secret:  # RocketMQ keeps the secret of an account updated without one
            old = next((a for a in acl.acl.accounts if a.access_key == h.access_key), None)
            secret = old.secret_key if old is not None else None
        try:
            check_key_lengths(h.access_key, secret)
            account = Account(
                access_key=h.access_key, secret_key=secret or "", white_remote_address=h.white_remote_address,
                admin=h.admin, default_topic_perm=h.default_topic_perm, default_group_perm=h.default_group_perm,
                topic_perms=split_list(h.topic_perms), group_perms=split_list(h.group_perms),
            )  # fmt: skip
            await asyncio.to_thread(acl.update_account, account)
        except (AclConfigError, ValidationError, OSError) as e:
            return cmd.response(ResponseCode.UPDATE_AND_CREATE_ACL_CONFIG_FAILED, _why(e))
        return cmd.response(ResponseCode.SUCCESS)

    async def delete_account(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        if self.acl is None:
            return self._disabled(cmd)
        h = cmd.read_header(DeleteAccessConfigRequestHeader)
        try:
            deleted = await asyncio.to_thread(self.acl.delete_account, h.access_key)
        except OSError as e:
            return cmd.response(ResponseCode.DELETE_ACL_CONFIG_FAILED, str(e))
        if not deleted:
            return cmd.response(ResponseCode.DELETE_ACL_CONFIG_FAILED,
                                f"The accesskey[{h.access_key:.64}] corresponding to accessConfig has been deleted "
                                "failed.")  # fmt: skip
        return cmd.response(ResponseCode.SUCCESS)

    async def update_global_white_addrs(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        if self.acl is None:
            return self._disabled(cmd)
        h = cmd.read_header(UpdateGlobalWhiteAddrsConfigRequestHeader)
        if h.acl_file_full_path and h.acl_file_full_path != str(self.acl.path):
            return cmd.response(ResponseCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED,
                                "mqlake keeps one ACL file: aclFileFullPath must be empty or "
                                f"{self.acl.path}")  # fmt: skip
        try:
            await asyncio.to_thread(self.acl.update_global_white_addrs, split_list(h.global_white_addrs))
        except (ValidationError, OSError) as e:
            return cmd.response(ResponseCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED, _why(e))
        return cmd.response(ResponseCode.SUCCESS)

    def acl_info(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        if self.acl is None:
            return self._disabled(cmd)
        v = self.acl.version()
        version = json.dumps({"counter": v.counter, "timestamp": v.timestamp}, separators=(",", ":"))
        c = self.config
        header = GetBrokerAclConfigResponseHeader(
            version=version, all_acl_file_version=json.dumps({str(self.acl.path): json.loads(version)}),
            broker_name=c.broker_name, broker_addr=c.broker_addr, cluster_name=c.broker_cluster_name,
        )  # fmt: skip
        return cmd.response(ResponseCode.SUCCESS, None, header)

    def acl_config(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        if self.acl is None:
            return self._disabled(cmd)
        acl = self.acl.acl
        accounts = [{**a.to_yaml(), "secretKey": MASKED} for a in acl.accounts]
        body = {"globalWhiteAddrs": list(acl.global_white_remote_addresses), "plainAccessConfigs": accounts}
        return cmd.response(ResponseCode.SUCCESS, None, body=json.dumps(body, ensure_ascii=False).encode())

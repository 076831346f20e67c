"""GET_ALL_DELAY_OFFSET (45): the delay levels' delivery cursors, as Java's ``ScheduleMessageService.encode``."""

from __future__ import annotations

from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Channel, Handler
from broker.remoting.protocol import fastjson
from broker.server.context import BrokerContext


class ScheduleProcessor:
    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker

    def routes(self) -> dict[int, Handler]:
        return {RequestCode.GET_ALL_DELAY_OFFSET: self.get_all_delay_offset}

    def get_all_delay_offset(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        """Body ``{"offsetTable":{1:12,2:0}}``: fastjson writes the Integer level keys bare."""
        table = self.broker.store.schedule.offset_table()
        return cmd.response(ResponseCode.SUCCESS, body=fastjson.dumps_legacy({"offsetTable": table}))

"""The NameServer: broker registration and liveness, topic routes for clients (reference §7.5).

``NamesrvController(host, port)`` with ``await start()`` / ``await stop()`` and ``.port``; run it alone with
``mqlake namesrv``.
"""

from broker.namesrv.controller import NamesrvController

__all__ = ["NamesrvController"]

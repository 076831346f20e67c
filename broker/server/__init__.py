"""The broker: ``BrokerController`` (controller.py) over the native store, with one module per concern:
topics.py, offsets.py (committed offsets) and groups.py (subscription groups), each a ``ConfigManager``
(config_manager.py) over its file; clients.py (producers and consumers by channel), long_polling.py,
queue_locks.py, stats.py, registration.py (NameServers); and the request processors send.py, pull.py,
queue_offsets.py, client_manage.py, admin.py, query.py. Each processor is built on a ``BrokerContext``
(context.py), not on the controller, and names its own request codes (``routes``)."""

"""The broker: ``BrokerController`` (controller.py) over the native store, with one module per concern:
topics.py, offsets.py (committed offsets), groups.py (subscription groups), clients.py (producers and
consumers by channel), long_polling.py, queue_locks.py, registration.py (NameServers), and the request
processors send.py, pull.py, queue_offsets.py, client_manage.py, admin.py, query.py."""

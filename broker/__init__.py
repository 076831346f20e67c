"""mqlake's network half: RocketMQ remoting, NameServer, Broker and the ``mqlake`` CLI."""

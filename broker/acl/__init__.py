"""RocketMQ's plain ACL on the broker: ``plain_acl.yml`` (rules), address patterns, the per-request check
(access) and the watched file with its admin updates (manager)."""

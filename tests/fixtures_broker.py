"""Broker fixtures: a real NameServer + Broker on loopback ports (owned by the broker work)."""

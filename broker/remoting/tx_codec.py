"""The END_TRANSACTION header read in one call (a half message's SEND_MESSAGE_V2 header is read with every other
send's, ``send_codec.read_send_v2``).

This is the reference; ``broker/remoting/_tx.pyx`` is the compiled twin (chosen by :mod:`store.format.native`).
It answers None for anything but the common request, and the processor then takes the generic header parser,
which gives every unusual request the answer it always had.
"""

from __future__ import annotations

from collections.abc import Mapping

from store.format import native

# (producerGroup, tranStateTableOffset, commitLogOffset, commitOrRollback, fromTransactionCheck, msgId)
EndFields = tuple[str, int, int, int, bool, str]


def read_end_transaction(ext: Mapping[str, str]) -> EndFields | None:
    """The fields of an ``EndTransactionRequestHeader`` the broker acts on, or None when one is missing or does
    not parse (the generic parser then raises the HeaderError a client sees). ``fromTransactionCheck`` is read
    as Java's ``Boolean.parseBoolean``."""
    try:
        check = ext.get("fromTransactionCheck")
        return (ext["producerGroup"], int(ext["tranStateTableOffset"]), int(ext["commitLogOffset"]),
                int(ext["commitOrRollback"]), check is not None and check.lower() == "true", ext["msgId"])  # fmt: skip
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


native.install(globals(), "broker.remoting._tx", ("read_end_transaction",))

# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled twin of :mod:`broker.remoting.tx_codec` (the reference).  ``read_end_transaction`` reads an
END_TRANSACTION header of plain decimal integers; anything else is handed to the reference."""

from broker.remoting._fields cimport _int

from store.format import native

_reference = native.TWINS["broker.remoting.tx_codec"].python


def read_end_transaction(ext):
    """Mirrors ``tx_codec.read_end_transaction``."""
    if type(ext) is not dict:
        return _reference["read_end_transaction"](ext)
    get = ext.get
    group, msg_id, check = get("producerGroup"), get("msgId"), get("fromTransactionCheck")
    queue_offset, clog_offset, kind = _int(get("tranStateTableOffset")), _int(get("commitLogOffset")), \
        _int(get("commitOrRollback"))
    if (
        type(group) is not str or type(msg_id) is not str or queue_offset is None or clog_offset is None
        or kind is None or not (check is None or type(check) is str)
    ):
        return _reference["read_end_transaction"](ext)
    return group, queue_offset, clog_offset, kind, check is not None and check.lower() == "true", msg_id

"""The one codec package: every byte offset of RocketMQ's store files lives here, split by what it holds.

- :mod:`store.format.records` — CommitLog records: layout constants, :class:`~store.format.records.MessageRecord`,
  encode / patch / BLANK, the one walk from record to record (``RecordWalk``), the per-record decoders
  (``decode_record``, ``check_record`` → ``DispatchRequest``), single-field readers, split boundaries, and
  ``retarget_record`` (a stored record re-addressed to another topic and queue: a delayed message's delivery).
- :mod:`store.format.properties` — the properties string and the property names.
- :mod:`store.format.msgid` — hosts as stored, offset message ids, the client's UNIQ_KEY generator.
- :mod:`store.format.hashing` — Java ``String.hashCode``, tagsCode, IndexFile key hashes, the 31-bit body CRC.
- :mod:`store.format.units` — ConsumeQueue units, IndexFile header/slots/entries, the checkpoint and file
  names; their numpy dtypes for the pipelines.
- :mod:`store.format.delay` — delay levels, the tagsCode of a SCHEDULE_TOPIC_XXXX unit, the timer topic's name.
- :mod:`store.format.batch_body` — the SEND_BATCH_MESSAGE body (``MessageDecoder.encodeMessages``).
- :mod:`store.format.runs` — a send's records encoded into one run, copied into a segment and back-filled in
  one piece, their offset message ids (the broker's send path).
- :mod:`store.format.appender` — a wire send's record, from its header's fields straight into a segment.
- :mod:`store.format.native` — the choice between a module's compiled twin (``_records.pyx``, ``_hashing.pyx``,
  ``_properties.pyx``, ``_units.pyx``, ``_runs.pyx``, ``_appender.pyx``; also ``broker/remoting/_command.pyx`` and
  ``_send.pyx``, ``store/_commitlog.pyx``) and its Python reference.

Layouts follow Apache RocketMQ 4.9.8 / 5.x (``MessageDecoder``, ``CommitLog.doAppend``, ``ConsumeQueue``,
``IndexFile``, ``StoreCheckpoint``); every integer is big-endian.  Pure functions over bytes (the encoders
``CommitLog.put`` calls write into the segment it hands them; locks, the queue table and files are the store's):
the broker, the pipelines and the tests all encode and decode through these modules, imported one by one
(``from store.format import records``); nothing is re-exported here.
"""

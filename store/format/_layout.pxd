# The CommitLog record's constants (store/format/records.py holds them for the Python twins), cimported by every
# compiled twin that reads or writes records, so each is written once.
cdef enum:
    MAGIC_V1 = -626843481  # MESSAGE_MAGIC_CODE (v1)
    MAGIC_V2 = -626843477  # MESSAGE_MAGIC_CODE_V2: topic length in 2 bytes
    MIN_RECORD = 48  # no record is shorter
    BORN_V6 = 0x10  # sysFlag: born host is IPv6
    STORE_V6 = 0x20  # sysFlag: store host is IPv6
    TRANSACTION_BITS = 0xC  # sysFlag: prepared, commit or rollback
    COMMIT_TYPE = 0x8  # sysFlag: TRANSACTION_COMMIT_TYPE

"""The SEND_BATCH_MESSAGE body codec lives in :mod:`store.format.batch_body` (store/format holds every byte
layout, and the compiled batch path encodes records straight from it); the remoting layer's name for it."""

from store.format.batch_body import BatchBodyError, BatchItem, decode_batch_body, encode_batch_body

__all__ = ["BatchBodyError", "BatchItem", "decode_batch_body", "encode_batch_body"]

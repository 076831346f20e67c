"""The buffers the codecs read and write: bytes and slices of them, and the store's memory-mapped files."""

from __future__ import annotations

import mmap

# What a decoder reads: a frame or a record in bytes, a memoryview slice of one, a mapped segment.
ReadBuffer = bytes | bytearray | memoryview | mmap.mmap
# What an encoder writes in place: a record being built, or a mapped segment.
WriteBuffer = bytearray | memoryview | mmap.mmap

"""Hostile record entries and the cause each must be refused with: held against the Python codec
(tests/log/test_log_codec.py) and the JVM reader's decoder (tests/spark/test_jvm_decoder.py)."""
from __future__ import annotations

import struct

from pybk.log import codec

GOOD = codec.encode([(b"payload", b"key", 1), (b"p2", None, 2)], 0)
UNIFORM = codec.encode([(b"payload", None, 5), (b"p2", None, 5)], 0)

HOSTILE = [
    (b"", "shorter than a record entry header"),
    (GOOD[:39], "shorter than a record entry header"),
    (b"XX" + GOOD[2:], "does not start with a record entry header"),
    (GOOD[:4] + struct.pack(">I", 0) + GOOD[8:], "holds no records"),
    (GOOD[:4] + struct.pack(">I", 2**32 - 1) + GOOD[8:], "claims 4294967295 records"),
    (GOOD[:-1], "claim 12 bytes of keys and payloads but 11 follow"),
    (GOOD + b"!", "claim 12 bytes of keys and payloads but 13 follow"),
    (GOOD[:48] + struct.pack(">i", -5) + GOOD[52:], "negative key length"),
    (GOOD[:52] + struct.pack(">I", 2**32 - 1) + GOOD[56:], "claim 4294967300 bytes"),
]

HOSTILE_UNIFORM = [
    (UNIFORM[:4] + struct.pack(">I", 10**6) + UNIFORM[8:], "claims 1000000 records"),
    (UNIFORM[:-1], "claim 9 bytes of keys and payloads but 8 follow"),
    (UNIFORM[:40] + struct.pack(">I", 2**32 - 1) + UNIFORM[44:], "claim 4294967297 bytes"),
    (UNIFORM[:2] + bytes([3]) + UNIFORM[3:], "does not start with a record entry header"),
]

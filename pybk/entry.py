"""The entry wire format shared by clients and bookies, and the keys derived from a password.

An entry body, on the wire and on disk:

    ledger_id u64 | entry_id u64 | lac i64 | length u64 | digest | payload

`length` is the ledger's length in bytes up to and including this entry's payload (BookKeeper's
running length), so recovery learns a crashed writer's ledger length from its last entry. The
payload is what follows the digest. The digest covers the 32-byte header and the payload:
CRC32C (4 bytes) or HMAC-SHA256 keyed by the ledger password (32 bytes). Bookies read only
the header (to learn the writer's LAC); readers verify the digest, and a mismatch marks
a corrupt replica.
"""
from __future__ import annotations

import enum
import hashlib
import hmac
import struct
from typing import NamedTuple, Sequence

import google_crc32c
import numpy as np

HEADER = struct.Struct(">QQqQ")
HEADER_SIZE = HEADER.size  # 32
_CRC = struct.Struct(">I")
FEW_BODIES = 4   # verify_packed checks up to this many bodies one by one


class DigestType(enum.Enum):
    """How an entry's integrity is checked: CRC32C detects corruption, MAC also tampering."""

    CRC32C = "CRC32C"
    MAC = "MAC"

    @property
    def size(self) -> int:
        return 4 if self is DigestType.CRC32C else 32


# an entry's header (and CRC32C digest) as a numpy record, to check many packed entries at once
_HEAD_FIELDS = [("ledger_id", ">u8"), ("entry_id", ">u8"), ("lac", ">i8"), ("length", ">u8")]
_HEAD_DTYPE = {DigestType.CRC32C: np.dtype(_HEAD_FIELDS + [("crc", ">u4")]), DigestType.MAC: np.dtype(_HEAD_FIELDS)}
_HEAD_POS = {d: np.arange(t.itemsize) for d, t in _HEAD_DTYPE.items()}


class DigestMismatch(ValueError):
    """An entry body failed its digest check or is malformed."""


class Header(NamedTuple):
    ledger_id: int
    entry_id: int
    lac: int
    length: int


def master_key(password: bytes) -> bytes:
    """The key bookies check on adds and fences: a hash of the password, never the password."""
    return hashlib.sha256(b"pybk-ledger-master-key:" + password).digest()


def password_hash(password: bytes) -> bytes:
    """What ledger metadata stores to check a password on open; differs from the master key,
    so that reading metadata does not grant the right to write to bookies."""
    return hashlib.sha256(b"pybk-ledger-password-check:" + password).digest()


def key_check(master_key: bytes) -> bytes:
    """What ledger metadata stores to verify a master key: a one-way hash of it, so that bookies
    can check the first key they see for a ledger against the metadata, and reading metadata
    still grants no write (docs/security.md)."""
    return hashlib.sha256(b"pybk-ledger-key-check:" + master_key).digest()


def _digest(digest_type: DigestType, password: bytes, header: bytes, payload: bytes) -> bytes:
    if digest_type is DigestType.CRC32C:
        c = google_crc32c.value(header)
        return _CRC.pack(google_crc32c.extend(c, payload))
    mac = hmac.new(password, header, hashlib.sha256)
    mac.update(payload)
    return mac.digest()


def encode(ledger_id: int, entry_id: int, lac: int, payload: bytes,
           digest_type: DigestType = DigestType.CRC32C, password: bytes = b"", length: int | None = None) -> bytes:
    """Build an entry body; the writer's current LAC rides along for recovery and readers.
    `length` is the ledger's length through this entry (default: the payload's size, right for
    entry 0 and for callers that do not track it)."""
    header = HEADER.pack(ledger_id, entry_id, lac, len(payload) if length is None else length)
    if digest_type is DigestType.CRC32C:  # every add runs this: _digest inlined saves a third of it
        return b"".join((header, _CRC.pack(google_crc32c.extend(google_crc32c.value(header), payload)), payload))
    return b"".join((header, _digest(digest_type, password, header, payload), payload))


def parse_header(body: bytes) -> Header:
    """Read the header only (what a bookie needs); raises DigestMismatch if too short."""
    if len(body) < HEADER_SIZE:
        raise DigestMismatch(f"entry body of {len(body)} bytes is shorter than its {HEADER_SIZE}-byte header")
    return Header._make(HEADER.unpack_from(body))


def decode(body: bytes | memoryview, digest_type: DigestType = DigestType.CRC32C, password: bytes = b"",
           ledger_id: int | None = None, entry_id: int | None = None,
           verify_digest: bool = True) -> tuple[Header, bytes]:
    """Verify an entry body (bytes, or a view of an answer: copied once) and return (header, payload).

    Raises DigestMismatch when the digest or the expected ledger/entry id does not match, or the
    running length is smaller than the payload: the replica that served it is corrupt.

    verify_digest=False checks the structure only (sizes, ledger/entry id), not the digest:
    for a copier that lacks the password of a MAC ledger (autorecovery acting with its admin
    credential). It moves bodies verbatim, so readers still verify the MAC later.
    """
    if type(body) is not bytes:
        body = bytes(body)
    h = parse_header(body)
    crc = digest_type is DigestType.CRC32C
    payload_start = HEADER_SIZE + (4 if crc else 32)
    if len(body) < payload_start or h.length < len(body) - payload_start:
        raise DigestMismatch(f"entry {h.ledger_id}:{h.entry_id}: body is {len(body)} bytes, but the header "
                             f"and digest take {payload_start} and the ledger length says {h.length}")
    if ledger_id is not None and h.ledger_id != ledger_id or entry_id is not None and h.entry_id != entry_id:
        raise DigestMismatch(f"asked for entry {ledger_id}:{entry_id}, got {h.ledger_id}:{h.entry_id}")
    payload = body[payload_start:]
    if not verify_digest:
        return h, payload
    if crc:  # every reader runs this per entry: compare integers, no digest bytes built
        ok = google_crc32c.extend(google_crc32c.value(body[:HEADER_SIZE]), payload) == \
            _CRC.unpack_from(body, HEADER_SIZE)[0]
    else:
        ok = hmac.compare_digest(_digest(digest_type, password, body[:HEADER_SIZE], payload),
                                 body[HEADER_SIZE:payload_start])
    if not ok:
        raise DigestMismatch(f"entry {h.ledger_id}:{h.entry_id}: {digest_type.value} digest mismatch")
    return h, payload


def verify_packed(bodies: bytes, sizes: Sequence[int], first_entry: int, step: int, ledger_id: int,
                  digest_type: DigestType = DigestType.CRC32C, password: bytes = b""
                  ) -> tuple[list[bytes], DigestMismatch | None]:
    """Verify entry bodies packed back to back (entries first_entry, first_entry + step, ...) as
    decode() does each, in one call: (payloads, None) when all are intact, else (the payloads
    before the first body that is not, its DigestMismatch). A few bodies (a tailing reader's) are
    checked each by decode(): numpy's fixed cost is above their worth; more, by packed_spans."""
    total = len(bodies)
    if len(sizes) > FEW_BODIES:
        starts, ends, bad = packed_spans(bodies, sizes, first_entry, step, ledger_id, digest_type, password)
        return [bodies[s:e] for s, e in zip(starts.tolist(), ends.tolist())], bad
    out, pos = [], 0
    for i, sz in enumerate(sizes):
        sz, eid = int(sz), first_entry + i * step
        if pos + sz > total:
            return out, DigestMismatch(f"entry {ledger_id}:{eid}: the answer holds {total - pos} of its {sz} bytes")
        try:
            out.append(decode(bodies[pos:pos + sz], digest_type, password, ledger_id, eid)[1])
        except DigestMismatch as e:
            return out, e
        pos += sz
    return out, None


def packed_spans(bodies: bytes, sizes: Sequence[int], first_entry: int, step: int, ledger_id: int,
                 digest_type: DigestType = DigestType.CRC32C, password: bytes = b""
                 ) -> tuple[np.ndarray, np.ndarray, DigestMismatch | None]:
    """Verify entry bodies packed back to back as verify_packed does, in place: (starts, ends,
    None) where payload i is bodies[starts[i]:ends[i]] when all are intact, else the spans of
    the payloads before the first body that is not, and its DigestMismatch. No payload is
    copied: a reader gathers them once, where it builds its own buffers.

    The sizes, ids and running lengths of all bodies are checked at once with numpy (their
    headers gathered into one array); only the digest is computed entry by entry, over views of
    the bodies."""
    crc = digest_type is DigestType.CRC32C
    payload_start = HEADER_SIZE + digest_type.size
    total = len(bodies)
    n = len(sizes)
    size = np.asarray(sizes, np.int64)
    end = np.cumsum(size)
    start = end - size
    bad = np.flatnonzero((size < payload_start) | (end > total))
    k = int(bad[0]) if len(bad) else n          # the bodies before k lie within the buffer
    view = np.frombuffer(bodies, np.uint8)
    heads = view[start[:k, None] + _HEAD_POS[digest_type]].view(_HEAD_DTYPE[digest_type])[:, 0]
    want = np.arange(first_entry, first_entry + k * step, step, dtype=np.uint64) if k else np.zeros(0, np.uint64)
    wrong = np.flatnonzero((heads["ledger_id"] != np.uint64(ledger_id)) | (heads["entry_id"] != want)
                           | (heads["length"] < (size[:k] - payload_start).astype(np.uint64)))
    m = int(wrong[0]) if len(wrong) else k      # the bodies before m are well formed
    i = 0
    if crc:  # google_crc32c takes bytes or a read-only numpy view (not a memoryview): views, no copies
        value, extend = google_crc32c.value, google_crc32c.extend
        for s, e, c in zip(start[:m].tolist(), end[:m].tolist(), heads["crc"][:m].tolist()):
            if extend(value(view[s:s + HEADER_SIZE]), view[s + payload_start:e]) != c:
                break
            i += 1
    else:
        mv = memoryview(bodies)
        for s, e in zip(start[:m].tolist(), end[:m].tolist()):
            if not hmac.compare_digest(_digest(digest_type, password, mv[s:s + HEADER_SIZE], mv[s + payload_start:e]),
                                       mv[s + HEADER_SIZE:s + payload_start]):
                break
            i += 1
    spans = start[:i] + payload_start, end[:i]
    if i == n:
        return *spans, None
    eid = first_entry + i * step
    if i < m:
        return *spans, DigestMismatch(f"entry {ledger_id}:{eid}: {digest_type.value} digest mismatch")
    if i < k:
        h = heads[i]
        if h["ledger_id"] != ledger_id or h["entry_id"] != eid:
            return *spans, DigestMismatch(f"asked for entry {ledger_id}:{eid}, got {h['ledger_id']}:{h['entry_id']}")
        return *spans, DigestMismatch(f"entry {ledger_id}:{eid}: body is {size[i]} bytes, but the header and "
                                      f"digest take {payload_start} and the ledger length says {h['length']}")
    if size[i] < payload_start:
        return *spans, DigestMismatch(f"entry {ledger_id}:{eid}: body is {size[i]} bytes, but the header and digest "
                                      f"take {payload_start}")
    return *spans, DigestMismatch(f"entry {ledger_id}:{eid}: the answer holds {total - start[i]} of its {size[i]} "
                                  "bytes")

"""The JVM reader's decoding of entries (digest, then records) held to the Python client's: the
same records from the same bodies, CRC32C and MAC, full and uniform entries, cut at offsets; and
the same refusals, with the same causes, for corrupt bodies and hostile record entries. Runs the
jar's DecodeTool in a JVM (no Spark session, no cluster)."""
from __future__ import annotations

import random
import struct
import subprocess

import pytest
from codec_cases import HOSTILE, HOSTILE_UNIFORM

from pybk import entry
from pybk.entry import DigestType
from pybk.log import codec
from pybk.spark.jvm import SHORT_RUN, java_command

LEDGER = 42
PASSWORD = b"mac secret"


def decode_in_jvm(jar, bodies: list[tuple[int, bytes]], digest: DigestType, password: bytes = b"",
                  seg_first: int = 0, lo: int = 0, hi: int = 2**62) -> list[tuple | str]:
    """What DecodeTool says of each body: records (offset, timestamp in us, key, payload, producer,
    sequence) and "error ..." lines."""
    stdin = b"".join(struct.pack(">QI", eid, len(b)) + b for eid, b in bodies)
    out = subprocess.run([*java_command(jar, "DecodeTool", SHORT_RUN + ("-Xmx64m",)),
                          str(LEDGER), digest.value, password.hex(), str(seg_first), str(lo), str(hi)],
                         input=stdin, capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    lines = out.stdout.decode().splitlines()
    assert lines[-1] == "end"
    got = []
    for line in lines[:-1]:
        kind, _, rest = line.partition(" ")
        if kind == "error":
            got.append(f"error {rest}")
            continue
        off, ts, k, p, prod, seq = rest.split(" ")
        got.append((int(off), int(ts), None if k == "-" else bytes.fromhex(k), bytes.fromhex(p),
                    None if prod == "-" else int(prod), None if seq == "-" else int(seq)))
    return got


def decode_in_python(bodies: list[tuple[int, bytes]], digest: DigestType, password: bytes = b"",
                     seg_first: int = 0, lo: int = 0, hi: int = 2**62) -> list[tuple]:
    out = []
    for eid, body in bodies:
        _, payload = entry.decode(body, digest, password, LEDGER, eid)
        batch = codec.decode(payload)
        h = batch.header
        for i, r in enumerate(batch.records(seg_first + h.first_index)):
            if lo <= r.offset < hi:
                seq = None if h.first_sequence == codec.NO_SEQUENCE else h.first_sequence + i
                out.append((r.offset, r.timestamp * 1000, r.key, bytes(r.payload), h.producer_id or None, seq))
    return out


def log_entries(digest: DigestType, password: bytes, seed: int) -> list[tuple[int, bytes]]:
    """Ledger bodies of record entries: full ones (keys, own timestamps, a producer) and uniform
    ones (append_many's), of random sizes, some records empty."""
    rnd = random.Random(seed)
    bodies, index = [], 0
    for eid in range(40):
        b = codec.BatchBuilder()
        n = rnd.randint(1, 300)
        if eid % 3 == 0:
            b.add_many([rnd.randbytes(rnd.choice((0, 1, 100, 700))) for _ in range(n)], 1_700_000_000_000 + eid)
        else:
            for i in range(n):
                b.add(rnd.randbytes(rnd.randint(0, 200)), None if i % 4 == 0 else rnd.randbytes(rnd.randint(0, 9)),
                      1_700_000_000_000 + eid * 10 + i % 7)
        payload = b.build(index, producer_id=77 if eid % 5 == 1 else 0,
                          first_sequence=index if eid % 5 == 1 else codec.NO_SEQUENCE)
        index += n
        bodies.append((eid, entry.encode(LEDGER, eid, eid - 1, payload, digest, password)))
    return bodies


@pytest.mark.parametrize("digest, password", [(DigestType.CRC32C, b""), (DigestType.MAC, PASSWORD),
                                              (DigestType.MAC, b"")], ids=["crc32c", "mac", "mac-empty-password"])
def test_the_jvm_decodes_every_record_as_the_python_client_does(jar, digest, password):
    bodies = log_entries(digest, password, seed=7)
    want = decode_in_python(bodies, digest, password, seg_first=1000)
    assert len(want) > 3000
    assert decode_in_jvm(jar, bodies, digest, password, seg_first=1000) == want
    lo, hi = want[100][0], want[-100][0]   # a partition's edges fall inside entries
    assert decode_in_jvm(jar, bodies, digest, password, 1000, lo, hi) == \
        decode_in_python(bodies, digest, password, 1000, lo, hi)


def test_corrupt_bodies_are_refused_naming_the_cause(jar):
    good = log_entries(DigestType.CRC32C, b"", seed=1)[:1]
    eid, body = good[0]
    flipped = bytearray(body)
    flipped[-1] ^= 0x01
    cases = [
        ((eid, bytes(flipped)), "CRC32C digest mismatch"),
        ((eid + 1, body), f"asked for entry {LEDGER}:{eid + 1}, got {LEDGER}:{eid}"),
        ((eid, body[:30]), "shorter than its header and digest"),
        ((eid, body[:24] + struct.pack(">Q", 1) + body[32:]), "the ledger length says 1"),
    ]
    got = decode_in_jvm(jar, [b for b, _ in cases], DigestType.CRC32C)
    assert len(got) == len(cases)
    for line, (_, cause) in zip(got, cases):
        assert isinstance(line, str) and cause in line, (line, cause)
    mac = log_entries(DigestType.MAC, PASSWORD, seed=2)[:1]
    assert decode_in_jvm(jar, mac, DigestType.MAC, b"another password") == [
        f"error entry {LEDGER}:0: MAC digest mismatch"]


def test_hostile_record_entries_are_refused_with_the_python_codecs_cause(jar):
    """The bodies' digests hold (a writer could have written them): the records are refused, each
    entry with the cause the Python codec gives (one JVM for all of them)."""
    cases = HOSTILE + HOSTILE_UNIFORM
    got = decode_in_jvm(jar, [(3, entry.encode(LEDGER, 3, 2, payload)) for payload, _ in cases], DigestType.CRC32C)
    assert len(got) == len(cases)
    for line, (_, cause) in zip(got, cases):
        assert isinstance(line, str) and cause in line, (line, cause)

"""Entry bodies carry a digest that detects any change to header or payload."""
import pytest

from pybk import entry
from pybk.entry import DigestType


@pytest.mark.parametrize("dt", list(DigestType))
def test_entry_round_trips(dt):
    body = entry.encode(7, 3, 2, b"hello", dt, b"pw")
    header, payload = entry.decode(body, dt, b"pw", ledger_id=7, entry_id=3)
    assert (header.ledger_id, header.entry_id, header.lac, payload) == (7, 3, 2, b"hello")


@pytest.mark.parametrize("dt", list(DigestType))
def test_flipped_byte_is_detected(dt):
    body = bytearray(entry.encode(7, 3, 2, b"hello world", dt, b"pw"))
    for i in range(len(body)):
        bad = bytearray(body)
        bad[i] ^= 0x01
        with pytest.raises(entry.DigestMismatch):
            entry.decode(bytes(bad), dt, b"pw", ledger_id=7, entry_id=3)


def test_mac_needs_the_password():
    body = entry.encode(1, 0, -1, b"x", DigestType.MAC, b"right")
    with pytest.raises(entry.DigestMismatch):
        entry.decode(body, DigestType.MAC, b"wrong")


def test_master_key_is_not_the_stored_password_hash():
    assert entry.master_key(b"pw") != entry.password_hash(b"pw")
    assert b"pw" not in entry.master_key(b"pw")


def test_structural_check_without_the_password_still_catches_wrong_ids_and_sizes():
    body = entry.encode(1, 5, 4, b"payload", DigestType.MAC, b"secret", length=100)
    header, payload = entry.decode(body, DigestType.MAC, ledger_id=1, entry_id=5, verify_digest=False)
    assert (header.entry_id, header.length, payload) == (5, 100, b"payload")
    first = entry.encode(1, 0, -1, b"payload", DigestType.MAC, b"secret")
    too_short = body[:entry.HEADER_SIZE + 31]
    for bad, kwargs in ((body, dict(entry_id=6)), (body, dict(ledger_id=2)), (too_short, {}), (first + b"x", {})):
        with pytest.raises(entry.DigestMismatch):
            entry.decode(bad, DigestType.MAC, verify_digest=False, **kwargs)


def test_header_carries_the_running_ledger_length():
    body = entry.encode(9, 3, 2, b"abc", length=1003)
    assert entry.parse_header(body) == entry.Header(9, 3, 2, 1003)
    assert entry.parse_header(entry.encode(9, 0, -1, b"abc")).length == 3  # default: the payload alone


def _packed(dt: DigestType, n: int, step: int = 1) -> tuple[bytes, list[int], list[bytes]]:
    payloads = [b"p%d" % i * (i % 5 + 1) for i in range(n)]
    bodies = [entry.encode(7, 10 + i * step, 9, p, dt, b"pw") for i, p in enumerate(payloads)]
    return b"".join(bodies), [len(b) for b in bodies], payloads


@pytest.mark.parametrize("dt", list(DigestType))
@pytest.mark.parametrize("n", [3, 9])
def test_packed_bodies_verify_in_place_to_the_payloads_decode_returns(dt, n):
    bodies, sizes, payloads = _packed(dt, n, step=3)
    starts, ends, bad = entry.packed_spans(memoryview(bodies), sizes, 10, 3, 7, dt, b"pw")
    assert bad is None and [bodies[s:e] for s, e in zip(starts, ends)] == payloads
    assert entry.verify_packed(bodies, sizes, 10, 3, 7, dt, b"pw") == (payloads, None)


@pytest.mark.parametrize("dt", list(DigestType))
@pytest.mark.parametrize("n", [3, 9])
def test_a_corrupt_packed_body_ends_the_verified_ones_before_it(dt, n):
    bodies, sizes, payloads = _packed(dt, n)
    k = n - 2
    bad = bytearray(bodies)
    bad[sum(sizes[:k]) + sum(sizes[k:k + 1]) - 1] ^= 0x01    # the last payload byte of body k
    starts, ends, err = entry.packed_spans(bytes(bad), sizes, 10, 1, 7, dt, b"pw")
    assert [bodies[s:e] for s, e in zip(starts, ends)] == payloads[:k]
    assert isinstance(err, entry.DigestMismatch) and f"entry 7:{10 + k}" in str(err)
    got, err = entry.verify_packed(bytes(bad), sizes, 10, 1, 7, dt, b"pw")
    assert got == payloads[:k] and f"entry 7:{10 + k}" in str(err)
    starts, ends, err = entry.packed_spans(bodies[:-1], sizes, 10, 1, 7, dt, b"pw")
    assert len(starts) == n - 1 and "the answer holds" in str(err)
    starts, ends, err = entry.packed_spans(bodies, sizes, 11, 1, 7, dt, b"pw")
    assert len(starts) == 0 and "asked for entry 7:11, got 7:10" in str(err)

"""The record entry codec: what goes in comes out, and hostile bytes give a clear, bounded error."""
from __future__ import annotations

import pytest
from codec_cases import HOSTILE, HOSTILE_UNIFORM, UNIFORM

from pybk.log import codec
from pybk.log.errors import CorruptEntryError


def test_records_come_back_with_offsets_keys_timestamps_and_payloads():
    recs = [(b"a" * i, (b"k%d" % i) if i % 2 else None, 1000 + i) for i in range(50)]
    body = codec.encode(recs, first_index=7, producer_id=9, first_sequence=100)
    batch = codec.decode(body)
    assert batch.header == codec.EntryHeader(50, 7, 1049, 9, 100)
    out = list(batch.records(first_offset=1000))
    assert [(r.payload, r.key, r.timestamp) for r in out] == recs
    assert [r.offset for r in out] == list(range(1000, 1050))
    assert [r.offset for r in batch.records(1000, start=48)] == [1048, 1049]


def test_empty_payloads_and_empty_keys_are_kept_apart_from_no_key():
    body = codec.encode([(b"", b"", 1), (b"", None, 2), (b"x", b"", 3)], 0)
    assert [(r.key, r.payload) for r in codec.decode(body).records(0)] == [(b"", b""), (None, b""), (b"", b"x")]


def test_add_many_packs_like_one_at_a_time():
    b = codec.BatchBuilder()
    b.add_many([b"x", b"yy", b""], 5)
    assert b.build(0) == codec.encode([(b"x", None, 5), (b"yy", None, 5), (b"", None, 5)], 0)
    assert b.size == len(b.build(0))


def test_keyless_records_of_one_timestamp_make_a_uniform_entry_with_a_length_per_record():
    """Version 2: four bytes of header per record instead of sixteen; a key or another timestamp
    turns the entry back to full headers, and `size` is the built entry's size all along."""
    b = codec.BatchBuilder()
    b.add_many([b"x" * 100] * 10, 7)
    b.add(b"y", None, 7)
    body = b.build(3)
    assert b.size == len(body) == codec.ENTRY_HEADER_SIZE + 11 * codec.LENGTH_SIZE + 1001
    batch = codec.decode(body)
    assert batch.header == codec.EntryHeader(11, 3, 7, 0, codec.NO_SEQUENCE, uniform=True)
    assert [(r.offset, r.timestamp, r.key, r.payload) for r in batch.records(100)] == \
        [(100 + i, 7, None, b"x" * 100) for i in range(10)] + [(110, 7, None, b"y")]
    for mixed, key_bytes in ((lambda m: m.add(b"z", b"key", 7), 3), (lambda m: m.add(b"z", None, 8), 0),
                             (lambda m: m.add_many([b"z"], 8), 0)):
        m = codec.BatchBuilder()
        m.add_many([b"x" * 100] * 10, 7)
        mixed(m)
        body = m.build(0)
        assert m.size == len(body) == codec.ENTRY_HEADER_SIZE + 11 * codec.RECORD_HEADER_SIZE + 1001 + key_bytes
        assert not codec.read_header(body).uniform
        assert [r.payload for r in codec.decode(body).records(0)] == [b"x" * 100] * 10 + [b"z"]


@pytest.mark.parametrize("body, cause", HOSTILE_UNIFORM)
def test_hostile_uniform_entries_give_an_error_naming_the_cause(body, cause):
    assert codec.read_header(UNIFORM).uniform
    with pytest.raises(CorruptEntryError, match=cause):
        codec.decode(body)


def test_first_at_or_after_finds_the_first_record_at_a_timestamp():
    batch = codec.decode(codec.encode([(b"", None, t) for t in (10, 20, 20, 30)], 0))
    assert [batch.first_at_or_after(t) for t in (5, 10, 11, 20, 21, 30, 31)] == [0, 0, 1, 1, 3, 3, 4]


@pytest.mark.parametrize("body, cause", HOSTILE)
def test_hostile_entries_give_an_error_naming_the_cause(body, cause):
    with pytest.raises(CorruptEntryError, match=cause):
        codec.decode(body)

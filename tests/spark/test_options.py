"""Option parsing: every malformed option fails up front with a message naming it."""
from __future__ import annotations

import pytest

from pybk.entry import DigestType
from pybk.spark.options import (DEFAULT_ENTRIES_PER_PARTITION, LedgerSelection, OptionError,
                                ReadOptions, WriteOptions, parse_ledgers)

URI = "etcd://127.0.0.1:2379/pybk"


def test_ledger_lists_ranges_open_ranges_and_all_parse():
    sel = parse_ledgers("1, 2,5-9")
    assert sel.ids() == [1, 2, 5, 6, 7, 8, 9]
    assert 7 in sel and 3 not in sel and 10 not in sel
    assert str(sel) == "1,2,5-9"
    tail = parse_ledgers("3,10-")
    assert not tail.finite and 10 in tail and 10**12 in tail and 4 not in tail
    assert parse_ledgers("all") == LedgerSelection(all=True)
    assert 123 in parse_ledgers("ALL")


@pytest.mark.parametrize("text, words", [
    ("1,x", "'x' is not a ledger id"),
    ("5-2", "ends before it starts"),
    ("", "is empty"),
    ("-3", "is not a ledger id"),
    ("1,,2", "'' is not a ledger id"),
    ("0-99999999", "more than"),
])
def test_bad_ledger_syntax_is_a_clear_error(text, words):
    with pytest.raises(OptionError, match=words):
        parse_ledgers(text)


def test_read_options_defaults_and_values():
    o = ReadOptions.parse({"metadataServiceUri": URI, "ledgers": "4"})
    assert o.ledgers.ids() == [4] and o.start_entry == 0 and o.end_entry is None
    assert o.entries_per_partition == DEFAULT_ENTRIES_PER_PARTITION
    assert not o.include_metadata and o.password == b"" and o.max_entries_per_trigger is None
    o = ReadOptions.parse({"METADATASERVICEURI": URI, "Ledgers": "1-3", "startEntry": "5",
                           "endEntry": "9", "entriesPerPartition": "2", "includeMetadata": "TRUE",
                           "password": "pw", "maxEntriesPerTrigger": "7",
                           "startingPosition": "latest"})
    assert (o.start_entry, o.end_entry, o.entries_per_partition) == (5, 9, 2)
    assert o.include_metadata and o.password == b"pw" and o.max_entries_per_trigger == 7
    assert o.starting_position == "latest"
    assert ReadOptions.parse({"metadataServiceUri": URI}).ledgers.all
    assert ReadOptions.parse({"metadataServiceUri": URI, "path": "2,3"}).ledgers.ids() == [2, 3]


@pytest.mark.parametrize("options, words", [
    ({}, "metadataServiceUri is required"),
    ({"metadataServiceUri": "http://x"}, "etcd://"),
    ({"metadataServiceUri": URI, "startEntry": "-1"}, "startEntry: -1 is below"),
    ({"metadataServiceUri": URI, "startEntry": "5", "endEntry": "4"}, "before startEntry"),
    ({"metadataServiceUri": URI, "entriesPerPartition": "0"}, "entriesPerPartition"),
    ({"metadataServiceUri": URI, "entriesPerPartition": "lots"}, "not an integer"),
    ({"metadataServiceUri": URI, "includeMetadata": "maybe"}, "not a boolean"),
    ({"metadataServiceUri": URI, "ledger": "1"}, "unknown option.*ledger"),
    ({"metadataServiceUri": URI, "startingPosition": "middle"}, "earliest"),
])
def test_bad_read_options_are_clear_errors(options, words):
    with pytest.raises(OptionError, match=words):
        ReadOptions.parse(options)


def test_write_options_defaults_and_checks():
    w = WriteOptions.parse({"metadataServiceUri": URI})
    assert (w.ensemble_size, w.write_quorum, w.ack_quorum) == (None, None, None)
    assert w.geometry(None) == (3, 2, 2) and w.geometry((2, 2, 1)) == (2, 2, 1)
    assert w.digest_type is DigestType.CRC32C and len(w.job_id) == 32
    w = WriteOptions.parse({"metadataServiceUri": URI, "ensembleSize": "1", "digestType": "mac",
                            "jobId": "j1"})
    assert w.geometry(None) == (1, 1, 1) and w.geometry((5, 3, 2)) == (1, 1, 1)
    assert w.digest_type is DigestType.MAC and w.job_id == "j1"
    with pytest.raises(OptionError, match="ensembleSize >= writeQuorum"):
        WriteOptions.parse({"metadataServiceUri": URI, "ensembleSize": "2", "writeQuorum": "3"})
    with pytest.raises(OptionError, match="digestType"):
        WriteOptions.parse({"metadataServiceUri": URI, "digestType": "md5"})
    with pytest.raises(OptionError, match="option jobId: bad job id 'a/b'"):
        WriteOptions.parse({"metadataServiceUri": URI, "jobId": "a/b"})
    with pytest.raises(OptionError, match=r"E=3 Qw=2 Qa=3 \(cluster ledger defaults 3/2/2\)"):
        WriteOptions.parse({"metadataServiceUri": URI, "ackQuorum": "3"}).geometry((3, 2, 2))


def test_security_options_are_file_names_shipped_with_the_plan():
    opts = ReadOptions.parse({"metadataServiceUri": URI, "TLS_CA": "/s/ca.crt", "token_file": "/s/t"})
    assert opts.security.as_mapping() == {"tls_ca": "/s/ca.crt", "token_file": "/s/t"}
    assert ReadOptions.parse({"metadataServiceUri": URI}).security is None
    written = WriteOptions.parse({"metadataServiceUri": URI, "tls_ca": "/s/ca.crt", "tls_cert": "/s/c",
                                  "tls_key": "/s/k", "tls_server_name": "bookie"})
    assert written.security.as_mapping() == {"tls_ca": "/s/ca.crt", "tls_cert": "/s/c", "tls_key": "/s/k",
                                             "tls_server_name": "bookie"}


def test_a_client_certificate_without_its_key_is_refused_naming_both_options():
    with pytest.raises(OptionError, match="tls_cert and tls_key go together"):
        ReadOptions.parse({"metadataServiceUri": URI, "tls_ca": "/s/ca.crt", "tls_cert": "/s/c"})

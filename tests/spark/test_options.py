"""Option parsing: every malformed option fails up front with a message naming it."""
from __future__ import annotations

import pytest

from pybk.entry import DigestType
from pybk.spark.options import (DEFAULT_ENTRIES_PER_PARTITION, EARLIEST, LATEST, LedgerSelection,
                                OnUnauthorized, OptionError, Positions, ReadOptions, Selector,
                                READ_OPTIONS, WriteOptions, parse_ledgers)

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
    ("metadata.stream", "not a metadata selector"),
    ("metadata.=x", "not a metadata selector"),
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
    assert o.ledgers.ids() == [4] and o.starting == Positions(EARLIEST) and o.ending == Positions(LATEST)
    assert o.entries_per_partition == DEFAULT_ENTRIES_PER_PARTITION
    assert not o.include_metadata and o.password == b"" and o.max_entries_per_trigger is None
    o = ReadOptions.parse({"METADATASERVICEURI": URI, "Ledgers": "1-3", "startEntry": "5",
                           "endEntry": "9", "entriesPerPartition": "2", "includeMetadata": "TRUE",
                           "password": "pw", "maxEntriesPerTrigger": "7"})
    assert (o.starting, o.ending, o.entries_per_partition) == (Positions(5), Positions(10), 2)
    assert o.include_metadata and o.password == b"pw" and o.max_entries_per_trigger == 7
    assert o.fail_on_data_loss and o.on_unauthorized is OnUnauthorized.FAIL and o.min_partitions == 1
    assert ReadOptions.parse({"metadataServiceUri": URI, "startingPosition": "latest"}).starting == Positions(LATEST)
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
    ({"metadataServiceUri": URI, "startingOffsets": "{12: 1}"}, "option startingOffsets: '{12: 1}' is not"),
    ({"metadataServiceUri": URI, "startingOffsets": '{"12": "x"}'}, "startingOffsets: '12': 'x'"),
    ({"metadataServiceUri": URI, "startingOffsets": '{"12": -3}'}, "startingOffsets"),
    ({"metadataServiceUri": URI, "startingOffsets": "[1]"}, "must be a JSON object"),
    ({"metadataServiceUri": URI, "endingOffsets": "earliest"}, "endingOffsets.*not an ending position"),
    ({"metadataServiceUri": URI, "endingOffsets": '{"3": -2}'}, "not an ending position"),
    ({"metadataServiceUri": URI, "startEntry": "1", "startingOffsets": "latest"}, "startEntry and startingOffsets"),
    ({"metadataServiceUri": URI, "endEntry": "1", "endingOffsets": "latest"}, "endEntry and endingOffsets"),
    ({"metadataServiceUri": URI, "minPartitions": "0"}, "minPartitions"),
    ({"metadataServiceUri": URI, "failOnDataLoss": "perhaps"}, "failOnDataLoss"),
    ({"metadataServiceUri": URI, "onUnauthorized": "ignore"}, "onUnauthorized: 'ignore' must be"),
    ({"metadataServiceUri": URI, "passwords": "pw"}, "option passwords is not JSON"),
    ({"metadataServiceUri": URI, "passwords": '{"x": "pw"}'}, "neither a ledger id nor a selector"),
    ({"metadataServiceUri": URI, "passwords": '{"3": 7}'}, "must be a JSON string"),
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


def test_metadata_selectors_of_one_key_are_alternatives_and_keys_and_ids_must_all_hold():
    sel = parse_ledgers("metadata.stream=orders, metadata.stream=refunds,metadata.region=eu")
    assert sel.all and 10**9 in sel
    assert sel.selectors == (Selector("stream", "orders"), Selector("stream", "refunds"), Selector("region", "eu"))
    assert sel.matches({"stream": b"orders", "region": b"eu"})
    assert sel.matches({"stream": b"refunds", "region": b"eu", "other": b"\xff"})
    assert not sel.matches({"stream": b"orders"})                      # region missing
    assert not sel.matches({"stream": b"orders ", "region": b"eu"})    # bytes compared exactly
    assert parse_ledgers("all").matches({}) and parse_ledgers("1").matches({"x": b"y"})
    both = parse_ledgers("5-9,metadata.team=a")
    assert both.finite and both.ids() == [5, 6, 7, 8, 9] and not both.matches({"team": b"b"})
    assert str(both) == "5-9,metadata.team=a" and str(sel).startswith("metadata.stream=orders")
    assert parse_ledgers("metadata.pybk.spark.job=j-1=x").selectors == (Selector("pybk.spark.job", "j-1=x"),)


def test_per_ledger_offsets_resolve_against_the_readable_end():
    o = ReadOptions.parse({"metadataServiceUri": URI, "startingOffsets": '{"12": 100, "13": -2, "14": -1}',
                           "endingOffsets": '{"12": 150}'})
    s, e = o.starting, o.ending
    assert [s.resolve(lid, 500) for lid in (12, 13, 14, 15)] == [100, 0, 500, 0]   # 15: not named: earliest
    assert [e.cap(lid) for lid in (12, 13)] == [150, None]                          # 13: not named: latest
    assert s.first_of_new(14) == 0 and s.first_of_new(12) == 100    # a ledger found later: all of it is new
    words = ReadOptions.parse({"metadataServiceUri": URI, "startingOffsets": "LATEST", "endingOffsets": "latest"})
    assert words.starting == Positions(LATEST) and words.ending == Positions(LATEST)
    assert words.starting.resolve(3, 40) == 40 and words.starting.first_of_new(3) == 0
    entries = ReadOptions.parse({"metadataServiceUri": URI, "startEntry": "5", "endEntry": "9"})
    assert entries.starting.resolve(1, 100) == 5 and entries.ending.cap(1) == 10
    assert ReadOptions.parse({"metadataServiceUri": URI}).starting.resolve(1, 9) == 0 == EARLIEST + 2


def test_passwords_by_id_win_over_selectors_in_their_order_then_password():
    o = ReadOptions.parse({"metadataServiceUri": URI, "password": "default", "onUnauthorized": "SKIP",
                           "passwords": '{"7": "seven", "metadata.team=a": "team-a", "metadata.env=prod": "prod"}'})
    assert o.on_unauthorized is OnUnauthorized.SKIP
    assert o.password_for(7, {"team": b"a"}) == b"seven"
    assert o.password_for(8, {"team": b"a", "env": b"prod"}) == b"team-a"
    assert o.password_for(8, {"env": b"prod"}) == b"prod"
    assert o.password_for(8, {}) == b"default" and o.password_for(8) == b"default"
    assert o.with_password(8, b"found").password_for(8) == b"found"   # what planning resolved wins


def test_docs_option_tables_list_exactly_the_read_options():
    import re
    from pathlib import Path
    text = Path(__file__).resolve().parents[2].joinpath("docs", "spark.md").read_text()
    reading = text[text.index("## Reading"):text.index("## Writing")]
    documented = {name.lower() for row in re.findall(r"^\| ([^|]+) \|", reading, re.M)
                  for name in re.findall(r"`(\w+)`", row)}
    documented.discard("option")
    assert documented == set(READ_OPTIONS) - {"path"}, documented ^ (set(READ_OPTIONS) - {"path"})
    assert 'load("1,2")' in reading  # path


def test_a_write_without_a_password_is_refused_on_the_driver_when_security_is_on(monkeypatch):
    from pybk.client.bookkeeper import public_key_refusal
    from pybk.security.settings import ENV, ClientSecurity
    from pybk.spark.source import _write_options
    for variable in ENV.values():
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("PYBK_LOCAL_DIR", "/nonexistent")
    assert _write_options({"metadataServiceUri": URI}).password == b""  # security off: as before
    with pytest.raises(OptionError, match="^option password: refusing to create a ledger without a password"):
        _write_options({"metadataServiceUri": URI, "tls_ca": "/etc/pybk/ca.crt"})
    monkeypatch.setenv("PYBK_TOKEN_FILE", "/etc/pybk/token")  # the executors' credentials, from the environment
    with pytest.raises(OptionError, match="master key would be the empty password's"):
        _write_options({"metadataServiceUri": URI})
    assert _write_options({"metadataServiceUri": URI, "password": "s3cret"}).password == b"s3cret"
    assert public_key_refusal(b"", ClientSecurity()) == "" and public_key_refusal(b"x", ClientSecurity(tls_ca="c")) == ""
    assert public_key_refusal(None, ClientSecurity(tls_cert="c")).startswith("refusing")

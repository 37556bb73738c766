"""Shell output helpers and cluster resolution, as pure functions."""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field

import pytest

from pybk import shell


def test_table_aligns_columns_under_upper_case_headers():
    out = shell.format_table(["id", "state"], [["bookie-0", "writable"], ["bookie-10", None]])
    assert out.splitlines() == ["ID         STATE", "bookie-0   writable", "bookie-10"]


def test_empty_table_says_so():
    assert shell.format_table(["id"], [], empty="no bookies registered") == "no bookies registered"


def test_payload_preview_shows_text_or_hex():
    assert shell.payload_preview(b"hello") == "'hello'"
    assert shell.payload_preview(b"x" * 100, limit=10) == repr("x" * 10) + "..."
    assert shell.payload_preview(b"\x00\xff") == "0x00ff"


def test_entry_json_round_trips_bytes():
    e = shell.entry_json(7, b"\xffabc")
    assert e["entry_id"] == 7 and e["length"] == 4 and e["payload_text"] is None
    assert base64.b64decode(e["payload_base64"]) == b"\xffabc"
    assert shell.entry_json(0, b"hi")["payload_text"] == "hi"


@dataclass
class _Frag:
    first_entry_id: int
    bookies: list


@dataclass
class _State:
    name: str


@dataclass
class _Md:
    state: _State
    last_entry_id: int
    fragments: list = field(default_factory=list)


def test_fragments_json_ends_each_where_the_next_begins():
    md = _Md(_State("CLOSED"), 9, [_Frag(0, ["a", "b"]), _Frag(5, ["a", "c"])])
    assert shell.fragments_json(md) == [{"first_entry_id": 0, "last_entry_id": 4, "bookies": ["a", "b"]},
                                         {"first_entry_id": 5, "last_entry_id": 9, "bookies": ["a", "c"]}]
    md.state = _State("OPEN")
    assert shell.fragments_json(md)[-1]["last_entry_id"] is None


def test_metadata_uri_precedence(tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    (local / "local.json").write_text(json.dumps({"metadata_service_uri": "etcd://127.0.0.1:1/from-dir"}))
    env = {"PYBK_METADATA_URI": "etcd://127.0.0.1:2/from-env"}
    assert shell.resolve_metadata_uri("etcd://h:3/flag", str(local), env) == "etcd://h:3/flag"
    assert shell.resolve_metadata_uri(None, str(local), env) == "etcd://127.0.0.1:1/from-dir"
    assert shell.resolve_metadata_uri(None, None, env) == "etcd://127.0.0.1:2/from-env"
    assert shell.resolve_metadata_uri(None, None, {"PYBK_LOCAL_DIR": str(local)}) == "etcd://127.0.0.1:1/from-dir"


@pytest.mark.parametrize("uri", ["http://127.0.0.1:2379/pybk", "etcd://", "127.0.0.1:2379"])
def test_bad_metadata_uri_is_refused_with_an_example(uri):
    with pytest.raises(shell.ShellError, match="expected etcd://HOST:PORT"):
        shell.resolve_metadata_uri(uri, None, {})


def test_no_cluster_given_says_how_to_give_one(tmp_path):
    with pytest.raises(shell.ShellError, match="--metadata-uri"):
        shell.resolve_metadata_uri(None, None, {"PYBK_LOCAL_DIR": str(tmp_path)})
    with pytest.raises(shell.ShellError, match="pybk local up"):
        shell.resolve_metadata_uri(None, str(tmp_path), {})


def test_human_bytes():
    assert [shell.human_bytes(n) for n in (0, 1023, 1536, 5 * 1024 ** 3)] == ["0 B", "1023 B", "1.5 KiB", "5.0 GiB"]


def test_a_secure_local_cluster_gives_its_credentials_and_the_environment_overrides_them(tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    security = {"tls_ca": "/s/ca.crt", "tls_cert": "/s/admin/tls.crt", "tls_key": "/s/admin/tls.key",
                "token_file": "/s/tokens/admin.token"}
    uri = "etcd://127.0.0.1:1/pybk?tls_ca=/s/ca.crt&user=pybk&password_file=/s/etcd-users/pybk.password"
    (local / "local.json").write_text(json.dumps({"metadata_service_uri": uri, "security": security}))
    by_dir = shell.resolve_cluster(None, str(local), {})
    assert by_dir.metadata_uri == uri and by_dir.security.as_mapping() == security
    # the cluster's URI given explicitly (its base is enough) finds the same credentials
    env = {"PYBK_LOCAL_DIR": str(local)}
    assert shell.resolve_cluster("etcd://127.0.0.1:1/pybk", None, env).security.as_mapping() == security
    # another cluster's URI gets none of them
    assert shell.resolve_cluster("etcd://127.0.0.1:2/pybk", None, env).security.as_mapping() == {}
    reader = shell.resolve_cluster(None, str(local), {"PYBK_TOKEN_FILE": "/s/tokens/reader.token"})
    assert reader.security.as_mapping() == {**security, "token_file": "/s/tokens/reader.token"}

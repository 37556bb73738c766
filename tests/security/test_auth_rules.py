"""The pure rules of authentication: the auth file's checks, who a credential is, what a request
asks for."""
from __future__ import annotations

import hashlib

import pytest
import yaml

from pybk.security.auth import AccessDenied, AuthFileError, Denial, bearer_token, decide, parse_auth_file
from pybk.security.roles import Operation, Role
from pybk.security.server import start_warnings
from pybk.security.web import operation_of


def write(tmp_path, doc) -> str:
    path = tmp_path / "auth.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return str(path)


@pytest.mark.parametrize("doc,cause", [
    ({"tokens": [{"name": "a", "role": "owner", "sha256": "00" * 32}]}, "token 'a': unknown role 'owner'"),
    ({"tokens": [{"name": "a", "role": "reader", "sha256": "abc"}]}, "token 'a': sha256 must be 64 hex digits"),
    ({"tokens": [{"name": "a", "role": "reader"}]}, "token 'a': give `sha256` or `token_file`"),
    ({"tokens": [{"name": "a", "role": "reader", "token_file": "/nonexistent/t"}]},
     "token 'a': unreadable token_file /nonexistent/t"),
    ({"subjects": [{"role": "reader"}]}, "every subject needs a `cn`"),
    ({"users": []}, "unknown keys ['users']"),
    ("tokens: [", "not valid YAML"),
])
def test_bad_auth_file_is_refused_naming_file_and_cause(tmp_path, doc, cause):
    path = write(tmp_path, doc)
    with pytest.raises(AuthFileError) as err:
        parse_auth_file(path)
    assert str(err.value).startswith(f"{path}: ") and cause in str(err.value), str(err.value)


def test_tokens_by_hash_or_file_and_subjects_by_common_name(tmp_path):
    (tmp_path / "admin.token").write_text("admin-secret\n")
    table = parse_auth_file(write(tmp_path, {
        "tokens": [{"name": "svc", "role": "writer", "sha256": hashlib.sha256(b"svc-secret").hexdigest()},
                   {"name": "ops", "role": "admin", "token_file": str(tmp_path / "admin.token")}],
        "subjects": [{"cn": "spark", "role": "reader"}]}))
    assert decide(table, "svc-secret", None, Operation.ADD).role is Role.WRITER
    assert decide(table, "admin-secret", None, Operation.ADMINISTER).name == "ops"
    assert decide(table, None, "spark", Operation.READ).name == "CN=spark"
    with pytest.raises(AccessDenied) as err:
        decide(table, None, "spark", Operation.FENCE)
    assert err.value.denial is Denial.PERMISSION_DENIED
    assert err.value.message == "CN=spark has role reader; fence needs role writer"
    with pytest.raises(AccessDenied) as err:
        decide(table, "wrong", "spark", Operation.READ)  # a presented token must be known
    assert err.value.denial is Denial.UNAUTHENTICATED and err.value.message == "unknown bearer token"
    with pytest.raises(AccessDenied) as err:
        decide(table, None, None, Operation.INFO)
    assert err.value.denial is Denial.UNAUTHENTICATED and err.value.message.startswith("no credential")


def test_bearer_token_is_taken_from_the_authorization_value():
    assert bearer_token(["Basic x", "bearer  tok "]) == "tok"
    assert bearer_token(["Bearer "]) is None and bearer_token([]) is None


def test_admin_requests_ask_reader_for_reads_and_admin_for_changes():
    opened = frozenset({"/heartbeat"})
    assert operation_of("GET", "/heartbeat", opened) is None
    assert operation_of("POST", "/heartbeat", opened) is Operation.ADMINISTER
    assert operation_of("GET", "/api/v1/bookie/state", opened) is Operation.INFO
    assert operation_of("PUT", "/api/v1/bookie/state/readonly", opened) is Operation.ADMINISTER


def test_start_warnings_say_what_is_open():
    assert start_warnings(False, True, "h:1") == [
        "security is OFF: no --auth-file, so any client that reaches h:1 may read, write and administer"]
    assert start_warnings(True, False, "h:1")[0].startswith("bearer tokens travel in plaintext")
    assert start_warnings(True, True, "h:1") == []

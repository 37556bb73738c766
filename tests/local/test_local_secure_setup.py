"""The one-time security setup of `pybk local up --secure` in a data dir (files only, no processes)."""
from __future__ import annotations

import hashlib
import stat

import pytest
import yaml
from cryptography import x509

from pybk.local.errors import LocalClusterError
from pybk.local.secure import CLIENT_IDENTITY, EtcdUser, Identity, LocalSecurity, secure_mode
from pybk.security.roles import Role


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_setup_writes_every_secret_owner_only_and_the_auth_file_names_tokens_by_sha256(tmp_path):
    security = LocalSecurity.of(tmp_path).ensure()
    secrets = [security.ca_key, security.auth_file, *(security.token_file(r) for r in Role),
               *(security.etcd_password_file(u) for u in EtcdUser), *(security.identity(i).key for i in Identity)]
    assert {str(p): _mode(p) for p in secrets} == {str(p): 0o600 for p in secrets}
    doc = yaml.safe_load(security.auth_file.read_text())
    tokens = {r: security.token_file(r).read_text() for r in Role}
    assert {t["role"]: t["sha256"] for t in doc["tokens"]} == {
        str(r): hashlib.sha256(tokens[r].encode()).hexdigest() for r in Role}
    assert len(set(tokens.values())) == 3 and all(len(t) >= 40 for t in tokens.values())
    # no token appears in clear in the auth file
    assert not any(t in security.auth_file.read_text() for t in tokens.values())
    assert {s["cn"]: s["role"] for s in doc["subjects"]} == {
        "pybk-bookie": "admin", "pybk-autorecovery": "admin", "pybk-admin": "admin",
        "pybk-writer": "writer", "pybk-reader": "reader"}


def test_every_certificate_is_signed_by_the_local_ca_for_loopback_and_localhost(tmp_path):
    security = LocalSecurity.of(tmp_path).ensure()
    ca = x509.load_pem_x509_certificate(security.ca_cert.read_bytes())
    for who in Identity:
        files = security.identity(who)
        cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
        cert.verify_directly_issued_by(ca)
        assert cert.subject.rfc4514_string() == f"CN=pybk-{who.value}"
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
        assert names.get_values_for_type(x509.DNSName) == ["localhost"]
        assert files.ca.read_bytes() == security.ca_cert.read_bytes()


def test_a_second_up_reuses_the_ca_and_secrets(tmp_path):
    first = LocalSecurity.of(tmp_path).ensure()
    before = {p: p.read_bytes() for p in first.root.rglob("*") if p.is_file()}
    again = LocalSecurity.of(tmp_path).ensure()
    assert {p: p.read_bytes() for p in again.root.rglob("*") if p.is_file()} == before


def test_an_interrupted_setup_is_started_over(tmp_path):
    security = LocalSecurity.of(tmp_path).ensure()
    old_ca = security.ca_cert.read_bytes()
    security.marker.unlink()  # as if the first setup had stopped before finishing
    assert not security.ready
    security.ensure()
    assert security.ready and security.ca_cert.read_bytes() != old_ca


def test_client_settings_are_file_names_of_the_role(tmp_path):
    security = LocalSecurity.of(tmp_path).ensure()
    for role, who in CLIENT_IDENTITY.items():
        client = security.client(role)
        assert client.tls_ca == str(security.ca_cert)
        assert client.tls_cert == str(security.identity(who).cert)
        assert client.token_file == str(security.token_file(role))
        assert client.token() == security.token_file(role).read_text()
    options = security.server_options(Identity.BOOKIE)
    assert set(options) == {"tls_cert", "tls_key", "tls_ca", "auth_file", "token_file"}
    assert options["token_file"] == str(security.token_file(Role.ADMIN))
    assert security.etcd_login() == {"user": "pybk", "password_file": str(security.etcd_password_file(EtcdUser.READWRITE))}


def test_secure_mode_is_remembered_and_refused_on_a_dir_started_insecure(tmp_path):
    assert secure_mode(tmp_path, asked=False, has_data=False) is False
    assert secure_mode(tmp_path, asked=True, has_data=False) is True
    with pytest.raises(LocalClusterError, match="--secure refused: .* started without --secure") as e:
        secure_mode(tmp_path, asked=True, has_data=True)
    assert "new data dir" in str(e.value)
    LocalSecurity.of(tmp_path).ensure()
    assert secure_mode(tmp_path, asked=False, has_data=True) is True

"""Certificates of a real bookie: replaced on disk they are served to new connections without a
restart; a bad replacement keeps the old one; an expired, wrong-CA or mismatched one stops the
start naming the file and the cause; client certificates (mTLS) identify callers by CN."""
from __future__ import annotations

import datetime
import os

import grpc
import pytest
import yaml
from cryptography import x509
from security_helpers import served_certificate
from polling import eventually

from pybk import entry
from pybk.client.bookie_client import BookieAccessDeniedError, BookieClient, BookieUnavailableError
from pybk.local.bookie import BookieProcess
from pybk.security.ca import CertificateAuthority
from pybk.security.settings import ClientSecurity

KEY = entry.master_key(b"pw")


def serial_of(der: bytes) -> int:
    return x509.load_der_x509_certificate(der).serial_number


def replace_identity(pki, directory, common_name: str, **validity) -> int:
    """Issue a new certificate for the bookie, move it over the served files; its serial."""
    files = pki.ca.write_identity(directory, common_name, **validity)
    os.replace(files.key, pki.server.key)
    os.replace(files.cert, pki.server.cert)
    return x509.load_pem_x509_certificate(pki.server.cert.read_bytes()).serial_number


async def test_replaced_certificate_is_served_to_new_connections_without_restart(bookies, pki, tmp_path):
    b, = bookies(1, metadata_uri=None, **pki.bookie_options())
    old = serial_of(served_certificate(b.host, b.port, pki.server.ca))
    assert serial_of(served_certificate(b.host, b.http_port, pki.server.ca)) == old
    pid = b.proc.pid
    async with await BookieClient.connect(b.address, security=pki.client("writer")) as c:
        await c.add(1, 0, entry.encode(1, 0, -1, b"before"), master_key=KEY)
    new = replace_identity(pki, tmp_path / "rotated", "pybk-bookie-rotated")
    assert new != old
    for port in (b.port, b.http_port):
        await eventually(lambda: serial_of(served_certificate(b.host, port, pki.server.ca)) == new, timeout=30,
                         what=f"port {port} to serve the new certificate")
    async with await BookieClient.connect(b.address, security=pki.client("writer")) as c:
        await c.add(1, 1, entry.encode(1, 1, 0, b"after"), master_key=KEY)
        assert await c.read(1, 0) == entry.encode(1, 0, -1, b"before")
    assert b.proc.pid == pid and b.alive()
    assert "TLS certificate reloaded" in b.log_tail(50) and "pybk-bookie-rotated" in b.log_tail(50)


async def test_bad_replacement_is_logged_and_the_old_certificate_stays(bookies, pki, tmp_path):
    b, = bookies(1, metadata_uri=None, **pki.bookie_options())
    old = serial_of(served_certificate(b.host, b.port, pki.server.ca))
    past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=2)
    replace_identity(pki, tmp_path / "expired", "pybk-bookie-expired", not_before=past - datetime.timedelta(days=1),
                     not_after=past)
    def refused() -> bool:  # servers look at their files when a new connection comes
        served_certificate(b.host, b.port, pki.server.ca)
        served_certificate(b.host, b.http_port, pki.server.ca)
        return b.log_tail(50).count("certificate expired at") >= 2

    await eventually(refused, timeout=30, what="the refused replacement to be logged by both ports")
    assert f"{pki.server.cert}: certificate expired at" in b.log_tail(50)
    assert serial_of(served_certificate(b.host, b.port, pki.server.ca)) == old
    assert serial_of(served_certificate(b.host, b.http_port, pki.server.ca)) == old
    async with await BookieClient.connect(b.address, security=pki.client("reader")) as c:
        assert (await c.info())["bookie_id"] == b.bookie_id


def refused_start(tmp_path, pki, **options) -> str:
    """Start a bookie that must refuse to start; its stderr/log tail."""
    b = BookieProcess(tmp_path / "refused", **{**pki.bookie_options(), **options})
    b.start(wait=False)
    assert b.exit_code(60) == 3
    return b.log_tail(20)


def test_expired_certificate_is_refused_at_start_naming_it(tmp_path, pki, child_processes):
    past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=2)
    files = pki.ca.write_identity(tmp_path / "expired", "pybk-bookie", not_before=past - datetime.timedelta(days=1),
                                  not_after=past)
    tail = refused_start(tmp_path, pki, tls_cert=files.cert, tls_key=files.key)
    assert f"refusing to start: {files.cert}: certificate expired at {past.year}" in tail, tail


def test_certificate_of_another_ca_is_refused_at_start_naming_it(tmp_path, pki, child_processes):
    files = CertificateAuthority.create("another CA").write_identity(tmp_path / "other", "pybk-bookie")
    tail = refused_start(tmp_path, pki, tls_cert=files.cert, tls_key=files.key)
    assert f"refusing to start: {files.cert}: not signed by the CA in {pki.server.ca}" in tail, tail


def test_key_of_another_certificate_is_refused_at_start_naming_it(tmp_path, pki, child_processes):
    files = pki.ca.write_identity(tmp_path / "other", "pybk-bookie")
    tail = refused_start(tmp_path, pki, tls_key=files.key)
    assert f"refusing to start: {files.key}: key does not match certificate {pki.server.cert}" in tail, tail


async def test_client_trusting_another_ca_is_refused_by_the_handshake(bookies, pki, tmp_path):
    b, = bookies(1, metadata_uri=None, **pki.bookie_options())
    other = CertificateAuthority.create("another CA").write_identity(tmp_path / "other", "x")
    security = ClientSecurity(tls_ca=str(other.ca), token_file=str(pki.tokens["admin"]))
    async with await BookieClient.connect(b.address, security=security) as c:
        with pytest.raises(BookieUnavailableError) as err:
            await c.info()
    assert "UNAVAILABLE" in str(err.value) and "handshake" in str(err.value).lower(), str(err.value)


async def test_client_certificates_identify_callers_by_common_name(bookies, pki, tmp_path):
    b, = bookies(1, metadata_uri=None, **pki.bookie_options(tls_client_auth=True))
    spark = pki.ca.write_identity(tmp_path / "spark", "pybk-spark")
    stranger = pki.ca.write_identity(tmp_path / "stranger", "someone-else")
    outsider = CertificateAuthority.create("another CA").write_identity(tmp_path / "outsider", "pybk-spark")

    def with_cert(files) -> ClientSecurity:
        return ClientSecurity(tls_ca=str(pki.server.ca), tls_cert=str(files.cert), tls_key=str(files.key))

    async with await BookieClient.connect(b.address, security=with_cert(spark)) as c:
        assert (await c.info())["bookie_id"] == b.bookie_id
        with pytest.raises(BookieAccessDeniedError) as err:
            await c.add(1, 0, entry.encode(1, 0, -1, b"x"), master_key=KEY)
        assert err.value.grpc_code is grpc.StatusCode.PERMISSION_DENIED
        assert "CN=pybk-spark has role reader; add needs role writer" in err.value.message
    async with await BookieClient.connect(b.address, security=with_cert(stranger)) as c:
        with pytest.raises(BookieAccessDeniedError) as err:
            await c.info()
        assert err.value.grpc_code is grpc.StatusCode.UNAUTHENTICATED
        assert "CN=someone-else is not listed in the auth file" in err.value.message
    async with await BookieClient.connect(b.address, security=with_cert(outsider)) as c:
        with pytest.raises(BookieUnavailableError):
            await c.info()
    async with await BookieClient.connect(b.address, security=pki.client("reader")) as c:  # no certificate
        with pytest.raises(BookieUnavailableError):
            await c.info()
    # the same certificate authenticates on admin HTTP, where it is optional
    import urllib.request
    from pybk.security.tls import client_ssl_context
    ctx = client_ssl_context(with_cert(spark))
    with urllib.request.urlopen(b.http_url + "/api/v1/bookie/info", context=ctx, timeout=10) as resp:
        assert resp.status == 200


async def test_auth_file_is_reread_when_it_changes(bookies, pki):
    b, = bookies(1, metadata_uri=None, **pki.bookie_options())
    async with await BookieClient.connect(b.address, security=pki.client("reader")) as c:
        with pytest.raises(BookieAccessDeniedError):
            await c.add(1, 0, entry.encode(1, 0, -1, b"x"), master_key=KEY)
        doc = yaml.safe_load(pki.auth_file.read_text())
        for item in doc["tokens"]:
            if item["role"] == "reader":
                item["role"] = "writer"
        pki.auth_file.write_text(yaml.safe_dump(doc))

        async def adds():
            try:
                await c.add(1, 0, entry.encode(1, 0, -1, b"x"), master_key=KEY)
            except BookieAccessDeniedError:
                return False
            return True
        await eventually(adds, timeout=30, what="the promoted token to add")
    assert "auth file" in b.log_tail(30) and "reloaded" in b.log_tail(30)


async def test_without_client_auth_a_client_certificate_is_optional_on_the_grpc_port(bookies, pki, tmp_path):
    """Without tls_client_auth the gRPC port asks for a certificate but does not require one, as
    admin HTTP does: a verified one names the caller, a token still works without one, and a
    certificate of another CA is refused in the handshake."""
    b, = bookies(1, metadata_uri=None, **pki.bookie_options())
    spark = pki.ca.write_identity(tmp_path / "spark", "pybk-spark")
    outsider = CertificateAuthority.create("another CA").write_identity(tmp_path / "outsider", "pybk-spark")

    def with_cert(files) -> ClientSecurity:
        return ClientSecurity(tls_ca=str(pki.server.ca), tls_cert=str(files.cert), tls_key=str(files.key))

    async with await BookieClient.connect(b.address, security=with_cert(spark)) as c:
        info = await c.info()
        assert (info["caller"], info["caller_role"]) == ("CN=pybk-spark", "reader")
    async with await BookieClient.connect(b.address, security=pki.client("writer")) as c:  # token, no certificate
        assert (await c.info())["caller_role"] == "writer"
    async with await BookieClient.connect(b.address, security=with_cert(outsider)) as c:
        with pytest.raises(BookieUnavailableError) as err:
            await c.info()
    assert "UNAVAILABLE" in str(err.value)

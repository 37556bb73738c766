"""etcd security on a real etcd: TLS to etcd, user/password and client-certificate
authentication, the reader role, re-authentication when etcd forgets tokens, and secrets that
never show."""
import asyncio
import datetime
import logging
import socket
import sys

import grpc
import pytest
from aetcd import rpc
from secure_etcd import PASSWORDS, ROOT_PASSWORD

from pybk.local.etcd import EtcdProcess, EtcdTls
from pybk.meta import (BadMetadataUriError, BookieInfo, MetadataAuthError, MetadataPermissionError,
                       MetadataStore, MetadataTlsError, MetadataUnavailableError, VersionConflictError)
from pybk.meta.etcd_auth import enable_auth
from pybk.security.ca import CertificateAuthority, write_private
from polling import eventually

ENSEMBLE = ["b1:3181", "b2:3181", "b3:3181"]


async def connect(uri: str, **kw) -> MetadataStore:
    return await MetadataStore.connect(uri, **kw)


async def token_refused(store: MetadataStore) -> bool:
    """Whether etcd now refuses the token the store holds (expired, or etcd restarted)."""
    try:
        await store.etcd.kv.Range(rpc.RangeRequest(key=store.prefix + b"cluster"), timeout=2, wait_for_ready=True,
                                  metadata=store.etcd.call_metadata())
    except grpc.aio.AioRpcError as exc:
        return "invalid auth token" in (exc.details() or "")
    return False


async def test_store_over_tls_as_user_does_cas_ledger_ops_locks_and_registration(secure_etcd):
    store = await connect(secure_etcd.uri("pybk", lease_ttl=2))
    try:
        md = await store.ledgers.create(ENSEMBLE, 2, 2, password_hash=b"h", custom={"app": b"orders"})
        closed = await store.ledgers.cas(md.replace(last_entry_id=41, length=4200))
        with pytest.raises(VersionConflictError):
            await store.ledgers.cas(md.replace(last_entry_id=7))
        assert await store.ledgers.get(md.ledger_id) == closed
        assert [i async for i in store.ledgers.list()] == [md.ledger_id]
        await store.registry.register(BookieInfo("b1:3181", "127.0.0.1:3181"))
        lock = await store.locks.acquire("underreplicated/7", b"me")
        leadership = await store.election.campaign("auditor-1")
        assert (await store.locks.holder("underreplicated/7"))[0] == b"me"
        assert await store.election.leader() == "auditor-1"
        assert "b1:3181" in await store.registry.writable()
        await lock.release()
        await leadership.resign()
        assert store.etcd.channel.get_state() == grpc.ChannelConnectivity.READY
        assert store.uri.tls and store.etcd.token
    finally:
        await store.close()


async def test_etcd_with_auth_refuses_a_client_without_credentials(secure_etcd):
    with pytest.raises(MetadataAuthError) as err:
        await connect(secure_etcd.uri())
    first = str(err.value).splitlines()[0]
    assert f"etcd at {secure_etcd.proc.endpoint} requires authentication" in first
    assert "user= and password_file=" in first


async def test_wrong_password_or_unknown_user_is_refused_naming_the_user(secure_etcd, tmp_path):
    wrong = write_private(tmp_path / "wrong.password", b"not-the-password\n")
    for user in ("pybk", "nobody"):
        with pytest.raises(MetadataAuthError) as err:
            await connect(secure_etcd.proc.metadata_uri("pybk", user=user, password_file=str(wrong)))
        first = str(err.value).splitlines()[0]
        assert f"refused user {user!r}: wrong password or no such user" in first
        assert str(wrong) in first and "not-the-password" not in str(err.value)


async def test_wrong_ca_is_refused_naming_tls_and_the_endpoint(secure_etcd, tmp_path):
    other = CertificateAuthority.create().write_identity(tmp_path / "other-ca", "client")
    uri = secure_etcd.proc.metadata_uri("pybk", tls_ca=str(other.ca), user="pybk",
                                        password_file=str(secure_etcd.password_files["pybk"]), timeout=1)
    with pytest.raises(MetadataTlsError) as err:
        await connect(uri)
    first = str(err.value).splitlines()[0]
    assert first.startswith(f"TLS handshake with etcd at {secure_etcd.proc.endpoint} failed")
    assert f"not signed by the CA in tls_ca={other.ca}" in first


async def test_plaintext_client_cannot_reach_the_tls_etcd(secure_etcd):
    plain = f"etcd://{secure_etcd.proc.endpoint}/pybk?timeout=1&user=pybk&password_file=" \
            f"{secure_etcd.password_files['pybk']}"
    with pytest.raises(MetadataUnavailableError) as err:
        await connect(plain)
    first = str(err.value).splitlines()[0]
    assert first.startswith(f"etcd at {secure_etcd.proc.endpoint} is unreachable")
    assert "does it require TLS? then set tls_ca" in first


async def test_reader_user_reads_ledger_metadata_but_cannot_write_it(secure_etcd):
    writer = await connect(secure_etcd.uri("pybk"))
    reader = await connect(secure_etcd.uri("pybk-reader"))
    try:
        md = await writer.ledgers.create(ENSEMBLE, 2, 2, password_hash=b"h")
        md = await writer.ledgers.cas(md.replace(last_entry_id=9, length=900))
        assert await reader.ledgers.get(md.ledger_id) == md
        assert [i async for i in reader.ledgers.list()] == [md.ledger_id]
        attempts = {
            "cas": reader.ledgers.cas(md.replace(last_entry_id=99, length=1)),
            "delete": reader.ledgers.delete(md.ledger_id),
            "create": reader.ledgers.create(ENSEMBLE, 2, 2),
        }
        for what, attempt in attempts.items():
            with pytest.raises(MetadataPermissionError) as err:
                await attempt
            first = str(err.value).splitlines()[0]
            assert "to user 'pybk-reader': permission denied" in first, what
        assert await writer.ledgers.get(md.ledger_id) == md, "the refused writes changed nothing"
    finally:
        await reader.close()
        await writer.close()


async def test_live_store_keeps_working_across_an_etcd_restart(secure_etcd):
    store = await connect(secure_etcd.uri("pybk", lease_ttl=3))
    observer = await connect(secure_etcd.uri("pybk-reader"))
    try:
        md = await store.ledgers.create(ENSEMBLE, 2, 2, password_hash=b"h")
        await store.registry.register(BookieInfo("b1:3181", "127.0.0.1:3181"))
        lease = store.session.current
        seen = []

        async def follow():
            async with observer.ledgers.watch(md.ledger_id, start_revision=md.version + 1) as watch:
                async for now in watch:
                    seen.append(now.last_entry_id if now else None)
                    if now is None:
                        return
        follower = asyncio.create_task(follow())
        md = await store.ledgers.cas(md.replace(last_entry_id=1, length=100))
        await eventually(lambda: seen == [1], 30, what="the watch's first event")
        writer_token, reader_token = store.etcd.token, observer.etcd.token

        secure_etcd.proc.restart()
        renewed_before = store.session._keeper.status[1]
        assert await token_refused(store) and await token_refused(observer), "etcd forgot its tokens"
        md = await store.ledgers.cas(md.replace(last_entry_id=5, length=500))
        assert store.etcd.token != writer_token
        await eventually(lambda: seen == [1, 5], 30, what="the watch's event after the restart")
        assert observer.etcd.token != reader_token, "the watch authenticated again"
        await store.ledgers.delete(md.ledger_id)
        await asyncio.wait_for(follower, 30)
        assert seen == [1, 5, None]

        await eventually(lambda: store.session._keeper.status[1] > renewed_before, 30,
                         what="a keepalive of the session lease after the restart")
        assert store.session.current == lease and store.session.generation == 1 and not store.session.lost.is_set()
        assert "b1:3181" in await observer.registry.writable()
    finally:
        await observer.close()
        await store.close()


async def test_idle_token_expiry_is_survived(secure_etcd_factory):
    secure = await secure_etcd_factory(auth_token_ttl=1)
    store = await connect(secure.uri("pybk"))
    try:
        md = await store.ledgers.create(ENSEMBLE, 2, 2)
        old = store.etcd.token
        # every look uses (and so keeps) the token: look less often than its 1 s TTL
        await eventually(lambda: token_refused(store), 30, interval=2.5, what="etcd dropping the idle token")
        md = await store.ledgers.cas(md.replace(last_entry_id=3, length=3))
        assert await store.ledgers.get(md.ledger_id) == md
        assert store.etcd.token != old
    finally:
        await store.close()


async def test_client_certificate_named_after_an_etcd_user_authenticates(secure_etcd_factory, tmp_path):
    secure = await secure_etcd_factory(client_cert_auth=True)
    stranger = CertificateAuthority.create().write_identity(tmp_path / "stranger", "pybk")
    uri = secure.proc.metadata_uri("pybk", tls_cert=str(stranger.cert), tls_key=str(stranger.key), timeout=1)
    with pytest.raises(MetadataTlsError) as err:
        await connect(uri)
    assert "etcd refused the client certificate" in str(err.value).splitlines()[0]

    reader_cert = secure.ca.write_identity(tmp_path / "reader-cert", "pybk-reader")
    reader = await connect(secure.proc.metadata_uri("pybk", tls_cert=str(reader_cert.cert),
                                                    tls_key=str(reader_cert.key)))
    writer = await connect(secure.uri("pybk"))
    try:
        md = await writer.ledgers.create(ENSEMBLE, 2, 2)
        assert await reader.ledgers.get(md.ledger_id) == md
        with pytest.raises(MetadataPermissionError) as err:
            await reader.ledgers.delete(md.ledger_id)
        assert "to the client certificate's user: permission denied" in str(err.value).splitlines()[0]
        assert await writer.ledgers.get(md.ledger_id) == md
    finally:
        await reader.close()
        await writer.close()


async def test_enable_auth_again_sets_the_given_access_and_refuses_a_wrong_root_password(secure_etcd):
    writer = await connect(secure_etcd.uri("pybk"))
    try:
        md = await writer.ledgers.create(ENSEMBLE, 2, 2)
        await enable_auth(secure_etcd.uri(), ROOT_PASSWORD, {"pybk": (PASSWORDS["pybk"], "read"),
                                                             "pybk-reader": (PASSWORDS["pybk-reader"], "readwrite")})
        with pytest.raises(MetadataPermissionError):
            await writer.ledgers.delete(md.ledger_id)
        promoted = await connect(secure_etcd.uri("pybk-reader"))
        try:
            closed = await promoted.ledgers.cas(md.replace(last_entry_id=0, length=10))
            assert await writer.ledgers.get(md.ledger_id) == closed
        finally:
            await promoted.close()
    finally:
        await writer.close()
    with pytest.raises(MetadataAuthError) as err:
        await enable_auth(secure_etcd.uri(), "not-root's", {})
    assert "refused user 'root': wrong root password" in str(err.value).splitlines()[0]


async def test_passwords_never_show_in_uris_logs_or_errors(secure_etcd, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    secrets = [ROOT_PASSWORD, *PASSWORDS.values()]
    uri = secure_etcd.uri("pybk")
    store = await connect(uri)
    shown = [str(store.uri), uri]
    try:
        await store.ledgers.create(ENSEMBLE, 2, 2)
        secure_etcd.proc.restart()
        await store.ledgers.create(ENSEMBLE, 2, 2)
    finally:
        await store.close()
    for bad in (f"{uri}&password={PASSWORDS['pybk']}", uri.replace("etcd://", f"etcd://pybk:{PASSWORDS['pybk']}@")):
        with pytest.raises(BadMetadataUriError) as err:
            await connect(bad)
        shown.append(str(err.value))
    assert "option 'password' is refused" in shown[2] and "password_file=PATH" in shown[2]
    wrong = write_private(tmp_path / "wrong", ROOT_PASSWORD.encode())
    with pytest.raises(MetadataAuthError) as err:
        await connect(secure_etcd.proc.metadata_uri("pybk", user="pybk", password_file=str(wrong)))
    shown.append(str(err.value))
    for text in [*shown, caplog.text]:
        for secret in secrets:
            assert secret not in text


async def test_unreadable_security_files_are_named_at_connect(secure_etcd, tmp_path):
    missing = tmp_path / "nope.crt"
    cases = {
        "tls_ca": secure_etcd.proc.metadata_uri("pybk", tls_ca=str(missing)),
        "password_file": secure_etcd.proc.metadata_uri("pybk", user="pybk", password_file=str(missing)),
    }
    for option, uri in cases.items():
        with pytest.raises(BadMetadataUriError) as err:
            await connect(uri)
        first = str(err.value).splitlines()[0]
        assert first.startswith(f"metadata URI option {option}={missing}: cannot read the file")


async def test_bookie_registers_through_a_secured_etcd_with_no_secret_in_argv_or_log(secure_etcd, bookies):
    [bookie] = bookies(1, metadata_uri=secure_etcd.uri("pybk"))
    reader = await connect(secure_etcd.uri("pybk-reader"))
    try:
        registered = await eventually(reader.registry.writable, 30, what="the bookie's registration")
        assert registered[bookie.bookie_id].grpc == bookie.address
        assert await reader.cluster.instance_id(create=False)
    finally:
        await reader.close()
    seen = " ".join(bookie.argv) + bookie.log_path.read_text(errors="replace")
    assert str(secure_etcd.password_files["pybk"]) in seen
    for secret in (ROOT_PASSWORD, *PASSWORDS.values()):
        assert secret not in seen


@pytest.mark.private_etcd
async def test_etcd_auth_command_turns_auth_on_with_passwords_from_files(etcd, tmp_path):
    files = {name: write_private(tmp_path / name, f"{name}-pw-5e0c7a\n".encode()) for name in ("root", "w", "r")}
    argv = [sys.executable, "-m", "pybk.meta.etcd_auth", "--metadata-uri", etcd.metadata_uri("pybk"),
            "--root-password-file", str(files["root"]), "--user", f"w={files['w']}:readwrite",
            "--user", f"r={files['r']}:read"]
    for _ in range(2):
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.STDOUT)
        out = (await asyncio.wait_for(proc.communicate(), 60))[0].decode()
        assert proc.returncode == 0, out
        assert "etcd authentication is on for /pybk/ (2 user(s) besides root)" in out
    with pytest.raises(MetadataAuthError):
        await connect(etcd.metadata_uri("pybk"))
    writer = await connect(etcd.metadata_uri("pybk", user="w", password_file=str(files["w"])))
    reader = await connect(etcd.metadata_uri("pybk", user="r", password_file=str(files["r"])))
    try:
        md = await writer.ledgers.create(ENSEMBLE, 2, 2)
        assert await reader.ledgers.get(md.ledger_id) == md
        with pytest.raises(MetadataPermissionError):
            await reader.ledgers.delete(md.ledger_id)
    finally:
        await reader.close()
        await writer.close()


async def test_live_store_follows_a_rotated_etcd_ca_and_certificate(secure_etcd):
    store = await connect(secure_etcd.uri("pybk", timeout=1))
    try:
        md = await store.ledgers.create(ENSEMBLE, 2, 2)
        # the Secret is rotated in place: a new CA, etcd's new certificate, the clients' new ca.crt
        CertificateAuthority.create().write_identity(secure_etcd.files.cert.parent, "etcd", ["127.0.0.1"])
        secure_etcd.proc.restart()
        errors = []

        async def closed_through_new_channel():
            try:
                return await store.ledgers.cas(md.replace(last_entry_id=2, length=20))
            except MetadataTlsError as exc:
                errors.append(str(exc))
        closed = await eventually(closed_through_new_channel, 60, what="a write after the rotation")
        assert store.etcd.channel_generation == 1
        assert any("not signed by the CA" in e and "reconnecting with them" in e for e in errors), errors
        assert await store.ledgers.get(md.ledger_id) == closed
    finally:
        await store.close()


async def test_expired_etcd_certificate_is_refused_saying_so(tmp_path, child_processes):
    ca = CertificateAuthority.create()
    now = datetime.datetime.now(datetime.timezone.utc)
    files = ca.write_identity(tmp_path / "tls", "etcd", ["127.0.0.1"], not_before=now - datetime.timedelta(days=2),
                              not_after=now - datetime.timedelta(days=1))
    proc = EtcdProcess(tmp_path / "data", tls=EtcdTls(files.cert, files.key, files.ca)).start(wait=False)
    try:
        proc.wait_ready(lambda: socket.create_connection((proc.host, proc.client_port), 1).close() is None, 30)
        with pytest.raises(MetadataTlsError) as err:
            await connect(proc.metadata_uri("pybk", timeout=1))
        first = str(err.value).splitlines()[0]
        assert first.startswith(f"TLS handshake with etcd at {proc.endpoint} failed")
        assert "certificate has expired" in first and "not signed by" not in first
    finally:
        proc.stop()

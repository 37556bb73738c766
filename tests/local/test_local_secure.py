"""`pybk local up --secure`: TLS, etcd auth and tokens on a real local cluster, and its clients
(library, shell) working unchanged with the settings local.json gives them."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pybk.local import control
from pybk.local.client import LocalClient, read_client
from pybk.local.datadir import read_local_json
from pybk.local.secure import EtcdUser, Identity, LocalSecurity
from pybk.security.roles import Role
from pybk.security.settings import ClientSecurity

from polling import eventually

PYBK = [sys.executable, "-m", "pybk.cli"]
PASSWORD = b"a long random ledger password"


def manifest(tmp_path: Path, replicas: int, autorecovery: int = 1) -> Path:
    path = tmp_path / f"secure-{replicas}.yaml"
    path.write_text("apiVersion: pybk.io/v1alpha1\nkind: BookieCluster\nmetadata: {name: s}\n"
                    f"spec:\n  replicas: {replicas}\n  ledgerDefaults: {{ensemble: 3, writeQuorum: 3, ackQuorum: 2}}\n"
                    # a killed bookie's registration expires within 2 s
                    "  config: {registration_ttl: \"2\"}\n"
                    f"  autorecovery: {{replicas: {autorecovery}}}\n")
    return path


def pybk(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*PYBK, *map(str, args)], capture_output=True, text=True, timeout=180,
                          env={**os.environ, **env} if env else None)


def secrets_of(data_dir: Path) -> list[str]:
    """Every secret of the data dir: tokens, etcd passwords, private keys."""
    security = LocalSecurity.of(data_dir)
    files = [*(security.token_file(r) for r in Role), *(security.etcd_password_file(u) for u in EtcdUser),
             security.ca_key, *(security.identity(i).key for i in Identity)]
    return [f.read_text().strip() for f in files]


async def write_ledgers(cluster: LocalClient, count: int = 3, entries: int = 20,
                        leave_open: bool = False) -> dict[int, list[bytes]]:
    """E3/Qw3/Qa2 ledgers with a password, closed (the last one left open by a writer that went
    away, with leave_open): {ledger id: the acknowledged payloads}."""
    from pybk.client import BookKeeper
    written: dict[int, list[bytes]] = {}
    bk = await BookKeeper.connect(cluster.metadata_uri, security=cluster.security)
    try:
        for n in range(count):
            lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=PASSWORD)
            payloads = [f"{lh.ledger_id}:{i}".encode() * 4 for i in range(entries)]
            for p in payloads:
                await lh.add_entry(p)
            if not (leave_open and n == count - 1):
                await lh.close()
            written[lh.ledger_id] = payloads
    finally:
        await bk.close()  # an open handle stays OPEN, as after a crash
    return written


async def read_back(cluster: LocalClient, written: dict[int, list[bytes]], recovery: bool = False) -> dict[int, list[bytes]]:
    from pybk.client import BookKeeper
    got = {}
    async with await BookKeeper.connect(cluster.metadata_uri, security=cluster.security) as bk:
        for lid in written:
            rh = await bk.open_ledger(lid, password=PASSWORD, recovery=recovery)
            last = rh.metadata.last_entry_id if rh.metadata.is_closed else await rh.read_last_add_confirmed()
            got[lid] = [bytes(e.data) async for e in rh.read_entries(0, last)] if last >= 0 else []
            await rh.close()
    return got


@pytest.fixture(scope="module")
def secured(tmp_path_factory, child_processes):
    """One secured 3-bookie cluster with autorecovery for the checks that do not change it."""
    tmp = tmp_path_factory.mktemp("secure")
    data_dir = tmp / "d"
    with control.detached(manifest(tmp, 3), data_dir, secure=True) as doc:
        yield data_dir, doc


def test_local_json_gives_clients_file_names_and_no_secret(secured):
    from pybk.meta.uri import parse
    data_dir, doc = secured
    security = LocalSecurity.of(data_dir)
    assert doc["security"] == security.client(Role.ADMIN).as_mapping()
    assert doc["credentials"]["reader"]["token_file"] == str(security.token_file(Role.READER))
    uri = parse(doc["metadata_service_uri"])
    assert (uri.tls_ca, uri.user, uri.password_file) == (
        str(security.ca_cert), "pybk", str(security.etcd_password_file(EtcdUser.READWRITE)))
    assert parse(doc["read_only_metadata_service_uri"]).user == "pybk-reader"
    assert doc["etcd"]["client_url"].startswith("https://127.0.0.1:")
    text = (data_dir / "local.json").read_text()
    assert [s for s in secrets_of(data_dir) if s in text] == []


def test_no_secret_is_on_any_process_command_line(secured):
    data_dir, doc = secured
    pids = [doc["etcd"]["pid"], *(b["pid"] for b in doc["bookies"]), *(r["pid"] for r in doc["autorecovery"])]
    lines = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode() for pid in pids}
    assert {pid: [s for s in secrets_of(data_dir) if s in line] for pid, line in lines.items()} == {p: [] for p in pids}
    bookie = lines[doc["bookies"][0]["pid"]]
    security = LocalSecurity.of(data_dir)
    assert f"--auth-file {security.auth_file}" in bookie and f"--tls-ca {security.ca_cert}" in bookie


def test_etcd_s_peer_port_speaks_tls_to_its_own_certificate_only(secured):
    """A plaintext peer port would take raft messages from anyone who reaches it. It serves TLS,
    and only a client certificate of the local CA with etcd's own common name gets through: not
    a plaintext client, not one without a certificate, not another identity of the same CA."""
    import ssl
    import urllib.error
    import urllib.request
    data_dir, doc = secured
    argv = Path(f"/proc/{doc['etcd']['pid']}/cmdline").read_bytes().decode().split("\0")
    peer = argv[argv.index("--listen-peer-urls") + 1]
    assert peer.startswith("https://127.0.0.1:")
    security = LocalSecurity.of(data_dir)

    def members(url: str, who: Identity | None) -> object:
        context = ssl.create_default_context(cafile=str(security.ca_cert)) if url.startswith("https") else None
        if who is not None:
            context.load_cert_chain(security.identity(who).cert, security.identity(who).key)
        try:
            with urllib.request.urlopen(url + "/members", timeout=10, context=context) as resp:
                return json.loads(resp.read())
        except (urllib.error.URLError, ConnectionError, ssl.SSLError) as exc:
            return exc

    plaintext = members(peer.replace("https://", "http://"), None)
    assert isinstance(plaintext, Exception) and "Remote end closed" in str(plaintext)
    for who in (None, Identity.READER, Identity.BOOKIE):
        refused = members(peer, who)
        assert isinstance(refused, Exception) and "BAD_CERTIFICATE" in str(refused), (who, refused)
    own = members(peer, Identity.ETCD)
    assert [m["name"] for m in own] == ["pybk-etcd"] and own[0]["clientURLs"] == [doc["etcd"]["client_url"]]


def test_shell_lists_and_reads_ledgers_through_tls_and_token(secured):
    data_dir, _ = secured
    written = asyncio.run(write_ledgers(read_client(data_dir), count=1))
    (lid, payloads), = written.items()
    listed = pybk("shell", "listledgers", "--data-dir", data_dir, "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert lid in [row["ledger_id"] for row in json.loads(listed.stdout)]
    read = pybk("shell", "readledger", lid, "--password", PASSWORD.decode(), "--data-dir", data_dir, "-o", "json")
    assert read.returncode == 0, read.stderr
    assert [e["payload_text"].encode() for e in json.loads(read.stdout)["entries"]] == payloads
    bookies = pybk("shell", "listbookies", "--info", "--data-dir", data_dir, "-o", "json")
    assert bookies.returncode == 0, bookies.stderr
    assert [(b["id"], b["state"], b["info"].get("bookie_id")) for b in json.loads(bookies.stdout)] == [
        (f"bookie-{i}", "writable", f"bookie-{i}") for i in range(3)]


def test_the_shell_acts_as_a_reader_with_the_reader_token_from_the_environment(secured):
    data_dir, _ = secured
    security = LocalSecurity.of(data_dir)
    reader = {"PYBK_TOKEN_FILE": str(security.token_file(Role.READER)),
              "PYBK_TLS_CERT": str(security.identity(Identity.READER).cert),
              "PYBK_TLS_KEY": str(security.identity(Identity.READER).key)}
    written = asyncio.run(write_ledgers(read_client(data_dir), count=1))
    (lid, payloads), = written.items()
    read = pybk("shell", "readledger", lid, "--password", PASSWORD.decode(), "--data-dir", data_dir, "-o", "json",
                env=reader)
    assert read.returncode == 0, read.stderr
    assert len(json.loads(read.stdout)["entries"]) == len(payloads)
    test = pybk("shell", "simpletest", "-n", "3", "--data-dir", data_dir, env=reader)
    assert test.returncode == 1
    assert "PERMISSION_DENIED" in test.stderr and "needs role writer" in test.stderr, test.stderr


def test_simpletest_gives_its_ledger_a_password_and_the_library_refuses_one_without(secured):
    """A secured cluster's ledgers all have passwords: simpletest makes one up (shown only when the
    ledger is kept), and a library client with the cluster's settings refuses to create a ledger
    without one."""
    from pybk.client import BookKeeper, InsecureLedgerError
    data_dir, _ = secured
    test = pybk("shell", "simpletest", "-n", "5", "--data-dir", data_dir, "-o", "json")
    assert test.returncode == 0, test.stderr
    assert json.loads(test.stdout)["deleted"] and "password" not in json.loads(test.stdout)
    kept = pybk("shell", "simpletest", "-n", "5", "--keep", "--data-dir", data_dir, "-o", "json")
    assert kept.returncode == 0, kept.stderr
    result = json.loads(kept.stdout)
    assert len(result["password"]) >= 32 and not result["password"].startswith("-"), "pasted after --password"
    read = pybk("shell", "readledger", result["ledger_id"], "--password", result["password"], "--data-dir", data_dir,
                "-o", "json")
    assert read.returncode == 0 and len(json.loads(read.stdout)["entries"]) == 5, read.stderr
    wrong = pybk("shell", "readledger", result["ledger_id"], "--data-dir", data_dir)
    assert wrong.returncode == 1 and f"wrong password for ledger {result['ledger_id']}" in wrong.stderr

    async def create_without_password() -> str:
        cluster = read_client(data_dir)
        async with await BookKeeper.connect(cluster.metadata_uri, security=cluster.security) as bk:
            with pytest.raises(InsecureLedgerError) as refused:
                await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2)
            return str(refused.value)
    assert asyncio.run(create_without_password()).startswith("refusing to create a ledger without a password")


async def test_bookies_refuse_a_client_without_a_token(secured):
    from pybk.client.bookie_client import BookieAccessDeniedError, BookieClient, BookieUnavailableError
    data_dir, doc = secured
    cluster = read_client(data_dir)
    written = await write_ledgers(cluster, count=1)
    (lid, payloads), = written.items()
    grpc = doc["bookies"][0]["grpc"]
    anonymous = await BookieClient.connect(grpc, security=ClientSecurity(tls_ca=cluster.security.tls_ca))
    try:
        with pytest.raises(BookieAccessDeniedError) as denied:
            await anonymous.read(lid, 0)
        assert denied.value.grpc_code.name == "UNAUTHENTICATED" and "no credential" in str(denied.value)
    finally:
        await anonymous.close()
    plaintext = await BookieClient.connect(grpc)
    try:
        with pytest.raises(BookieUnavailableError):
            await plaintext.read(lid, 0)
    finally:
        await plaintext.close()
    assert await read_back(cluster, written) == written


async def _list_ledgers(uri: str) -> list[int]:
    from pybk.meta import MetadataStore
    store = await asyncio.wait_for(MetadataStore.connect(uri), 30)
    try:
        return [lid async for lid in store.ledgers.list()]
    finally:
        await store.close()


async def test_etcd_refuses_a_client_without_credentials(secured):
    from pybk.meta.errors import MetadataAuthError, MetadataUnavailableError
    data_dir, doc = secured
    base = doc["metadata_service_uri"].partition("?")[0]
    ca = LocalSecurity.of(data_dir).ca_cert
    with pytest.raises(MetadataAuthError, match="requires authentication.*no user in the URI"):
        await _list_ledgers(f"{base}?tls_ca={ca}&timeout=3")
    with pytest.raises(MetadataUnavailableError, match="does it require TLS"):
        await _list_ledgers(f"{base}?timeout=3")
    # the read-only etcd user lists what the read-write one does
    assert await _list_ledgers(doc["read_only_metadata_service_uri"]) == await _list_ledgers(doc["metadata_service_uri"])


async def test_a_ledger_left_open_is_recovered_with_every_acked_entry(secured):
    data_dir, _ = secured
    cluster = read_client(data_dir)
    written = await write_ledgers(cluster, count=1, leave_open=True)
    assert await read_back(cluster, written, recovery=True) == written
    from pybk.meta import MetadataStore
    store = await MetadataStore.connect(cluster.metadata_uri)
    try:
        (lid, payloads), = written.items()
        md = await store.ledgers.get(lid)
        assert md.is_closed and md.last_entry_id == len(payloads) - 1
    finally:
        await store.close()


def _lose(bookie: dict) -> None:
    """Lose a local bookie for good, as a node with its disk: its dirs go, then its process (kill
    -9). The supervisor starts it again, as Kubernetes would, but with empty dirs it refuses to
    start (its cookie in etcd names data it no longer has) and never registers."""
    import shutil
    for d in [bookie["journal_dir"], *bookie["ledger_dirs"]]:
        shutil.rmtree(d)
    os.killpg(bookie["pid"], signal.SIGKILL)


async def _referencing(cluster: LocalClient, ledgers: list[int], bookie_id: str) -> list[int]:
    from pybk.meta import MetadataStore
    store = await MetadataStore.connect(cluster.metadata_uri)
    try:
        return [lid for lid in ledgers
                if any(bookie_id in f.bookies for f in (await store.ledgers.get(lid)).fragments)]
    finally:
        await store.close()


async def test_autorecovery_replaces_a_lost_bookie_with_security_on(tmp_path, child_processes):
    env = {"PYBK_LOST_BOOKIE_DELAY": "1", "PYBK_OPEN_LEDGER_GRACE": "1", "PYBK_RECOVERY_POLL_INTERVAL": "0.2"}
    data_dir = tmp_path / "d"
    with control.detached(manifest(tmp_path, 4), data_dir, env=env, secure=True) as doc:
        cluster = read_client(data_dir)
        written = await write_ledgers(cluster, count=4, leave_open=True)
        victim = [b for b in doc["bookies"] if await _referencing(cluster, list(written), b["id"])][0]
        _lose(victim)
        async def moved_off() -> bool:
            return await _referencing(cluster, list(written), victim["id"]) == []
        await eventually(moved_off, timeout=120, what=f"autorecovery to move every ledger off {victim['id']}")
        assert await read_back(cluster, written, recovery=True) == written


def test_decommission_drains_a_bookie_with_security_on(tmp_path, child_processes):
    data_dir = tmp_path / "d"
    with control.detached(manifest(tmp_path, 4), data_dir, env={"PYBK_OPEN_LEDGER_GRACE": "1"}, secure=True):
        cluster = read_client(data_dir)
        written = asyncio.run(write_ledgers(cluster, count=6, leave_open=True))
        assert asyncio.run(_referencing(cluster, list(written), "bookie-3")), "no ledger on bookie-3 to drain"
        down = pybk("local", "apply", "-f", manifest(tmp_path, 3), "--data-dir", data_dir, "--timeout", "240")
        assert down.returncode == 0, down.stdout + down.stderr
        assert [b["id"] for b in read_local_json(data_dir)["bookies"]] == ["bookie-0", "bookie-1", "bookie-2"]
        assert asyncio.run(_referencing(cluster, list(written), "bookie-3")) == []
        # opening with recovery closes the open ledger at its last acknowledged entry
        assert asyncio.run(read_back(cluster, written, recovery=True)) == written


def test_secure_on_a_data_dir_started_insecure_is_refused(tmp_path, child_processes):
    data_dir = tmp_path / "d"
    with control.detached(manifest(tmp_path, 3, autorecovery=0), data_dir):
        pass
    up = pybk("local", "up", "-f", manifest(tmp_path, 3, autorecovery=0), "--data-dir", data_dir, "--secure",
              "--detach")
    assert up.returncode == 1
    assert "--secure refused" in up.stderr and "started without --secure" in up.stderr
    assert not (data_dir / "security").exists() and not (data_dir / "local.json").exists()


def test_a_secure_data_dir_stays_secure_and_keeps_its_ca_when_started_again(tmp_path, child_processes):
    data_dir = tmp_path / "d"
    path = manifest(tmp_path, 3, autorecovery=0)
    with control.detached(path, data_dir, secure=True):
        ca = LocalSecurity.of(data_dir).ca_cert.read_bytes()
        written = asyncio.run(write_ledgers(read_client(data_dir), count=1))
    with control.detached(path, data_dir) as doc:  # no --secure: remembered
        assert "security" in doc and LocalSecurity.of(data_dir).ca_cert.read_bytes() == ca
        assert asyncio.run(read_back(read_client(data_dir), written)) == written


def test_gc_jobs_deletes_others_ledgers_only_as_an_admin(secured):
    data_dir, _ = secured
    security = LocalSecurity.of(data_dir)
    writer = {"PYBK_TOKEN_FILE": str(security.token_file(Role.WRITER)),
              "PYBK_TLS_CERT": str(security.identity(Identity.WRITER).cert),
              "PYBK_TLS_KEY": str(security.identity(Identity.WRITER).key)}
    refused = pybk("shell", "gc-jobs", "--grace", "0", "--data-dir", data_dir, env=writer)
    assert refused.returncode == 1
    assert "gc-jobs deletes ledgers without their passwords: it needs the admin role" in refused.stderr
    assert "role writer" in refused.stderr, refused.stderr
    dry = pybk("shell", "gc-jobs", "--dry-run", "--data-dir", data_dir, "-o", "json", env=writer)
    assert dry.returncode == 0 and json.loads(dry.stdout)["dry_run"] is True, dry.stderr
    admin = pybk("shell", "gc-jobs", "--data-dir", data_dir, "-o", "json")
    assert admin.returncode == 0 and json.loads(admin.stdout)["errors"] == {}, admin.stderr

"""`BookKeeper`: the client's entry point. Creates, opens, deletes and lists ledgers, and keeps
one connection per bookie, shared by every handle."""
from __future__ import annotations

import asyncio
import logging
import weakref
from dataclasses import dataclass
from typing import AsyncIterator, Mapping

from pybk.client.bookie_client import BookieClient
from pybk.entry import DigestType, key_check, master_key, password_hash
from pybk.meta import LedgerMetadata, MetadataStore
from pybk.meta.errors import NoSuchLedgerError as MetaNoSuchLedger
from pybk.security.settings import ClientSecurity
from pybk.security.roles import Operation, Role, allowed

from . import placement, quorum
from .errors import (BookieUnavailableError, InsecureLedgerError, InvalidLedgerConfigError, NoSuchLedgerError,
                     NotEnoughBookiesError, UnauthorizedError)
from .handle import LedgerHandle
from .recovery import recover

log = logging.getLogger("pybk.client")


@dataclass
class ClientOptions:
    """Timing knobs of the protocol; the defaults suit a LAN."""

    add_timeout: float = 10.0             # an add unanswered this long triggers an ensemble change
    read_timeout: float = 10.0            # give up on one replica's read after this long
    speculative_read_delay: float = 0.05  # ask the next replica if the first is this slow
    explicit_lac_delay: float = 0.0       # after adds go idle, tell bookies the LAC this soon (0: at once)
    tail_hold_delay: float = 0.002        # a lone add's copies beyond Qa wait for its ack at most this long
    fence_timeout: float = 10.0           # recovery waits this long for fencing coverage
    recovery_batch_size: int = 256        # at most this many entries recovery reads, then re-writes, at once


def delete_refusal(ledger_id: int, stored_hash: bytes, password: bytes | None, force: bool,
                   role: Role | None) -> str:
    """Why a delete is refused ("" if allowed): the password must match the stored hash, unless
    `force`, which needs a `role` that may administer (`role` None: unknown)."""
    if force:
        if role is not None and allowed(role, Operation.ADMINISTER):
            return ""
        return (f"deleting ledger {ledger_id} with force (without its password) needs the admin role; "
                f"bookies take this client for role {role if role is not None else 'unknown'}")
    if password is None:
        return f"deleting ledger {ledger_id} needs its password (or force, as an admin)"
    if password_hash(password) != stored_hash:
        return f"wrong password for ledger {ledger_id}: not deleted"
    return ""


def public_key_refusal(password: bytes | None, security: ClientSecurity) -> str:
    """Why a ledger may not be created with this password ("" if it may): with security on (the
    client has TLS or credentials), no password would give the ledger the empty password's master
    key, which anyone can compute, and so let every caller with the writer role add to it and
    fence it. Without security anyone may do anything anyway, and no password stays allowed."""
    if password or not security.secured:
        return ""
    return ("refusing to create a ledger without a password: with security on, its master key would be "
            "the empty password's, which anyone can compute, so any caller with the writer role could add "
            "to the ledger and fence it")


class BookKeeper:
    """A connection to a pybk cluster (metadata store + bookies)."""

    def __init__(self, store: MetadataStore, options: ClientOptions | None = None,
                 security: ClientSecurity | None = None):
        self.store = store
        self.options = options or ClientOptions()
        self.security = security if security is not None else ClientSecurity.from_env()
        self._addresses: dict[str, str] = {}
        self._clients: dict[str, asyncio.Future] = {}
        self._handles: weakref.WeakSet = weakref.WeakSet()
        self.digest_mismatches = 0

    @classmethod
    async def connect(cls, uri: str, options: ClientOptions | None = None,
                      security: ClientSecurity | None = None) -> "BookKeeper":
        """Connect to the metadata service at `uri` (etcd://host:port[,host:port]/prefix). Bookies
        are called with `security` (TLS files, token file), by default `ClientSecurity.from_env()`
        (the client variables of pybk.security.settings.ENV)."""
        return cls(await MetadataStore.connect(uri), options, security)

    async def __aenter__(self) -> "BookKeeper":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every bookie connection and the metadata session. Write handles still open
        stop where they are (their ledgers stay OPEN, as after a crash: recovery closes them)."""
        for h in list(self._handles):
            h._abandon()
        clients, self._clients = self._clients, {}
        for fut in clients.values():
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                try:
                    await fut.result().close()
                except Exception:
                    pass
            else:
                fut.cancel()
        await self.store.close()

    # ---- ledgers ------------------------------------------------------------------------

    async def create_ledger(self, ensemble: int | None = None, write_quorum: int | None = None,
                            ack_quorum: int | None = None, digest: DigestType = DigestType.CRC32C,
                            password: bytes | None = None, metadata: Mapping[str, bytes] | None = None
                            ) -> LedgerHandle:
        """Create a ledger on `ensemble` bookies chosen by placement; returns its write handle.
        Without an ensemble, the cluster's stored ledger defaults apply (E/Qw/Qa, for the quorums
        not given; none stored: E 3). Otherwise `write_quorum` defaults to `ensemble` and
        `ack_quorum` to `write_quorum`. Its metadata keeps one-way hashes of the password and of
        the master key, never the key: bookies verify the key with it, autorecovery repairs the
        ledger with its admin role. With security on (this client has TLS or credentials) a
        password is required (InsecureLedgerError): without one the master key is public."""
        refusal = public_key_refusal(password, self.security)
        if refusal:
            raise InsecureLedgerError(f"{refusal}\npass password=: a long random secret, which whoever reads or "
                                      f"deletes the ledger needs too")
        password = password or b""
        if ensemble is None:
            stored = await self.store.cluster.ledger_defaults()
            ensemble, qw, qa = stored.geometry() if stored is not None else (3, 3, 3)
            write_quorum = min(qw, ensemble) if write_quorum is None else write_quorum
            ack_quorum = min(qa, write_quorum) if ack_quorum is None else ack_quorum
        write_quorum = ensemble if write_quorum is None else write_quorum
        ack_quorum = write_quorum if ack_quorum is None else ack_quorum
        try:
            quorum.validate(ensemble, write_quorum, ack_quorum)
        except ValueError as e:
            raise InvalidLedgerConfigError(str(e)) from None
        custom = dict(metadata or {})
        for k, v in custom.items():
            if not isinstance(k, str) or not isinstance(v, (bytes, bytearray)):
                raise InvalidLedgerConfigError(f"custom metadata must map str to bytes, got {k!r}: {type(v).__name__}")
        try:
            bookies = placement.choose_ensemble(await self.writable_bookies(), ensemble)
        except NotEnoughBookiesError as e:
            readonly = len(await self.store.registry.readonly())
            if not readonly:
                raise
            raise NotEnoughBookiesError(e.needed, e.found, f"{readonly} more registered read-only: disk past its "
                                        "high water mark, draining, or journal failed") from None
        md = await self.store.ledgers.create(
            bookies, write_quorum, ack_quorum, digest_type=digest, password_hash=password_hash(password),
            custom=custom, ensemble_size=ensemble, key_check=key_check(master_key(password)))
        lh = LedgerHandle(self, md, password, writable=True)
        self._handles.add(lh)
        await lh._connect_ensemble()
        return lh

    async def open_ledger(self, ledger_id: int, password: bytes = b"", recovery: bool = True) -> LedgerHandle:
        """Open a ledger for reading. With recovery (the default) an open ledger is fenced,
        recovered and closed first; without, the handle tails it up to the LAC."""
        md = await self.ledger_metadata(ledger_id)
        if md.password_hash != password_hash(password):
            raise UnauthorizedError(f"wrong password for ledger {ledger_id}")
        if recovery and not md.is_closed:
            md = await recover(self, md, password)
        lh = LedgerHandle(self, md, password, writable=False)
        if not md.is_closed:
            try:
                await lh.read_last_add_confirmed()
            except Exception as e:  # a tailing reader still opens; it learns the LAC later
                log.info("ledger %d: could not read the LAC on open: %s", ledger_id, e)
        return lh

    async def delete_ledger(self, ledger_id: int, password: bytes | None = None, force: bool = False) -> None:
        """Delete a ledger's metadata; bookies garbage-collect its entries later. The password
        must match the ledger's (UnauthorizedError otherwise); `force` deletes without it, which
        needs the admin role, proven by asking a bookie who this client is (`caller_role`)."""
        role = await self.caller_role() if force else None
        md = await self.ledger_metadata(ledger_id)
        refusal = delete_refusal(ledger_id, md.password_hash, password, force, role)
        if refusal:
            raise UnauthorizedError(refusal)
        try:
            await self.store.ledgers.delete(ledger_id)  # the password hash never changes
        except MetaNoSuchLedger:
            raise NoSuchLedgerError(ledger_id) from None

    async def caller_role(self) -> Role:
        """The role bookies give this client (asked of one registered bookie's Info)."""
        errors = []
        for bookie_id in sorted(await self.writable_bookies()) or sorted(await self.store.registry.readonly()):
            try:
                return Role.parse((await (await self.client(bookie_id)).info())["caller_role"])
            except (BookieUnavailableError, ValueError) as exc:
                errors.append(f"{bookie_id}: {exc}")
        raise BookieUnavailableError("cannot tell this client's role: no bookie answered who it is"
                                     + (f" ({'; '.join(errors)})" if errors else " (none is registered)"))

    async def list_ledgers(self) -> AsyncIterator[int]:
        """Ids of all ledgers, in order."""
        async for lid in self.store.ledgers.list():
            yield lid

    async def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        """The ledger's current metadata (`pybk.meta.LedgerMetadata`)."""
        try:
            return await self.store.ledgers.get(ledger_id)
        except MetaNoSuchLedger:
            raise NoSuchLedgerError(ledger_id) from None

    # ---- bookies ------------------------------------------------------------------------

    async def writable_bookies(self) -> dict[str, str | None]:
        """{bookie id: zone} of the writable bookies; also refreshes the address cache."""
        infos = await self.store.registry.writable()
        self._learn_addresses(infos)
        return {bid: (info.zone or None) for bid, info in infos.items()}

    async def address(self, bookie_id: str) -> str:
        """Where a bookie listens for gRPC (host:port), from its registration; BookieUnavailableError
        for one that is not registered."""
        addr = self._addresses.get(bookie_id)
        if addr is None:
            await self.writable_bookies()
            self._learn_addresses(await self.store.registry.readonly())
            addr = self._addresses.get(bookie_id)
        if addr is None:
            raise BookieUnavailableError(f"bookie {bookie_id} is not registered (down?)")
        return addr

    def _learn_addresses(self, infos: Mapping) -> None:
        """Remember where bookies listen; a bookie that moved gets a new connection."""
        for bid, info in infos.items():
            if self._addresses.get(bid, info.grpc) != info.grpc:
                moved = self._clients.pop(bid, None)
                if moved is not None and moved.done() and not moved.cancelled() and moved.exception() is None:
                    asyncio.ensure_future(moved.result().close())
            self._addresses[bid] = info.grpc

    def cached_client(self, bookie_id: str):
        """The connected client of a bookie, or None if there is none yet."""
        fut = self._clients.get(bookie_id)
        if fut is not None and fut.done() and not fut.cancelled() and fut.exception() is None:
            return fut.result()
        return None

    async def client(self, bookie_id: str):
        """The (shared) BookieClient of a bookie; raises BookieUnavailableError."""
        fut = self._clients.get(bookie_id)
        if fut is None or (fut.done() and (fut.cancelled() or fut.exception() is not None)):
            async def connect():
                return await BookieClient.connect(await self.address(bookie_id), security=self.security)
            fut = self._clients[bookie_id] = asyncio.ensure_future(connect())
        try:
            return await asyncio.shield(fut)
        except BookieUnavailableError:
            raise
        except Exception as e:
            raise BookieUnavailableError(f"cannot connect to bookie {bookie_id}: {e}") from e

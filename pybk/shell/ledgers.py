"""`pybk shell` commands on ledgers: listledgers, ledgermetadata, readledger, simpletest, delete."""
from __future__ import annotations

import argparse
import asyncio
import base64
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from pybk.ledger import fragment_ranges

from .core import Shell, ShellError, command
from .format import bytes_json, ctime_text, entry_json, format_table, last_text, payload_preview


def _ledger_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a ledger id: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"ledger ids are non-negative, got {value}")
    return value


def password_arg(text: str) -> bytes:
    return text.encode("utf-8")


def _enum_name(v: Any) -> Any:
    return getattr(v, "name", v)


def fragments_json(md: Any) -> list[dict[str, Any]]:
    """Fragments with their entry ranges (`pybk.ledger.fragment_ranges`); the last one ends at
    last_entry_id when the ledger is closed, None while it is open."""
    out = [{"first_entry_id": first, "last_entry_id": last, "bookies": list(f.bookies)}
           for f, (first, last) in zip(md.fragments, fragment_ranges(md.fragments, md.last_entry_id))]
    if out and _enum_name(md.state) != "CLOSED":
        out[-1]["last_entry_id"] = None
    return out


def ledger_json(md: Any) -> dict[str, Any]:
    """Ledger metadata as JSON; never includes the password hash, the key check, nor a legacy
    master key."""
    digest = md.digest_type
    return {
        "ledger_id": md.ledger_id,
        "state": _enum_name(md.state),
        "ensemble_size": md.ensemble_size,
        "write_quorum": md.write_quorum,
        "ack_quorum": md.ack_quorum,
        "last_entry_id": md.last_entry_id,
        "length": md.length,
        "digest_type": getattr(digest, "value", digest),
        "ctime_ms": md.ctime_ms,
        "custom": {k: bytes_json(v) for k, v in (md.custom or {}).items()},
        "fragments": fragments_json(md),
        "version": md.version,
    }


def render_ledger(d: dict[str, Any], args: Any = None) -> str:
    """ledger_json for people: the fields, then a table of fragments."""
    custom = {k: payload_preview(base64.b64decode(v)) for k, v in d["custom"].items()}
    lines = [
        f"ledger {d['ledger_id']}",
        f"  state:        {d['state']}",
        f"  E/Qw/Qa:      {d['ensemble_size']}/{d['write_quorum']}/{d['ack_quorum']}",
        f"  last entry:   {last_text(d['last_entry_id'])}",
        f"  length:       {d['length']} bytes",
        f"  digest:       {d['digest_type']}",
        f"  created:      {ctime_text(d['ctime_ms'])}",
        f"  version:      {d['version']}",
        f"  custom:       {', '.join(f'{k}={v}' for k, v in custom.items()) or '-'}",
        "  fragments:",
    ]
    table = format_table(["first entry", "last entry", "bookies"],
                         [[f["first_entry_id"], last_text(f["last_entry_id"]) if f["last_entry_id"] is not None
                           else "(open)", ", ".join(f["bookies"])] for f in d["fragments"]])
    return "\n".join(lines + ["    " + line for line in table.splitlines()])


# -- listledgers ------------------------------------------------------------------------------

def _render_ledgers(rows: list[dict[str, Any]], args: Any = None) -> str:
    if rows and set(rows[0]) == {"ledger_id"}:
        return "\n".join(str(r["ledger_id"]) for r in rows)
    if getattr(args, "job", None):
        return format_table(["ledger", "partition", "job state", "visible", "state", "last entry", "length", "created"],
                            [[r["ledger_id"], r["job"]["partition"], r["job"]["state"],
                              "yes" if r["job"]["visible"] else "no", r["state"], last_text(r["last_entry_id"]),
                              r["length"], ctime_text(r["ctime_ms"])] for r in rows],
                            empty=f"no ledgers of job {args.job}")
    return format_table(["ledger", "state", "E/Qw/Qa", "last entry", "length", "fragments", "created", "write job"],
                        [[r["ledger_id"], r["state"], f"{r['ensemble_size']}/{r['write_quorum']}/{r['ack_quorum']}",
                          last_text(r["last_entry_id"]), r["length"], len(r["fragments"]), ctime_text(r["ctime_ms"]),
                          _job_text(r.get("job"))] for r in rows], empty="no ledgers")


def _job_text(job: dict[str, Any] | None) -> str:
    """A job ledger's write job in one cell: its id, partition, own state and, while pending, the
    job's outcome (a crashed job's ledgers stay pending and undecided until gc-jobs settles them)."""
    if job is None:
        return "-"
    text = f"{job['id']} p{job['partition']} {job['state']}"
    return text + (f" ({job['outcome']})" if job["state"] == "pending" else "")


def _listledgers_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ids-only", action="store_true",
                   help="print only ledger ids (skips reading each ledger's metadata)")
    p.add_argument("--job", metavar="JOB_ID",
                   help="only the ledgers a write job (e.g. a Spark write's jobId) created, with their commit state")


def _job_fields(job_id: str, md: Any, outcome: str) -> dict[str, Any]:
    """The `job` part of a ledger a write job created: its id, partition, the job's outcome and
    the ledger's own state (pending / committed)."""
    from pybk.meta import job_commit as commit
    state = commit.state_of(md.custom)
    return {"id": job_id, "partition": commit.partition_of(md.custom), "outcome": outcome,
            "state": state.value if state is not None else "unmarked"}


async def _job_ledgers(store: Any, job_id: str) -> list[dict[str, Any]]:
    """ledger_json of every ledger the job created, each with a `job` part that also says whether
    readers see it (the job's record decides)."""
    from pybk.meta import job_commit as commit, job_gc as gc
    record = await store.jobs.get(job_id)  # also refuses a malformed job id
    outcome = record.outcome.value if record is not None else "undecided"
    return [{**ledger_json(md), "job": {**_job_fields(job_id, md, outcome),
                                         "visible": commit.visible(md.ledger_id, md.custom, record)}}
            async for md in gc.tagged(store, job_id)]


async def _job_part(store: Any, md: Any, outcomes: dict[str, str]) -> dict[str, Any]:
    """{"job": ...} for a ledger a write job created (each job's record read once), else {}."""
    from pybk.meta import job_commit as commit
    job = commit.job_of(md.custom or {})
    if job is None:
        return {}
    if job not in outcomes:
        from pybk.meta.errors import BadMetadataError
        try:
            record = await store.jobs.get(job)
            outcomes[job] = record.outcome.value if record is not None else "undecided"
        except BadMetadataError:   # not a job id a write job gives: someone else's custom metadata
            outcomes[job] = "unknown"
    return {"job": _job_fields(job, md, outcomes[job])}


@command("listledgers", "list ledgers with their state and size", _listledgers_args, _render_ledgers)
async def listledgers(sh: Shell, args: argparse.Namespace) -> list[dict[str, Any]]:
    store = await sh.store()
    await store.cluster.require()  # a wrong prefix is an error, not "no ledgers"
    if args.job:
        return await _job_ledgers(store, args.job)
    if args.ids_only:
        return [{"ledger_id": lid} async for lid in store.ledgers.list()]
    outcomes: dict[str, str] = {}
    rows = []
    async for md in store.ledgers.list_metadata():
        rows.append({**ledger_json(md), **await _job_part(store, md, outcomes)})
    return rows


# -- ledgermetadata ---------------------------------------------------------------------------

def _id_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("ledger_id", type=_ledger_id, metavar="LEDGER_ID", help="the ledger's id")


@command("ledgermetadata", "show one ledger's metadata: state, quorums, fragments and their bookies",
         _id_arg, render_ledger)
async def ledgermetadata(sh: Shell, args: argparse.Namespace) -> dict[str, Any]:
    store = await sh.store()
    return ledger_json(await _get_ledger(store, args.ledger_id))


async def _get_ledger(store: Any, ledger_id: int) -> Any:
    from pybk.meta import NoSuchLedgerError
    try:
        return await store.ledgers.get(ledger_id)
    except NoSuchLedgerError:
        raise ShellError(f"ledger {ledger_id} does not exist") from None


# -- readledger -------------------------------------------------------------------------------

def _readledger_args(p: argparse.ArgumentParser) -> None:
    _id_arg(p)
    p.add_argument("--first", type=int, default=0, metavar="ENTRY", help="first entry to read (default 0)")
    p.add_argument("--last", type=int, default=None, metavar="ENTRY",
                   help="last entry to read (default: the last entry of a closed ledger, "
                        "the last add confirmed of an open one)")
    p.add_argument("--password", type=password_arg, default=b"", help="the ledger's password (default empty)")
    p.add_argument("--preview", type=int, default=60, metavar="CHARS",
                   help="characters of each payload to show in text output (default %(default)s)")


def _render_entries(d: dict[str, Any], args: Any = None) -> str:
    preview = args.preview if args is not None else 60
    head = f"ledger {d['ledger_id']}: entries {d['first']}..{last_text(d['last'])} ({len(d['entries'])} read)"
    rows = [[e["entry_id"], e["length"], payload_preview(base64.b64decode(e["payload_base64"]), preview)]
            for e in d["entries"]]
    return head + "\n" + format_table(["entry", "length", "payload"], rows, empty="(no entries in range)")


@command("readledger", "read a ledger's entries (without fencing or closing it)", _readledger_args,
         _render_entries)
async def readledger(sh: Shell, args: argparse.Namespace) -> dict[str, Any]:
    if args.first < 0:
        raise ShellError(f"--first must be >= 0, got {args.first}")
    bk = await sh.bk()
    lh = await bk.open_ledger(args.ledger_id, password=args.password, recovery=False)
    try:
        last = args.last
        if last is None:
            md = lh.metadata
            last = md.last_entry_id if md.is_closed else await lh.read_last_add_confirmed()
        entries = []
        if last >= args.first:
            async for e in lh.read_entries(args.first, last):
                entries.append(entry_json(e.entry_id, bytes(e.data)))
    finally:
        await lh.close()
    return {"ledger_id": args.ledger_id, "first": args.first, "last": last, "entries": entries}


# -- simpletest -------------------------------------------------------------------------------

def _simpletest_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-e", "--ensemble", type=int, default=3, help="ensemble size E (default %(default)s)")
    p.add_argument("-w", "--write-quorum", type=int, default=2, help="write quorum Qw (default %(default)s)")
    p.add_argument("-a", "--ack-quorum", type=int, default=2, help="ack quorum Qa (default %(default)s)")
    p.add_argument("-n", "--entries", type=int, default=100, help="entries to write (default %(default)s)")
    p.add_argument("--size", type=int, default=100, help="payload bytes per entry (default %(default)s)")
    p.add_argument("--keep", action="store_true", help="keep the test ledger instead of deleting it")
    p.add_argument("--password", type=password_arg, default=None,
                   help="password of the test ledger (default: a random one, shown only with --keep; a ledger "
                        "without a password would have a master key anyone can compute)")


def _render_simpletest(d: dict[str, Any], args: Any = None) -> str:
    return (f"simpletest OK: ledger {d['ledger_id']} (E{d['ensemble']}/Qw{d['write_quorum']}/Qa{d['ack_quorum']}): "
            f"wrote {d['entries']} entries of {d['size']} bytes in {d['write_seconds']:.3f}s, "
            f"read back and verified in {d['read_seconds']:.3f}s; "
            + ("ledger deleted" if d["deleted"] else "ledger kept")
            + (f" (its generated password: {d['password']})" if d.get("password") else ""))


@command("simpletest", "write entries to a new ledger, read them back, verify, delete it",
         _simpletest_args, _render_simpletest)
async def simpletest(sh: Shell, args: argparse.Namespace) -> dict[str, Any]:
    if not args.ensemble >= args.write_quorum >= args.ack_quorum >= 1:
        raise ShellError(f"need E >= Qw >= Qa >= 1, got E{args.ensemble}/Qw{args.write_quorum}/Qa{args.ack_quorum}")
    if args.entries < 1 or args.size < 0:
        raise ShellError("--entries must be >= 1 and --size >= 0")
    bk = await sh.bk()
    generated = args.password is None  # the test ledger gets a password of its own, as any ledger should
    # hex: a password shown to be pasted after --password must never start with "-"
    password = secrets.token_hex(24).encode() if generated else args.password
    payloads = [_sample_payload(i, args.size) for i in range(args.entries)]
    started = time.perf_counter()
    lh = await bk.create_ledger(ensemble=args.ensemble, write_quorum=args.write_quorum,
                                ack_quorum=args.ack_quorum, password=password,
                                metadata={"application": b"pybk shell simpletest"})
    ledger_id = lh.ledger_id
    try:
        futures = [lh.add_entry_async(p) for p in payloads]
        ids = list(await asyncio.gather(*futures))
        await lh.close()
        write_seconds = time.perf_counter() - started
        if ids != list(range(args.entries)):
            raise ShellError(f"ledger {ledger_id}: entry ids {ids[:5]}... are not 0..{args.entries - 1}")
        started = time.perf_counter()
        rh = await bk.open_ledger(ledger_id, password=password)
        got = [(e.entry_id, bytes(e.data)) async for e in rh.read_entries(0, args.entries - 1)]
        await rh.close()
        read_seconds = time.perf_counter() - started
        if got != list(enumerate(payloads)):
            bad = next((i for i, (g, p) in enumerate(zip(got, enumerate(payloads))) if g != p), len(got))
            raise ShellError(f"ledger {ledger_id}: read back differs from what was written at entry {bad} "
                             f"({len(got)} of {args.entries} entries read)")
    finally:
        deleted = False
        if not args.keep:
            await bk.delete_ledger(ledger_id, password)
            deleted = True
    result = {"ok": True, "ledger_id": ledger_id, "entries": args.entries, "size": args.size,
              "ensemble": args.ensemble, "write_quorum": args.write_quorum, "ack_quorum": args.ack_quorum,
              "write_seconds": write_seconds, "read_seconds": read_seconds, "deleted": deleted}
    if generated and not deleted:  # a kept ledger is read and deleted with it; a deleted one's is of no use
        result["password"] = password.decode()
    return result


def _sample_payload(i: int, size: int) -> bytes:
    """size bytes that differ per entry, so a misplaced entry is noticed."""
    unit = f"simpletest-{i:08d}-".encode()
    return (unit * (size // len(unit) + 1))[:size]


# -- delete -----------------------------------------------------------------------------------

def _delete_args(p: argparse.ArgumentParser) -> None:
    _id_arg(p)
    who = p.add_mutually_exclusive_group()
    who.add_argument("--password", type=password_arg, default=None,
                     help="the ledger's password (visible in the process list: prefer --password-file)")
    who.add_argument("--password-file", metavar="FILE",
                     help="a file holding the ledger's password (a trailing newline is ignored)")
    who.add_argument("--force", action="store_true",
                     help="delete without the password and without asking: needs the admin role")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")


def password_from_args(args: argparse.Namespace) -> bytes | None:
    """The password of --password-file or --password (None: none given); `delete` and the log
    commands take them."""
    if args.password_file:
        try:
            return Path(args.password_file).read_bytes().rstrip(b"\r\n")
        except OSError as exc:
            raise ShellError(f"cannot read the password file {args.password_file}: {exc.strerror or exc}") from None
    return args.password


@command("delete", "delete a ledger (its metadata; bookies reclaim the space on garbage collection); "
         "needs its password, or --force as an admin", _delete_args, lambda d, args: f"deleted ledger {d['ledger_id']}")
async def delete(sh: Shell, args: argparse.Namespace) -> dict[str, Any]:
    store = await sh.store()
    await _get_ledger(store, args.ledger_id)
    password = password_from_args(args)
    if password is None and not args.force:
        raise ShellError(f"deleting ledger {args.ledger_id} needs its password (--password-file or --password), "
                         f"or --force as an admin")
    if not args.force and not args.yes:
        if not sys.stdin.isatty():
            raise ShellError(f"refusing to delete ledger {args.ledger_id} without confirmation: pass --yes")
        answer = input(f"delete ledger {args.ledger_id}? this cannot be undone [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            raise ShellError("not deleted")
    bk = await sh.bk()
    await bk.delete_ledger(args.ledger_id, password, force=args.force)
    return {"ledger_id": args.ledger_id, "deleted": True}


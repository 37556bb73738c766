"""`pybk shell COMMAND`: inspect and administer a cluster.

Every command takes `--metadata-uri` (else `--data-dir` of a local cluster, else
`$PYBK_METADATA_URI`, else the default local cluster's local.json), prints a human table by
default or JSON with `-o json`, and exits non-zero on failure with a one-line reason.

Commands register themselves with `@command(...)`: a command is an async function
`(Shell, args) -> data` (JSON-able) plus a `render(data) -> str` for people. Parts that own
more commands (autorecovery) add theirs in a module named in EXTENSION_MODULES.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import importlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

EXTENSION_MODULES = ("pybk.recovery.shell",)


class ShellError(Exception):
    """A command failed in a way the user should read (printed without a traceback)."""


# ---------------------------------------------------------------------------------------------
# Pure output helpers.

def format_table(headers: list[str], rows: list[list[Any]], empty: str = "(none)") -> str:
    """Left-aligned columns under upper-case headers; `empty` when there are no rows."""
    if not rows:
        return empty
    cells = [[str(h).upper() for h in headers]] + [["" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def payload_preview(data: bytes, limit: int = 60) -> str:
    """Printable UTF-8 as text (quoted, cut at limit), anything else as hex."""
    try:
        text = data.decode("utf-8")
        if text.isprintable():
            return repr(text[:limit]) + ("..." if len(text) > limit else "")
    except UnicodeDecodeError:
        pass
    shown = data[: limit // 2].hex()
    return f"0x{shown}" + ("..." if len(data) > limit // 2 else "")


def bytes_json(data: bytes) -> str:
    """Bytes in JSON output are base64 (standard alphabet)."""
    return base64.b64encode(data).decode("ascii")


def entry_json(entry_id: int, data: bytes) -> dict[str, Any]:
    """One entry for `-o json`: id, length, base64 payload, and the text when it is UTF-8."""
    try:
        text: str | None = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {"entry_id": entry_id, "length": len(data), "payload_base64": bytes_json(data), "payload_text": text}


def _enum_name(v: Any) -> Any:
    return getattr(v, "name", v)


def fragment_ranges(md: Any) -> list[dict[str, Any]]:
    """Fragments with their entry ranges: a fragment ends where the next begins; the last one
    ends at last_entry_id when the ledger is closed (None while it is open)."""
    frags = list(md.fragments)
    closed = _enum_name(md.state) == "CLOSED"
    out = []
    for i, f in enumerate(frags):
        if i + 1 < len(frags):
            last = frags[i + 1].first_entry_id - 1
        else:
            last = md.last_entry_id if closed else None
        out.append({"first_entry_id": f.first_entry_id, "last_entry_id": last, "bookies": list(f.bookies)})
    return out


def ledger_json(md: Any) -> dict[str, Any]:
    """Ledger metadata as JSON; never includes the password hash, nor the master key (only
    whether one is stored, i.e. whether autorecovery can repair the ledger without its password)."""
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
        "fragments": fragment_ranges(md),
        "version": md.version,
        **({"master_key": "stored"} if getattr(md, "master_key", b"") else {}),
    }


def _ctime(ms: int | None) -> str:
    if not ms:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + "Z"


def _last(v: int | None) -> str:
    return "-" if v is None or v < 0 else str(v)


def render_ledger(d: dict[str, Any], args: Any = None) -> str:
    custom = {k: payload_preview(base64.b64decode(v)) for k, v in d["custom"].items()}
    lines = [
        f"ledger {d['ledger_id']}",
        f"  state:        {d['state']}",
        f"  E/Qw/Qa:      {d['ensemble_size']}/{d['write_quorum']}/{d['ack_quorum']}",
        f"  last entry:   {_last(d['last_entry_id'])}",
        f"  length:       {d['length']} bytes",
        f"  digest:       {d['digest_type']}",
        f"  created:      {_ctime(d['ctime_ms'])}",
        f"  version:      {d['version']}",
        f"  custom:       {', '.join(f'{k}={v}' for k, v in custom.items()) or '-'}",
        "  fragments:",
    ]
    table = format_table(["first entry", "last entry", "bookies"],
                         [[f["first_entry_id"], _last(f["last_entry_id"]) if f["last_entry_id"] is not None
                           else "(open)", ", ".join(f["bookies"])] for f in d["fragments"]])
    return "\n".join(lines + ["    " + line for line in table.splitlines()])


# ---------------------------------------------------------------------------------------------
# Where the cluster is.

def resolve_metadata_uri(metadata_uri: str | None, data_dir: str | None,
                         environ: dict[str, str] | None = None) -> str:
    """--metadata-uri, else --data-dir's local.json, else $PYBK_METADATA_URI, else the default
    local cluster's local.json ($PYBK_LOCAL_DIR or ./.pybk-local); ShellError if none is found."""
    env = os.environ if environ is None else environ
    if metadata_uri:
        return _check_uri(metadata_uri)
    if data_dir:
        return _uri_from_data_dir(Path(data_dir))
    if env.get("PYBK_METADATA_URI"):
        return _check_uri(env["PYBK_METADATA_URI"])
    default_dir = Path(env.get("PYBK_LOCAL_DIR") or ".pybk-local")
    if (default_dir / "local.json").exists():
        return _uri_from_data_dir(default_dir)
    raise ShellError("no cluster given: pass --metadata-uri etcd://HOST:PORT/PREFIX, set PYBK_METADATA_URI, "
                     "or --data-dir of a local cluster started with `pybk local up`")


def _check_uri(uri: str) -> str:
    if not uri.startswith("etcd://") or "/" not in uri[len("etcd://"):] or len(uri) <= len("etcd://"):
        raise ShellError(f"bad metadata service URI {uri!r}: expected etcd://HOST:PORT[,HOST:PORT]/PREFIX, "
                         "for example etcd://127.0.0.1:2379/pybk")
    return uri


def _uri_from_data_dir(data_dir: Path) -> str:
    path = data_dir / "local.json"
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ShellError(f"no local cluster in {data_dir} ({path} is missing); start one with "
                         f"`pybk local up -f examples/cluster.yaml --data-dir {data_dir}`") from None
    except (OSError, ValueError) as e:
        raise ShellError(f"cannot read {path}: {e}") from None
    uri = doc.get("metadata_service_uri")
    if not uri:
        raise ShellError(f"{path} has no metadata_service_uri")
    return _check_uri(uri)


# ---------------------------------------------------------------------------------------------
# Commands.

@dataclass
class Command:
    name: str
    help: str
    run: Callable[["Shell", argparse.Namespace], Awaitable[Any]]
    arguments: Callable[[argparse.ArgumentParser], None] | None
    render: Callable[[Any, argparse.Namespace], str]


COMMANDS: dict[str, Command] = {}


def command(name: str, help: str, arguments: Callable[[argparse.ArgumentParser], None] | None = None,
            render: Callable[[Any, argparse.Namespace], str] = lambda data, args: json.dumps(data, indent=2)):
    """Register an async command `(shell, args) -> data` under name; `render(data, args)` is its
    text output, and `-o json` prints data itself."""
    def deco(fn: Callable[["Shell", argparse.Namespace], Awaitable[Any]]):
        COMMANDS[name] = Command(name, help, fn, arguments, render)
        return fn
    return deco


class Shell:
    """Connections a command needs, opened on first use and closed at the end."""

    def __init__(self, metadata_uri: str):
        self.metadata_uri = metadata_uri
        self._store = None
        self._bk = None

    async def store(self):
        """The metadata store (pybk.meta.MetadataStore)."""
        if self._store is None:
            from pybk.meta import MetadataStore
            self._store = await MetadataStore.connect(self.metadata_uri)
        return self._store

    async def bk(self):
        """The ledger client (pybk.client.BookKeeper)."""
        if self._bk is None:
            from pybk.client import BookKeeper
            self._bk = await BookKeeper.connect(self.metadata_uri)
        return self._bk

    async def close(self) -> None:
        if self._bk is not None:
            await self._bk.close()
        if self._store is not None:
            await self._store.close()


def _ledger_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a ledger id: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"ledger ids are non-negative, got {value}")
    return value


def _password(text: str) -> bytes:
    return text.encode("utf-8")


# -- listbookies ------------------------------------------------------------------------------

def human_bytes(n: int | None) -> str:
    """1536 -> '1.5 KiB'."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def _render_bookies(rows: list[dict[str, Any]], args: Any = None) -> str:
    headers = ["bookie", "state", "grpc", "http", "zone", "rack", "version"]
    with_info = bool(rows) and "info" in rows[0]
    if with_info:
        headers += ["ledgers", "disk free", "disk total"]
    table = []
    for b in rows:
        row = [b["id"], b["state"], b["grpc"], b["http"], b["zone"] or "-", b["rack"] or "-", b["version"] or "-"]
        if with_info:
            info = b["info"]
            row += (["unreachable", "", ""] if "error" in info else
                    [info["ledger_count"], human_bytes(info["free_bytes"]), human_bytes(info["total_bytes"])])
        table.append(row)
    return format_table(headers, table, empty="no bookies registered")


def bookie_json(info: Any, state: str) -> dict[str, Any]:
    return {"id": info.bookie_id, "state": state, "grpc": info.grpc, "http": info.http,
            "zone": info.zone or None, "rack": info.rack or None, "version": info.version or None}


def _listbookies_args(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group()
    which.add_argument("--readwrite", "-rw", action="store_true", help="only writable bookies")
    which.add_argument("--readonly", "-ro", action="store_true", help="only read-only bookies")
    p.add_argument("-i", "--info", action="store_true",
                   help="also ask each bookie for its ledger count and disk space (gRPC Info)")


@command("listbookies", "list registered bookies (writable and read-only)", _listbookies_args, _render_bookies)
async def listbookies(sh: Shell, args: argparse.Namespace) -> list[dict[str, Any]]:
    store = await sh.store()
    rows = []
    if not args.readonly:
        rows += [bookie_json(i, "writable") for i in (await store.registry.writable()).values()]
    if not args.readwrite:
        rows += [bookie_json(i, "readonly") for i in (await store.registry.readonly()).values()]
    rows.sort(key=lambda b: b["id"])
    if args.info:
        infos = await asyncio.gather(*(_bookie_info(b["grpc"]) for b in rows))
        for b, info in zip(rows, infos):
            b["info"] = info
    return rows


async def _bookie_info(address: str) -> dict[str, Any]:
    """The bookie's Info answer, or {"error": ...} when it does not answer."""
    from pybk.bookie.client import BookieClient
    try:
        c = await asyncio.wait_for(BookieClient.connect(address), 10)
        try:
            return await asyncio.wait_for(c.info(), 10)
        finally:
            await c.close()
    except Exception as e:  # a bookie that does not answer is shown as such, not a failure of the listing
        return {"error": f"{type(e).__name__}: {e}"}


# -- listledgers ------------------------------------------------------------------------------

def _render_ledgers(rows: list[dict[str, Any]], args: Any = None) -> str:
    if rows and set(rows[0]) == {"ledger_id"}:
        return "\n".join(str(r["ledger_id"]) for r in rows)
    return format_table(["ledger", "state", "E/Qw/Qa", "last entry", "length", "fragments", "created"],
                        [[r["ledger_id"], r["state"], f"{r['ensemble_size']}/{r['write_quorum']}/{r['ack_quorum']}",
                          _last(r["last_entry_id"]), r["length"], len(r["fragments"]), _ctime(r["ctime_ms"])]
                         for r in rows], empty="no ledgers")


def _listledgers_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ids-only", action="store_true",
                   help="print only ledger ids (skips reading each ledger's metadata)")


@command("listledgers", "list ledgers with their state and size", _listledgers_args, _render_ledgers)
async def listledgers(sh: Shell, args: argparse.Namespace) -> list[dict[str, Any]]:
    store = await sh.store()
    if args.ids_only:
        return [{"ledger_id": lid} async for lid in store.ledgers.list()]
    return [ledger_json(md) async for md in store.ledgers.list_metadata()]


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
    p.add_argument("--password", type=_password, default=b"", help="the ledger's password (default empty)")
    p.add_argument("--preview", type=int, default=60, metavar="CHARS",
                   help="characters of each payload to show in text output (default %(default)s)")


def _render_entries(d: dict[str, Any], args: Any = None) -> str:
    preview = args.preview if args is not None else 60
    head = f"ledger {d['ledger_id']}: entries {d['first']}..{_last(d['last'])} ({len(d['entries'])} read)"
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
            last = md.last_entry_id if _enum_name(md.state) == "CLOSED" else await lh.read_last_add_confirmed()
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
    p.add_argument("--password", type=_password, default=b"",
                   help="password of the test ledger (default empty, which autorecovery can always use)")


def _render_simpletest(d: dict[str, Any], args: Any = None) -> str:
    return (f"simpletest OK: ledger {d['ledger_id']} (E{d['ensemble']}/Qw{d['write_quorum']}/Qa{d['ack_quorum']}): "
            f"wrote {d['entries']} entries of {d['size']} bytes in {d['write_seconds']:.3f}s, "
            f"read back and verified in {d['read_seconds']:.3f}s; "
            + ("ledger deleted" if d["deleted"] else "ledger kept"))


@command("simpletest", "write entries to a new ledger, read them back, verify, delete it",
         _simpletest_args, _render_simpletest)
async def simpletest(sh: Shell, args: argparse.Namespace) -> dict[str, Any]:
    if not args.ensemble >= args.write_quorum >= args.ack_quorum >= 1:
        raise ShellError(f"need E >= Qw >= Qa >= 1, got E{args.ensemble}/Qw{args.write_quorum}/Qa{args.ack_quorum}")
    if args.entries < 1 or args.size < 0:
        raise ShellError("--entries must be >= 1 and --size >= 0")
    bk = await sh.bk()
    password = args.password
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
            await bk.delete_ledger(ledger_id)
            deleted = True
    return {"ok": True, "ledger_id": ledger_id, "entries": args.entries, "size": args.size,
            "ensemble": args.ensemble, "write_quorum": args.write_quorum, "ack_quorum": args.ack_quorum,
            "write_seconds": write_seconds, "read_seconds": read_seconds, "deleted": deleted}


def _sample_payload(i: int, size: int) -> bytes:
    """size bytes that differ per entry, so a misplaced entry is noticed."""
    unit = f"simpletest-{i:08d}-".encode()
    return (unit * (size // len(unit) + 1))[:size]


# -- delete -----------------------------------------------------------------------------------

def _delete_args(p: argparse.ArgumentParser) -> None:
    _id_arg(p)
    p.add_argument("-f", "--force", action="store_true", help="do not ask for confirmation")


@command("delete", "delete a ledger (its metadata; bookies reclaim the space on garbage collection)",
         _delete_args, lambda d, args: f"deleted ledger {d['ledger_id']}")
async def delete(sh: Shell, args: argparse.Namespace) -> dict[str, Any]:
    store = await sh.store()
    await _get_ledger(store, args.ledger_id)
    if not args.force:
        if not sys.stdin.isatty():
            raise ShellError(f"refusing to delete ledger {args.ledger_id} without confirmation: pass --force")
        answer = input(f"delete ledger {args.ledger_id}? this cannot be undone [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            raise ShellError("not deleted")
    bk = await sh.bk()
    await bk.delete_ledger(args.ledger_id)
    return {"ledger_id": args.ledger_id, "deleted": True}


# ---------------------------------------------------------------------------------------------
# Entry point.

def _load_extensions() -> None:
    """Import the modules that add commands; one that fails to import costs only its own
    commands (with a warning), never the core ones."""
    for name in EXTENSION_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                print(f"pybk shell: warning: commands of {name} are unavailable: {e}", file=sys.stderr)
        except Exception as e:
            print(f"pybk shell: warning: commands of {name} are unavailable: {type(e).__name__}: {e}",
                  file=sys.stderr)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _load_extensions()
    common = argparse.ArgumentParser(add_help=False)
    where = common.add_argument_group("cluster")
    where.add_argument("--metadata-uri", metavar="URI",
                       help="metadata service, etcd://HOST:PORT[,HOST:PORT]/PREFIX (default: $PYBK_METADATA_URI)")
    where.add_argument("--data-dir", metavar="DIR",
                       help="use the local cluster running in DIR (reads DIR/local.json)")
    common.add_argument("-o", "--output", choices=["text", "json"], default="text",
                        help="text for people (default), json for scripts")
    sub = parser.add_subparsers(dest="shell_command", metavar="COMMAND", required=True)
    for cmd in COMMANDS.values():
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help, parents=[common])
        if cmd.arguments is not None:
            cmd.arguments(p)


def _error_text(e: BaseException) -> str:
    return str(e) or type(e).__name__


def run(args: argparse.Namespace) -> int:
    cmd = COMMANDS[args.shell_command]
    try:
        uri = resolve_metadata_uri(args.metadata_uri, args.data_dir)
        data = asyncio.run(_run(cmd, uri, args))
    except ShellError as e:
        print(f"pybk shell {cmd.name}: error: {e}", file=sys.stderr)
        return 1
    except (OSError, TimeoutError) as e:
        print(f"pybk shell {cmd.name}: error: {_error_text(e)}", file=sys.stderr)
        return 1
    except Exception as e:  # every pybk error class names what went wrong; show it, not a traceback
        if not type(e).__module__.startswith("pybk."):
            raise
        print(f"pybk shell {cmd.name}: error: {_error_text(e)}", file=sys.stderr)
        return 1
    try:
        if args.output == "json":
            print(json.dumps(data, indent=2))
        else:
            print(cmd.render(data, args))
        sys.stdout.flush()
    except BrokenPipeError:  # `pybk shell ... | head`: the reader has enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


async def _run(cmd: Command, uri: str, args: argparse.Namespace) -> Any:
    sh = Shell(uri)
    try:
        return await cmd.run(sh, args)
    finally:
        await sh.close()

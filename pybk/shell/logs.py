"""`pybk shell log ACTION`: named logs (docs/logs.md) from the command line.

    pybk shell log create orders --password-file pw --retention limits --max-age 86400
    seq 1 3 | pybk shell log append orders --password-file pw --print-offsets
    pybk shell log read orders --from 0 --to 100
    pybk shell log tail orders
    pybk shell log describe orders
    pybk shell log cursors orders --commit billing 42
    pybk shell log truncate orders --before 1000 --password-file pw --yes
    pybk shell log delete orders --password-file pw --yes

Who may call each (docs/security.md, named logs): `list`, `describe`, `read`, `tail`, `cursors`
need the `reader` role (a MAC log's readers also its password); `append` the `writer` role and
the log's password; `create` etcd write access (and a password when security is on); `cursors
--commit/--delete` etcd write access; `truncate` and `delete` the log's password, or `--force`
with the `admin` role. Records stream: `append --print-offsets` prints each offset as it is
acknowledged, `read` and `tail` print one JSON object per record per line, whatever `-o` says.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import datetime
import json
import sys
import threading
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable

from .core import Shell, ShellError, command
from .format import bytes_json, ctime_text, format_table, human_bytes
from .ledgers import password_arg, password_from_args

if TYPE_CHECKING:
    from pybk.log import LogDescription, LogRecord, Logs, PendingAppend

ACTIONS_HELP = """\
actions:
  create NAME        make a log (replication, digest, rollover, retention, password)
  list               every log's name and id
  describe NAME      segments, start and end offsets, epoch, writer, size, cursors and their lag
  append NAME        one record per line of standard input (--print-offsets: each offset once acknowledged)
  read NAME          records --from (default earliest) --to (default the end now), one JSON object per line
  tail NAME          like read, then follow new records until Ctrl-C (or --count)
  cursors NAME       list cursors with their lag; --commit CURSOR OFFSET, --delete CURSOR
  truncate NAME      delete whole closed segments below --before OFFSET (password, or --force as admin)
  delete NAME        delete the log (password, or --force as admin; not while a writer has it open)

A record printed by read and tail: {"offset", "timestamp" (ms), "key", "payload"} with key and
payload as text when they are UTF-8, else "key_base64" / "payload_base64" instead.
"""


# ---- argument helpers -------------------------------------------------------------------------

def _position(text: str) -> int | str:
    """An offset, or earliest / latest."""
    if text in ("earliest", "latest"):
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an offset, 'earliest' or 'latest': {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"offsets are non-negative, got {value}")
    return value


def _end(text: str) -> int | str:
    if text == "latest":
        return text
    value = _position(text)
    if value == "earliest":
        raise argparse.ArgumentTypeError("--to takes an offset or 'latest'")
    return value


def _time_ms(text: str) -> int:
    """Milliseconds since the epoch, or an ISO 8601 time (UTC unless it says otherwise)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        t = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a time (ms since the epoch, or ISO 8601): {text!r}") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=datetime.timezone.utc)
    return int(t.timestamp() * 1000)


def _password_args(p: argparse.ArgumentParser, force: bool = False) -> None:
    who = p.add_mutually_exclusive_group()
    who.add_argument("--password", type=password_arg, default=None,
                     help="the log's password (visible in the process list: prefer --password-file)")
    who.add_argument("--password-file", metavar="FILE",
                     help="a file holding the log's password (a trailing newline is ignored)")
    if force:
        who.add_argument("--force", action="store_true", help="without the password: needs the admin role")


def _name(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", help="the log's name")


def _cluster_args(p: argparse.ArgumentParser) -> None:
    """The shell's cluster and output options, also after the action (`log read X -o json`); left
    out of the namespace unless given, so those given before the action stand."""
    p.add_argument("--metadata-uri", metavar="URI", default=argparse.SUPPRESS,
                   help="metadata service, etcd://HOST:PORT[,HOST:PORT]/PREFIX (default: $PYBK_METADATA_URI)")
    p.add_argument("--data-dir", metavar="DIR", default=argparse.SUPPRESS,
                   help="use the local cluster running in DIR (reads DIR/local.json)")
    p.add_argument("-o", "--output", choices=["text", "json"], default=argparse.SUPPRESS,
                   help="text for people (default), json for scripts")


def _log_args(p: argparse.ArgumentParser) -> None:
    p.epilog = ACTIONS_HELP
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = p.add_subparsers(dest="log_action", metavar="ACTION", required=True)

    c = sub.add_parser("create", help="make a log", description="make a log (its configuration is stored once)")
    _name(c)
    _password_args(c)
    c.add_argument("-e", "--ensemble", type=int, default=3, help="ensemble size E of its segments (default 3)")
    c.add_argument("-w", "--write-quorum", type=int, default=3, help="write quorum Qw (default 3)")
    c.add_argument("-a", "--ack-quorum", type=int, default=2, help="ack quorum Qa (default 2)")
    c.add_argument("--digest", choices=["crc32c", "mac"], default="crc32c",
                   help="entry digest (default crc32c; mac signs entries with the password, so readers need it)")
    c.add_argument("--roll-bytes", type=int, metavar="BYTES", help="roll at this segment size (default 256 MiB)")
    c.add_argument("--roll-records", type=int, metavar="N", help="roll at this many records (default: no limit)")
    c.add_argument("--roll-age", type=float, metavar="SECONDS", help="roll a segment this old (default 4 h)")
    c.add_argument("--roll-idle", type=float, metavar="SECONDS",
                   help="roll a segment without appends this long (default 1 h)")
    c.add_argument("--retention", choices=["none", "limits", "interest"], default="none",
                   help="what may be deleted by retention (default none: only truncate)")
    c.add_argument("--max-age", type=float, metavar="SECONDS", help="limits: delete segments older than this")
    c.add_argument("--max-bytes", type=int, metavar="BYTES", help="limits: keep at most this many bytes")
    c.add_argument("--max-backlog-bytes", type=int, metavar="BYTES",
                   help="interest: past this, delete even what a cursor still needs")

    sub.add_parser("list", help="every log's name and id")

    d = sub.add_parser("describe", help="segments, offsets, epoch, writer, size, cursors and lag")
    _name(d)
    _password_args(d)
    d.add_argument("--segments", type=int, default=20, metavar="N",
                   help="segments shown in text output, the newest (default 20; -o json shows all)")

    a = sub.add_parser("append", help="append one record per line of standard input",
                       description="append one record per line of standard input (the line break is not "
                                   "part of the record); needs the log's password and the writer role")
    _name(a)
    _password_args(a)
    a.add_argument("--print-offsets", action="store_true",
                   help="print each record's offset, one per line in input order, as soon as it is acknowledged")
    a.add_argument("--key", type=password_arg, default=None, help="the key of every record (default none)")
    a.add_argument("--linger", type=float, default=0.001, metavar="SECONDS",
                   help="send an entry this long after its first record (default 0.001)")

    for action, text in (("read", "records from --from to --to, one JSON object per line"),
                         ("tail", "records from --from (default latest), then new ones as they come")):
        r = sub.add_parser(action, help=text, description=text)
        _name(r)
        _password_args(r)
        start = r.add_mutually_exclusive_group()
        start.add_argument("--from", dest="start", type=_position, default=None, metavar="OFFSET",
                           help="first offset, or earliest / latest (default: "
                                + ("earliest)" if action == "read" else "latest)"))
        start.add_argument("--at-time", type=_time_ms, metavar="TIME",
                           help="start at the first record at or after TIME (ms since the epoch or ISO 8601)")
        start.add_argument("--cursor", metavar="CURSOR", help="start at a cursor's position")
        if action == "read":
            r.add_argument("--to", type=_end, default="latest", metavar="OFFSET",
                           help="stop before this offset (default latest: the end at the time of the call)")
        r.add_argument("--count", type=int, default=None, metavar="N", help="stop after N records")

    cu = sub.add_parser("cursors", help="list cursors with their lag; commit or delete one")
    _name(cu)
    _password_args(cu)
    change = cu.add_mutually_exclusive_group()
    change.add_argument("--commit", nargs=2, metavar=("CURSOR", "OFFSET"),
                        help="store OFFSET as the next offset of CURSOR (never backwards)")
    change.add_argument("--delete", metavar="CURSOR", help="remove a cursor")

    t = sub.add_parser("truncate", help="delete whole closed segments below an offset")
    _name(t)
    _password_args(t, force=True)
    t.add_argument("--before", type=int, required=True, metavar="OFFSET",
                   help="delete closed segments all of whose records are below OFFSET (the start becomes "
                        "at most OFFSET)")
    t.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")

    x = sub.add_parser("delete", help="delete the log (not while a writer has it open)")
    _name(x)
    _password_args(x, force=True)
    x.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    for action in sub.choices.values():
        _cluster_args(action)


# ---- JSON forms -------------------------------------------------------------------------------

def _text_or_base64(out: dict[str, Any], field: str, data: bytes | None) -> None:
    if data is None:
        out[field] = None
        return
    try:
        out[field] = data.decode("utf-8")
    except UnicodeDecodeError:
        out[field + "_base64"] = bytes_json(data)


def record_json(rec: "LogRecord") -> dict[str, Any]:
    """One record as `read` prints it: offset, timestamp (ms), key and payload (text when UTF-8,
    else key_base64 / payload_base64)."""
    out: dict[str, Any] = {"offset": rec.offset, "timestamp": rec.timestamp}
    _text_or_base64(out, "key", rec.key)
    _text_or_base64(out, "payload", rec.payload)
    return out


def description_json(d: "LogDescription") -> dict[str, Any]:
    """`describe` for scripts: the head, offsets, size, configuration, segments and cursors. An
    OPEN segment's records are those readable now; its bytes are not known before it closes."""
    segments = []
    for s in d.segments:
        is_open = s.state.value == "OPEN"
        records = max(0, d.end_offset - s.first_offset) if is_open else s.records
        segments.append({"seq": s.seq, "ledger_id": s.ledger_id, "state": s.state.value, "epoch": s.epoch,
                         "first_offset": s.first_offset, "end_offset": s.first_offset + records,
                         "records": records, "bytes": None if is_open else s.bytes,
                         "min_timestamp": None if s.min_ts < 0 else s.min_ts,
                         "max_timestamp": None if s.max_ts < 0 else s.max_ts, "created_ms": s.created_ms})
    return {"name": d.name, "log_id": d.log_id, "epoch": d.epoch, "writer": d.writer,
            "start_offset": d.start_offset, "end_offset": d.end_offset, "records": d.end_offset - d.start_offset,
            "bytes": d.bytes, "config": d.config.to_json(), "segments": segments,
            "cursors": [{"name": c.name, "offset": c.offset, "lag": c.lag} for c in d.cursors]}


def render_description(d: dict[str, Any], shown: int = 20) -> str:
    cfg = d["config"]
    ret = cfg["retention"]
    lines = [f"log {d['name']} (id {d['log_id']})",
             f"  offsets:    {d['start_offset']} .. {d['end_offset']} ({d['records']} records)",
             f"  size:       {human_bytes(d['bytes'])} in closed segments",
             f"  epoch:      {d['epoch']}",
             f"  writer:     {d['writer'] or '- (none open)'}",
             f"  E/Qw/Qa:    {cfg['ensemble']}/{cfg['write_quorum']}/{cfg['ack_quorum']}, digest {cfg['digest']}",
             f"  retention:  {ret['policy']}" + "".join(f", {k} {v}" for k, v in ret.items()
                                                       if k != "policy" and v is not None),
             f"  segments:   {len(d['segments'])}"]
    segs = d["segments"][-shown:] if shown > 0 else []
    if len(segs) < len(d["segments"]):
        lines.append(f"    (the newest {len(segs)}; -o json shows all)")
    table = format_table(["seq", "ledger", "state", "epoch", "offsets", "records", "size", "created"],
                         [[s["seq"], s["ledger_id"], s["state"], s["epoch"], f"{s['first_offset']}..{s['end_offset']}",
                           s["records"], human_bytes(s["bytes"]), ctime_text(s["created_ms"])] for s in segs],
                         empty="(no segments)")
    lines += ["    " + ln for ln in table.splitlines()]
    lines.append("  cursors:")
    table = format_table(["cursor", "offset", "lag"], [[c["name"], c["offset"], c["lag"]] for c in d["cursors"]],
                         empty="(no cursors)")
    lines += ["    " + ln for ln in table.splitlines()]
    return "\n".join(lines)


# ---- actions ----------------------------------------------------------------------------------

def _emit(args: argparse.Namespace, data: Any, text: Callable[[Any], str]) -> None:
    print(json.dumps(data, indent=2) if args.output == "json" else text(data), flush=True)


def _confirm(args: argparse.Namespace, question: str) -> None:
    if args.yes or getattr(args, "force", False):
        return
    if not sys.stdin.isatty():
        raise ShellError(f"refusing to {question} without confirmation: pass --yes")
    if input(f"{question}? this cannot be undone [y/N] ").strip().lower() not in ("y", "yes"):
        raise ShellError("nothing done")


def _needs_password(args: argparse.Namespace, what: str) -> bytes | None:
    password = password_from_args(args)
    if password is None and not getattr(args, "force", False):
        raise ShellError(f"{what} needs the log's password (--password-file or --password)"
                         + (", or --force as an admin" if hasattr(args, "force") else ""))
    return password


async def _create(logs: "Logs", args: argparse.Namespace) -> None:
    from pybk.entry import DigestType
    from pybk.log import LogConfig, Retention, RetentionPolicy, Rollover
    base = Rollover()
    rollover = Rollover(max_bytes=args.roll_bytes or base.max_bytes, max_records=args.roll_records,
                        max_age=args.roll_age or base.max_age, max_idle=args.roll_idle or base.max_idle)
    config = LogConfig(args.ensemble, args.write_quorum, args.ack_quorum,
                       DigestType.MAC if args.digest == "mac" else DigestType.CRC32C, rollover,
                       Retention(RetentionPolicy(args.retention), args.max_age, args.max_bytes, args.max_backlog_bytes))
    ref = await logs.create(args.name, config, password=password_from_args(args))
    _emit(args, {"name": ref.name, "log_id": ref.log_id, "config": ref.config.to_json()},
          lambda d: f"created log {d['name']} (id {d['log_id']})")


async def _list(logs: "Logs", args: argparse.Namespace) -> None:
    rows = [{"name": n, "log_id": i} async for n, i in logs.meta.names()]
    _emit(args, rows, lambda rs: format_table(["log", "id"], [[r["name"], r["log_id"]] for r in rs], empty="no logs"))


async def _describe(logs: "Logs", args: argparse.Namespace) -> None:
    d = description_json(await logs.describe(args.name, password_from_args(args)))
    _emit(args, d, lambda d: render_description(d, args.segments))


async def _stdin_lines() -> AsyncIterator[list[bytes]]:
    """Standard input's lines (without their line break), as they arrive, a chunk at a time: a
    thread reads whatever is available (`read1`), so a line typed is appended at once."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=64)

    def pump() -> None:
        stream = sys.stdin.buffer
        while True:
            chunk = stream.read1(1 << 16)
            asyncio.run_coroutine_threadsafe(queue.put(chunk), loop).result()
            if not chunk:
                return
    threading.Thread(target=pump, name="stdin", daemon=True).start()
    rest = b""
    while True:
        chunk = await queue.get()
        if not chunk:
            if rest:
                yield [rest.removesuffix(b"\r")]
            return
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        if lines:
            yield [ln.removesuffix(b"\r") for ln in lines]


async def _append(logs: "Logs", args: argparse.Namespace) -> None:
    from pybk.log import WriterOptions
    password = _needs_password(args, f"appending to log {args.name!r}")
    writer = await logs.open_writer(args.name, password=password, options=WriterOptions(linger=args.linger))
    pending: collections.deque = collections.deque()
    failed: list[BaseException] = []
    first, count = writer.next_offset, 0

    def drain(_: Any = None) -> None:
        """Print the offsets acknowledged so far, in input order (appends are acknowledged in order)."""
        printed = False
        while pending and pending[0].done():
            p = pending.popleft()
            if p.exception() is not None:
                failed.append(p.exception())
                pending.clear()
                break
            if args.print_offsets:
                sys.stdout.write(f"{p.offset}\n")
                printed = True
        if printed:
            sys.stdout.flush()

    try:
        async for lines in _stdin_lines():
            for line in lines:
                p = writer.append_nowait(line, key=args.key)
                count += 1
                if args.print_offsets:
                    pending.append(p)
                    p.add_done_callback(drain)
            if failed:
                break
            if len(pending) > 100_000:   # bound memory: wait for the oldest
                await _awaited(pending[0])
            elif not args.print_offsets and count % 100_000 < len(lines):
                await writer.flush()     # raises what failed an append
        if not failed:
            await writer.flush()
    finally:
        await writer.close()
    drain()
    if failed:
        raise failed[0]
    if not args.print_offsets:
        data = {"name": args.name, "records": count, "first_offset": first if count else None,
                "last_offset": first + count - 1 if count else None}
        _emit(args, data, lambda d: f"appended {d['records']} records to log {d['name']}"
              + (f" at offsets {d['first_offset']}..{d['last_offset']}" if d["records"] else ""))


async def _awaited(p: "PendingAppend") -> None:
    try:
        await p
    except Exception:
        pass   # reported in order by the drain


async def _read(logs: "Logs", args: argparse.Namespace, follow: bool) -> None:
    start = args.start if args.start is not None else ("latest" if follow else "earliest")
    end = None if follow else args.to
    reader = await logs.open_reader(args.name, start=start, cursor=args.cursor, at_time=args.at_time, end=end,
                                    password=password_from_args(args))
    n = 0
    out = sys.stdout
    try:
        async with reader:
            if args.count is not None and args.count <= 0:
                return
            async for rec in reader:
                out.write(json.dumps(record_json(rec)) + "\n")
                n += 1
                if follow or n % 1000 == 0:
                    out.flush()   # a tail shows each record as it comes
                if args.count is not None and n >= args.count:
                    return
    finally:
        out.flush()


async def _cursors(logs: "Logs", args: argparse.Namespace) -> None:
    if args.commit:
        cursor, text = args.commit
        try:
            offset = int(text)
        except ValueError:
            raise ShellError(f"--commit {cursor} {text}: not an offset") from None
        await logs.commit(args.name, cursor, offset)
    elif args.delete:
        if not await logs.delete_cursor(args.name, args.delete):
            raise ShellError(f"log {args.name!r} has no cursor {args.delete!r}")
    rows = [{"name": c.name, "offset": c.offset, "lag": c.lag}
            for c in await logs.cursors(args.name, password_from_args(args))]
    _emit(args, rows, lambda rs: format_table(["cursor", "offset", "lag"], [[r["name"], r["offset"], r["lag"]]
                                                                            for r in rs], empty="no cursors"))


async def _truncate(logs: "Logs", args: argparse.Namespace) -> None:
    password = _needs_password(args, f"truncating log {args.name!r}")
    _confirm(args, f"delete the segments of log {args.name} below offset {args.before}")
    before = await logs.start_offset(args.name)
    start = await logs.truncate(args.name, args.before, password=password, force=args.force)
    _emit(args, {"name": args.name, "start_offset": start, "deleted_records": start - before},
          lambda d: f"log {d['name']} now starts at offset {d['start_offset']} "
                    f"({d['deleted_records']} records deleted)")


async def _delete(logs: "Logs", args: argparse.Namespace) -> None:
    password = _needs_password(args, f"deleting log {args.name!r}")
    _confirm(args, f"delete log {args.name}")
    await logs.delete(args.name, password=password, force=args.force)
    _emit(args, {"name": args.name, "deleted": True}, lambda d: f"deleted log {d['name']}")


@command("log", "named logs: create, list, describe, append, read, tail, cursors, truncate, delete "
         "(`pybk shell log --help`)", _log_args, stream=True)
async def log_command(sh: Shell, args: argparse.Namespace) -> None:
    from pybk.log import Logs
    logs = Logs(await sh.bk())
    action = args.log_action
    if action in ("read", "tail"):
        await _read(logs, args, follow=action == "tail")
        return None
    await {"create": _create, "list": _list, "describe": _describe, "append": _append, "cursors": _cursors,
           "truncate": _truncate, "delete": _delete}[action](logs, args)
    return None

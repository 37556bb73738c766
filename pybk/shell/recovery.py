"""Autorecovery's `pybk shell` commands: listunderreplicated, whoisauditor, triggeraudit,
decommission, recover (registered into pybk.shell through its EXTENSION_MODULES).

`admin` and `decommission` are imported by the commands that call them: imported here, they
would cost every shell command (this module is loaded to build the parser) 0.2 s of CPU for
aiohttp."""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from pybk.recovery import plan
from pybk.shell import Shell, ShellError, command, format_table


class _Progress:
    """A progress bar on stderr: redrawn in place on a terminal, one line per change otherwise."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.last = ""
        self.tty = sys.stderr.isatty()

    def __call__(self, text: str) -> None:
        if not self.enabled or text == self.last:
            return
        self.last = text
        if self.tty:
            sys.stderr.write("\r" + text)
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def end(self) -> None:
        if self.enabled and self.tty and self.last:
            sys.stderr.write("\n")


def _render_markers(rows: list[dict[str, Any]], args: Any = None) -> str:
    now = time.time()
    return format_table(["ledger", "missing replicas on", "marked"],
                        [[r["ledger_id"], ", ".join(r["missing"]), f"{now - r['since_ms'] / 1000:.0f}s ago"]
                         for r in rows], empty="no ledger is under-replicated")


@command("listunderreplicated", "list the ledgers marked under-replicated (and which bookies lack replicas)",
         None, _render_markers)
async def listunderreplicated(sh: Shell, args: argparse.Namespace) -> list[dict[str, Any]]:
    from pybk.recovery import admin
    return await admin.list_under_replicated(await sh.store())


def _render_auditor(d: dict[str, Any] | None, args: Any = None) -> str:
    if not d:
        return "no auditor is elected (start `pybk autorecovery`, or a bookie with --autorecovery)"
    return f"auditor: {d.get('id')}" + (f" (admin API {d['http']})" if d.get("http") else "")


@command("whoisauditor", "show which autorecovery process is the elected auditor", None, _render_auditor)
async def whoisauditor(sh: Shell, args: argparse.Namespace) -> dict[str, Any] | None:
    from pybk.recovery import admin
    return await admin.who_is_auditor(await sh.store())


@command("triggeraudit", "ask the auditor to run the full check (every ledger's replicas) now", None,
         lambda d, args: f"audit triggered on {d.get('auditor')}")
async def triggeraudit(sh: Shell, args: argparse.Namespace) -> dict[str, Any]:
    from pybk.recovery import admin
    try:
        return await admin.trigger_audit(await sh.store())
    except admin.AdminError as exc:
        raise ShellError(str(exc)) from None


def _bookie_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("bookie_id", metavar="BOOKIE_ID", help="the bookie's id (see `pybk shell listbookies`)")
    p.add_argument("--no-wait", action="store_true", help="return once started; autorecovery finishes it")
    p.add_argument("--timeout", type=float, default=None, help="give up waiting after this many seconds")


def _render_decommission(d: dict[str, Any], args: Any = None) -> str:
    if d.get("done"):
        return f"decommissioned {d['bookie']}: no ledger references it; its cookie is deleted"
    return (f"decommission of {d.get('bookie_id', d.get('bookie'))} started ({d.get('ledgers_total', '?')} ledgers "
            "to drain); `pybk shell decommission BOOKIE_ID` again to watch it")


@command("decommission", "drain a bookie: read-only, re-replicate its ledgers elsewhere, delete its cookie",
         _bookie_args, _render_decommission)
async def decommission_cmd(sh: Shell, args: argparse.Namespace) -> dict[str, Any]:
    from pybk.recovery import admin, decommission
    store = await sh.store()
    bar = _Progress(args.output != "json")

    def on_progress(p: plan.DrainProgress) -> None:
        bar(plan.progress_bar(p))

    try:
        result = await admin.decommission_bookie(store, args.bookie_id, wait=not args.no_wait,
                                                 on_progress=on_progress, timeout=args.timeout)
    except (admin.AdminError, decommission.DecommissionError) as exc:
        raise ShellError(str(exc)) from None
    finally:
        bar.end()
    return result


@command("recover", "re-replicate a (dead) bookie's ledgers now, without waiting for the lost-bookie delay",
         _bookie_args, lambda d, args: (f"recovered {d['bookie']}: {len(d['marked'])} ledgers re-replicated"
                                        if d.get("done") else f"marked {len(d['marked'])} ledgers of {d['bookie']}"))
async def recover(sh: Shell, args: argparse.Namespace) -> dict[str, Any]:
    from pybk.recovery import admin
    store = await sh.store()
    bar = _Progress(args.output != "json")

    def on_progress(done: int, total: int) -> None:
        bar(plan.progress_bar(plan.drain_progress(total, total - done)).replace("drained", "re-replicated"))

    try:
        return await admin.recover_bookie(store, args.bookie_id, wait=not args.no_wait, timeout=args.timeout,
                                          on_progress=on_progress)
    except admin.AdminError as exc:
        raise ShellError(str(exc)) from None
    finally:
        bar.end()

"""`pybk shell gc-jobs`: settle what write jobs (Spark writes, streaming micro-batches) left behind."""
from __future__ import annotations

import argparse
from typing import Any

from pybk.security.roles import Operation, allowed

from .core import Shell, ShellError, command


def _gc_args(p: argparse.ArgumentParser) -> None:
    from pybk.meta.job_commit import DEFAULT_GRACE_S
    from pybk.meta.job_gc import DEFAULT_RETENTION_S
    p.add_argument("--grace", type=float, default=DEFAULT_GRACE_S, metavar="SECONDS",
                   help="a job that has not decided this long after creating a ledger is aborted and its "
                        f"ledgers deleted (default {DEFAULT_GRACE_S:.0f}; jobs running longer fail their commit)")
    p.add_argument("--retention", type=float, default=DEFAULT_RETENTION_S, metavar="SECONDS",
                   help="remove job records older than this whose ledgers are all committed or gone "
                        f"(default {DEFAULT_RETENTION_S:.0f})")
    p.add_argument("--dry-run", action="store_true", help="only say what would be done")


def _render_gc(d: dict[str, Any], args: Any = None) -> str:
    verb = "would " if d["dry_run"] else ""
    ids = lambda xs: ", ".join(map(str, xs)) or "none"  # noqa: E731
    lines = [f"job ledgers: {d['job_ledgers']}",
             f"{verb}delete: {ids(d['deleted'])}",
             f"{verb}mark committed: {ids(d['committed'])}",
             f"aborted (undecided past the grace): {ids(d['aborted_jobs'])}",
             f"{verb}remove job records: {ids(d['removed_records'])}"]
    lines += [f"error on ledger {lid}: {why}" for lid, why in d["errors"].items()]
    return "\n".join(lines)


@command("gc-jobs", "delete ledgers of write jobs that aborted or never committed (after a grace period), "
         "finish interrupted commits and remove old job records; needs the admin role", _gc_args, _render_gc)
async def gc_jobs(sh: Shell, args: argparse.Namespace) -> dict[str, Any]:
    from pybk.meta import job_gc as gc
    store = await sh.store()
    bk = await sh.bk()
    if not args.dry_run:
        role = await bk.caller_role()
        if not allowed(role, Operation.ADMINISTER):
            raise ShellError(f"gc-jobs deletes ledgers without their passwords: it needs the admin role; "
                             f"bookies take this client for role {role}")

    async def delete(md) -> None:
        await bk.delete_ledger(md.ledger_id, None, force=True)
    report = await gc.collect(store, delete, grace_s=args.grace, retention_s=args.retention,
                              dry_run=args.dry_run)
    if report.errors:
        raise ShellError(f"{len(report.errors)} job ledger(s) could not be settled: "
                         + "; ".join(f"ledger {k}: {v}" for k, v in sorted(report.errors.items())))
    return report.to_json()

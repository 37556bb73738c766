"""The `pybk` command: one entry point, a subcommand per part.

Each subcommand lives in the module of its part, which exposes
`add_arguments(parser)` and `run(args) -> int`. Only the chosen subcommand's module
is imported, so `pybk shell ...` does not pay for importing Spark or kopf.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

# pybk's numpy work is on small arrays; OpenBLAS would start a thread per core at import that spins
# for a while (0.15 s of CPU per bookie start on two cores). Processes pybk starts are its own; a
# program that imports pybk as a library keeps its choice.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

COMMANDS: dict[str, tuple[str, str]] = {
    "bookie": ("pybk.bookie.main", "run a bookie storage server"),
    "autorecovery": ("pybk.autorecovery.main", "run the auditor and a replication worker"),
    "operator": ("pybk.operator.main", "run the Kubernetes operator for BookieCluster resources"),
    "local": ("pybk.local.main", "run a local cluster (etcd + bookies + autorecovery) as child processes"),
    "shell": ("pybk.shell", "inspect and administer a cluster (list bookies, ledgers, read, ...)"),
    "spark": ("pybk.spark.submit", "run Spark jobs over a BookieCluster in Kubernetes (spark submit)"),
    "bench": ("pybk.bench", "benchmarks: bookie, meta, write, read, recovery, spark, floor, open-recovery"),
}


def chosen_command(argv: list[str]) -> str | None:
    """The command argv names (its first word that is not an option), None if it names none."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """The top-level parser; only the chosen subcommand gets its full arguments."""
    parser = argparse.ArgumentParser(
        prog="pybk", description="pybk: replicated, append-only ledger storage (BookKeeper model).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = chosen_command(argv)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            mod = importlib.import_module(module)
            mod.add_arguments(p)
            p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

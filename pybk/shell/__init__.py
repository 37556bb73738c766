"""`pybk shell COMMAND`: inspect and administer a cluster.

Every command takes `--metadata-uri` (else `--data-dir` of a local cluster, else
`$PYBK_METADATA_URI`, else the default local cluster's local.json; a local cluster started
`--secure` also gives its credentials), prints a human table by
default or JSON with `-o json`, and exits non-zero on failure with a one-line reason.

Commands register themselves with `@command(...)`: a command is an async function
`(Shell, args) -> data` (JSON-able) plus a `render(data) -> str` for people, or (`stream=True`)
one that prints its own output as it goes, like `top`. Modules:
core (errors, registry, cluster location, connections), format (tables and other output),
bookies, ledgers, jobs and top (the commands by group), main (the parser and `run`). Parts that own more
commands (autorecovery) add theirs in a module named in `main.EXTENSION_MODULES`.
"""
from __future__ import annotations

from . import bookies, ledgers, jobs, logs, top  # noqa: F401 - registers their commands, in the order `--help` lists them
from .core import COMMANDS, Shell, ShellError, command, resolve_cluster, resolve_metadata_uri
from .format import entry_json, format_table, human_bytes, payload_preview
from .ledgers import fragments_json, ledger_json
from .main import EXTENSION_MODULES, add_arguments, run

__all__ = ["COMMANDS", "EXTENSION_MODULES", "Shell", "ShellError", "add_arguments", "command", "entry_json",
           "format_table", "fragments_json", "human_bytes", "ledger_json", "payload_preview",
           "resolve_cluster", "resolve_metadata_uri", "run"]

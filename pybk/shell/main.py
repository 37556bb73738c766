"""The `pybk shell` entry point: `add_arguments(parser)` and `run(args) -> int` (see pybk.cli).

Parts that own more commands (autorecovery) add theirs in a module named in EXTENSION_MODULES,
imported here when the parser is built."""
from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import sys
from typing import Any

from .core import COMMANDS, Command, Shell, ShellError, resolve_cluster

EXTENSION_MODULES = ("pybk.shell.recovery",)


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
    """A subcommand per registered command, each with the cluster options and `-o`."""
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
    """Run the chosen command and print its result: 0, or 1 with a one-line reason on stderr."""
    cmd = COMMANDS[args.shell_command]
    try:
        target = resolve_cluster(args.metadata_uri, args.data_dir)
        # every client this command opens (ledger client, bookie probes, admin HTTP) takes its
        # credentials from the environment unless given them: export the resolved ones
        os.environ.update(target.security.as_env())
        data = asyncio.run(_run(cmd, Shell(target.metadata_uri, target.security), args))
    except KeyboardInterrupt:  # Ctrl-C ends a streaming command (top) normally
        if not cmd.stream:
            raise
        return 0
    except BrokenPipeError:  # `pybk shell top | head`: the reader has enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
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
    if cmd.stream:
        return 0
    try:
        if args.output == "json":
            print(json.dumps(data, indent=2))
        else:
            print(cmd.render(data, args))
        sys.stdout.flush()
    except BrokenPipeError:  # `pybk shell ... | head`: the reader has enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


async def _run(cmd: Command, sh: Shell, args: argparse.Namespace) -> Any:
    try:
        return await cmd.run(sh, args)
    finally:
        await sh.close()

"""Options for pybk servers from flags, `PYBK_*` environment variables, or a YAML file.

A command declares its options once as `Option`s; `add_options` puts them on an argparse parser
(plus `--config FILE`), and `resolve` merges them with precedence flag > environment > YAML file >
default. Shared by the bookie and autorecovery.
"""
from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000 ** 2, "mb": 1000 ** 2, "mib": 1024 ** 2,
          "g": 1000 ** 3, "gb": 1000 ** 3, "gib": 1024 ** 3, "t": 1000 ** 4, "tb": 1000 ** 4, "tib": 1024 ** 4}


def parse_size(text: str | int) -> int:
    """'64MiB', '1GB', '4096' -> bytes."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (use e.g. 4096, 64KiB, 16MiB, 1GB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_bool(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    t = str(text).strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r} (use true or false)")


@dataclass(frozen=True)
class Option:
    """One setting: `--name-with-dashes`, env `PYBK_NAME_WITH_UNDERSCORES`, YAML key `name_with_underscores`
    (dashes also accepted)."""

    name: str
    help: str
    default: Any = None
    type: Callable[[Any], Any] = str
    repeatable: bool = False
    required: bool = False
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def env(self, prefix: str) -> str:
        return prefix + self.name.upper()


class ConfigError(ValueError):
    """A setting is missing or malformed; the message names it and where it came from."""


def add_options(parser: argparse.ArgumentParser, options: list[Option], env_prefix: str = "PYBK_") -> None:
    """Add `--config` and every option to parser (defaults are applied later by resolve)."""
    parser.add_argument("--config", metavar="FILE", default=None,
                        help=f"YAML file of settings (keys are the option names, e.g. journal_dir); "
                             f"flags override the environment ({env_prefix}*), which overrides the file")
    for opt in options:
        default = f" (default: {opt.default})" if opt.default not in (None, [], "") else ""
        if opt.repeatable:
            parser.add_argument(opt.flag, dest=opt.name, action="append", default=None, metavar=opt.metavar,
                                help=f"{opt.help}; repeatable; env {opt.env(env_prefix)} "
                                     f"(comma-separated){default}")
        elif opt.type is parse_bool:  # `--flag` alone means true; `--flag false` still works
            parser.add_argument(opt.flag, dest=opt.name, default=None, nargs="?", const="true",
                                metavar=opt.metavar or "BOOL", help=f"{opt.help}; env {opt.env(env_prefix)}{default}")
        else:
            parser.add_argument(opt.flag, dest=opt.name, default=None, metavar=opt.metavar,
                                help=f"{opt.help}; env {opt.env(env_prefix)}{default}")


def resolve(args: argparse.Namespace, options: list[Option], env_prefix: str = "PYBK_",
            environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Settings by option name, merged flag > env > YAML file > default, converted by type."""
    environ = os.environ if environ is None else environ
    path = getattr(args, "config", None) or environ.get(env_prefix + "CONFIG")
    file_values: dict[str, Any] = {}
    if path:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping of option names to values")
        known = {o.name for o in options}
        for k, v in loaded.items():
            key = str(k).replace("-", "_")
            if key not in known:
                raise ConfigError(f"config file {path}: unknown option {k!r}; known: {', '.join(sorted(known))}")
            file_values[key] = v
    out: dict[str, Any] = {}
    for opt in options:
        value, source = getattr(args, opt.name, None), f"flag {opt.flag}"
        if value is None and opt.env(env_prefix) in environ:
            raw = environ[opt.env(env_prefix)]
            value, source = ([s for s in raw.split(",") if s] if opt.repeatable else raw), f"env {opt.env(env_prefix)}"
        if value is None and opt.name in file_values:
            value, source = file_values[opt.name], f"config file key {opt.name}"
            if opt.repeatable and not isinstance(value, list):
                value = [value]
        if value is None:
            if opt.required:
                raise ConfigError(f"missing setting {opt.name}: pass {opt.flag}, set {opt.env(env_prefix)}, "
                                  f"or put {opt.name} in the --config file")
            if isinstance(opt.default, list):
                out[opt.name] = [opt.type(v) for v in opt.default]
            else:
                out[opt.name] = None if opt.default is None else opt.type(opt.default)
            continue
        try:
            out[opt.name] = [opt.type(v) for v in value] if opt.repeatable else opt.type(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"bad value for {opt.name} from {source}: {exc}") from exc
    return out

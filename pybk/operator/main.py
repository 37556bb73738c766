"""`pybk operator`: run the Kubernetes operator for BookieCluster resources (kopf).

`pybk operator --check FILE` checks a BookieCluster manifest offline instead: the CRD's
schema and CEL rules, then the controller's own validation.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass, field

from pybk import config
from pybk.config import OPERATOR, Common, option_field
from pybk.security.settings import ClientSecurity


@dataclass(frozen=True)
class OperatorSettings:
    """Everything `pybk operator` is configured with."""

    common: Common = field(default_factory=Common)
    client: ClientSecurity = field(default_factory=ClientSecurity)  # what it presents to autorecovery
    namespace: tuple[str, ...] | None = option_field("namespace")   # None: every namespace
    default_metadata_uri: str | None = option_field("default_metadata_uri")
    refresh_interval: float = option_field("refresh_interval")
    audit_interval: float = option_field("audit_interval", OPERATOR)
    liveness: str = option_field("liveness")
    verbose: bool = option_field("verbose")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The operator's settings (pybk.config.OPERATOR), and the offline `--check` mode's own arguments."""
    config.add_options(parser, config.OPERATOR)
    parser.add_argument("--check", metavar="FILE", default=None,
                        help="do not run: check a BookieCluster or BookieLog manifest against its CRD (schema and CEL "
                        "rules) and the controller's validation, and exit non-zero if it is invalid")
    parser.add_argument("-o", "--output", choices=["human", "json"], default="human",
                        help="output format of --check (default human)")


def _check_log(doc: dict) -> list[str]:
    """A BookieLog's errors: the CRD's schema and CEL rules, then the log controller's parser."""
    from pybk.cluster.bookielog.spec import BookieLogSpec
    from pybk.operator import crd

    defaulted, errors = crd.admit(doc)
    return errors or list(BookieLogSpec.from_manifest(defaulted, validate=False).errors)


def _check(path: str, output: str) -> int:
    import yaml

    from pybk.cluster.spec import BookieClusterSpec, SpecError
    from pybk.operator import crd

    errors: list[str] = []
    try:
        docs = [d for d in yaml.safe_load_all(open(path)) if d]
    except (OSError, yaml.YAMLError) as e:
        docs, errors = [], [f"cannot read {path}: {e}"]
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "BookieLog":
            errors += _check_log(doc)
        if not isinstance(doc, dict) or doc.get("kind") != "BookieCluster":
            continue
        defaulted, errs = crd.admit(doc)
        errors += errs
        if not errs:
            try:
                BookieClusterSpec.from_manifest(defaulted)
            except SpecError as e:
                errors += e.errors
    if not docs and not errors:
        errors = [f"{path} holds no BookieCluster"]
    if output == "json":
        print(json.dumps({"file": path, "valid": not errors, "errors": errors}))
    elif errors:
        kinds = sorted({d.get("kind") for d in docs if isinstance(d, dict)} & {"BookieCluster", "BookieLog"})
        print(f"{path}: invalid {' and '.join(kinds) or 'BookieCluster'}", file=sys.stderr)
        for e in errors:
            print(f"  - {e}", file=sys.stderr)
    else:
        print(f"{path}: valid")
    return 1 if errors else 0


async def _operate(settings: OperatorSettings) -> None:
    import kopf

    from . import handlers, log_handlers  # importing registers the event handlers with kopf
    from .kube import Kube

    handlers.CONTEXT = handlers.OperatorContext(kube=await Kube.connect(),
                                                default_metadata_uri=settings.default_metadata_uri,
                                                security=settings.client)
    handlers.register_timers(kopf.get_default_registry(), settings.refresh_interval, settings.audit_interval)
    log_handlers.register_timers(kopf.get_default_registry(), settings.refresh_interval)
    try:
        await kopf.operator(clusterwide=not settings.namespace, namespaces=list(settings.namespace or ()) or None,
                            liveness_endpoint=settings.liveness, standalone=True)
    finally:
        await handlers.CONTEXT.stores.close()


def run(args: argparse.Namespace) -> int:
    settings = config.load(OperatorSettings, args, config.OPERATOR)
    if settings is None:
        return 2
    if args.check:
        return _check(args.check, args.output)
    try:
        asyncio.run(_operate(settings))
    except Exception as e:  # noqa: BLE001 - no API server / bad kube config: say so, exit non-zero
        print(f"pybk operator: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0

"""`pybk operator`: run the Kubernetes operator for BookieCluster resources (kopf).

`pybk operator --check FILE` checks a BookieCluster manifest offline instead: the CRD's
schema and CEL rules, then the controller's own validation.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--namespace", action="append", default=None, metavar="NS",
                        help="watch only this namespace (repeatable); default: every namespace")
    parser.add_argument("--default-metadata-uri", default=os.environ.get("PYBK_DEFAULT_METADATA_URI"),
                        metavar="URI", help="metadata service (etcd://host:port/prefix) for clusters whose "
                        "spec.metadataServiceUri is empty, e.g. the chart's bundled etcd "
                        "(env PYBK_DEFAULT_METADATA_URI)")
    parser.add_argument("--refresh-interval", type=float,
                        default=float(os.environ.get("PYBK_OPERATOR_REFRESH_INTERVAL", "20")),
                        metavar="SECONDS", help="how often each cluster's status is refreshed from etcd and "
                        "the next step of a scale-down or rolling restart is taken (default 20)")
    parser.add_argument("--audit-interval", type=float,
                        default=float(os.environ.get("PYBK_OPERATOR_AUDIT_INTERVAL", "3600")),
                        metavar="SECONDS", help="how often the operator asks autorecovery for a full "
                        "ledger audit (default 3600)")
    parser.add_argument("--liveness", default="http://0.0.0.0:8080/healthz", metavar="URL",
                        help="where kopf serves its liveness probe (default http://0.0.0.0:8080/healthz)")
    parser.add_argument("--check", metavar="FILE", default=None,
                        help="do not run: check a BookieCluster manifest against the CRD (schema and CEL "
                        "rules) and the controller's validation, and exit non-zero if it is invalid")
    parser.add_argument("-o", "--output", choices=["human", "json"], default="human",
                        help="output format of --check (default human)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")


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
        print(f"{path}: invalid BookieCluster", file=sys.stderr)
        for e in errors:
            print(f"  - {e}", file=sys.stderr)
    else:
        print(f"{path}: valid")
    return 1 if errors else 0


async def _operate(args: argparse.Namespace) -> None:
    import kopf

    from . import handlers
    from .kube import Kube

    handlers.CONTEXT = handlers.OperatorContext(kube=await Kube.connect(),
                                                default_metadata_uri=args.default_metadata_uri)
    try:
        await kopf.operator(clusterwide=not args.namespace, namespaces=args.namespace or None,
                            liveness_endpoint=args.liveness, standalone=True)
    finally:
        await handlers.CONTEXT.stores.close()


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.check:
        return _check(args.check, args.output)
    os.environ["PYBK_OPERATOR_REFRESH_INTERVAL"] = str(args.refresh_interval)
    os.environ["PYBK_OPERATOR_AUDIT_INTERVAL"] = str(args.audit_interval)
    try:
        asyncio.run(_operate(args))
    except Exception as e:  # noqa: BLE001 - no API server / bad kube config: say so, exit non-zero
        print(f"pybk operator: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0

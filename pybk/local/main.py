"""`pybk local up|down|apply|status`: a BookieCluster manifest run as local child processes."""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from pybk import logformat
from pybk.config import LOG_FORMAT
from pybk.logformat import LogFormat
from pybk.security.roles import Role

from . import control
from .client import default_data_dir as _default_dir
from .control import live_children, pid_alive, running_supervisor
from .datadir import APPLY_JSON, LOCAL_JSON, MANIFEST, read_local_json
from .errors import LocalClusterError
from .etcd import EtcdMissing, etcd_binary
from .manifest import load_spec
from .platform import LocalCluster
from .process import ChildProcess
from .secure import LocalSecurity, secure_mode
from .supervisor import supervise


def default_data_dir() -> str:
    """Where a local cluster lives unless --data-dir says otherwise: $PYBK_LOCAL_DIR or ./.pybk-local."""
    return str(_default_dir())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="local_command", metavar="ACTION", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--data-dir", default=default_data_dir(), metavar="DIR",
                       help="directory holding the cluster's data, logs and local.json "
                            "(default: $PYBK_LOCAL_DIR or ./.pybk-local)")
        p.add_argument("-o", "--output", choices=["text", "json"], default="text",
                       help="text for people (default), json for scripts")

    up = sub.add_parser("up", help="start etcd and the manifest's bookies (foreground; Ctrl-C stops all)",
                        description="Start etcd and spec.replicas bookies from a BookieCluster manifest "
                                    "as child processes, write DIR/local.json once every bookie serves, "
                                    "and run in the foreground until Ctrl-C or `pybk local down`.")
    up.add_argument("-f", "--file", metavar="MANIFEST",
                    help="BookieCluster manifest (YAML); default: the one the data dir was last started with")
    common(up)
    up.add_argument("--detach", action="store_true",
                    help="start in the background and return once the cluster is ready "
                         "(supervisor log: DIR/local.log)")
    up.add_argument("--timeout", type=float, default=180.0, metavar="SECONDS",
                    help="how long to wait for every process to be ready (default %(default)s)")
    up.add_argument("--secure", action="store_true",
                    help="TLS on every port, etcd auth, bookie/admin tokens: a throwaway CA and secrets are "
                         "created once under DIR/security/ and reused; clients find their settings in "
                         "local.json. Remembered for the data dir (later `up` stay secure)")
    up.add_argument("--log-format", choices=[f.value for f in LogFormat],
                    default=os.environ.get(LOG_FORMAT.variable, LogFormat.TEXT.value),
                    help="text (default, or $PYBK_LOG_FORMAT) or json (one object per line) for the "
                         "supervisor's log and, through PYBK_LOG_FORMAT, the bookies' and autorecovery's")
    up.add_argument("--detached-child", action="store_true", help=argparse.SUPPRESS)

    down = sub.add_parser("down", help="stop the local cluster running in --data-dir",
                          description="Stop a running local cluster (started in the foreground or with "
                                      "--detach): bookies first, then etcd. Data stays in DIR.")
    common(down)
    down.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                      help="how long to wait for a clean stop before kill -9 (default %(default)s)")

    status = sub.add_parser("status", help="show the processes of the local cluster in --data-dir",
                            description="Show the running local cluster's processes; exit 1 if none runs.")
    common(status)

    apply = sub.add_parser("apply", help="change a running local cluster to match a manifest",
                           description="Make the running local cluster match the manifest, through the same "
                                       "controller as the Kubernetes operator: more replicas start new bookies; "
                                       "fewer replicas decommission the highest-numbered bookies first (their "
                                       "ledgers are re-replicated to the others) and stop them only once no "
                                       "ledger references them. Going below the largest ensemble of an open "
                                       "ledger is refused. Config changes restart bookies one at a time. "
                                       "A BookieLog manifest creates, adopts or reconfigures its log and "
                                       "enforces its retention once, as the operator does.")
    apply.add_argument("-f", "--file", required=True, metavar="MANIFEST",
                       help="BookieCluster, BookieLog or Secret manifest (YAML; Secrets are kept in "
                            "DIR/secrets/<name>/<key>, where BookieLogs find their password)")
    common(apply)
    apply.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                       help="how long to wait for the change to finish (default %(default)s)")

    delete = sub.add_parser("delete", help="delete the BookieLogs and Secrets of a manifest from a running local "
                                           "cluster",
                            description="Delete what a manifest's BookieLog and Secret documents made, as `kubectl "
                                        "delete -f` does: each log is kept (deletionPolicy Retain) or deleted with "
                                        "its data (Delete; refused while a writer has the log open: exit 1, run it "
                                        "again once the writer closed), and stored Secrets are forgotten. Only a "
                                        "log a BookieLog created or adopted is ever deleted. A BookieCluster is "
                                        "stopped with `pybk local down`, not deleted.")
    delete.add_argument("-f", "--file", required=True, metavar="MANIFEST",
                        help="BookieLog or Secret manifest (YAML), as given to `pybk local apply`")
    common(delete)


def run(args: argparse.Namespace) -> int:
    handler = {"up": _up, "down": _down, "status": _status, "apply": _apply, "delete": _delete}[args.local_command]
    try:
        return handler(args)
    except LocalClusterError as e:
        print(f"pybk local {args.local_command}: error: {e}", file=sys.stderr)
        return 1


# ---------------------------------------------------------------------------------------------

def _manifest_for_up(args: argparse.Namespace, data_dir: Path) -> Path:
    stored = data_dir / MANIFEST
    if args.file is None:
        if not stored.exists():
            raise LocalClusterError("no manifest: pass -f cluster.yaml (see examples/cluster.yaml)")
        load_spec(stored)
        return stored
    src = Path(args.file).resolve()
    load_spec(src)
    data_dir.mkdir(parents=True, exist_ok=True)
    if src != stored.resolve():
        shutil.copyfile(src, stored)
    return stored


def _refuse_if_running(data_dir: Path) -> None:
    pid = running_supervisor(data_dir)
    if pid is not None:
        raise LocalClusterError(f"a local cluster already runs in {data_dir} (pid {pid}); "
                                f"stop it with `pybk local down --data-dir {data_dir}`")
    try:
        doc = read_local_json(data_dir)
    except LocalClusterError:
        return
    alive = [str(pid) for _, pid in live_children(doc, data_dir)]
    if alive:
        raise LocalClusterError(f"processes of an earlier local cluster in {data_dir} still run (pids "
                                f"{', '.join(alive)}); stop them with `pybk local down --data-dir {data_dir}`")
    (data_dir / LOCAL_JSON).unlink(missing_ok=True)


def _up(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir).resolve()
    manifest = _manifest_for_up(args, data_dir)
    _refuse_if_running(data_dir)
    try:
        etcd_binary()
    except EtcdMissing as e:
        raise LocalClusterError(str(e)) from None
    secure = secure_mode(data_dir, args.secure, has_data=(data_dir / "etcd").exists())
    security = LocalSecurity.of(data_dir).ensure() if secure else None
    if args.detach:
        return _up_detached(args, data_dir, manifest, secure)
    os.environ[LOG_FORMAT.variable] = args.log_format  # the processes it starts log the same way
    logformat.configure(logging.INFO, LogFormat(args.log_format))
    spec = load_spec(manifest)
    if security is not None:
        # the supervisor is the cluster's admin client (decommissions call the bookies' admin API):
        # every client it opens takes the admin credentials from the environment
        os.environ.update(security.client(Role.ADMIN).as_env())
    cluster = LocalCluster(spec, data_dir, security=security)

    def ready(doc: dict[str, Any]) -> None:
        _print_ready(doc, data_dir, args.output, foreground=not args.detached_child)

    try:
        return supervise(cluster, on_ready=ready)
    except (RuntimeError, TimeoutError, OSError) as e:
        hint = ("\n(spec.config options are passed to every bookie as `pybk bookie` flags: "
                "see `pybk bookie --help` for the valid ones)") if spec.config else ""
        raise LocalClusterError(f"could not start the local cluster: {e}{hint}") from None


def _up_detached(args: argparse.Namespace, data_dir: Path, manifest: Path, secure: bool) -> int:
    argv = [sys.executable, "-m", "pybk.cli", "local", "up", "-f", str(manifest), "--data-dir", str(data_dir),
            "--timeout", str(args.timeout), "--log-format", args.log_format, "--detached-child", *(["--secure"] if secure else [])]
    supervisor = ChildProcess("pybk local up", argv, data_dir / "local.log").start()
    deadline = time.monotonic() + args.timeout + 30
    local_json = data_dir / LOCAL_JSON
    while time.monotonic() < deadline:
        if not supervisor.alive():
            raise LocalClusterError(f"the local cluster failed to start (exit code {supervisor.proc.returncode});"
                                    f" last lines of {supervisor.log_path}:\n{supervisor.log_tail(20)}")
        if local_json.exists():
            _print_ready(read_local_json(data_dir), data_dir, args.output, foreground=False)
            return 0
        time.sleep(0.1)
    supervisor.signal(signal.SIGTERM)
    supervisor.stop(60)
    raise LocalClusterError(f"the local cluster was not ready within {args.timeout:.0f}s; "
                            f"see {supervisor.log_path}")


def _print_ready(doc: dict[str, Any], data_dir: Path, output: str, foreground: bool) -> None:
    if output == "json":
        print(json.dumps(doc, indent=2), flush=True)
        return
    auto = len(doc.get("autorecovery", []))
    lines = [f"local cluster ready in {data_dir}: etcd + {len(doc['bookies'])} bookies"
             + (f" + {auto} autorecovery" if auto else ""),
             f"  metadata service URI: {doc['metadata_service_uri']}",
             f"  {'etcd':<14} pid {doc['etcd']['pid']:<8} {doc['etcd']['client_url']:<28} "
             f"log {data_dir / 'etcd.log'}"]
    for b in doc["bookies"]:
        lines.append(f"  {b['id']:<14} pid {b['pid']:<8} grpc {b['grpc']:<22} http {b['http']:<22} "
                     f"log {data_dir / (b['id'] + '.log')}")
    for r in doc.get("autorecovery", []):
        lines.append(f"  {r['id']:<14} pid {r['pid']:<8} {'':<27} http {r['http']:<22} "
                     f"log {data_dir / (r['id'] + '.log')}")
    if doc.get("security"):
        lines.append(f"  secure: TLS, etcd auth and tokens; client settings in {data_dir / LOCAL_JSON} "
                     f"(`security`), files in {data_dir / 'security'}")
    lines.append(f"try:  pybk shell listbookies --data-dir {data_dir}")
    lines.append("stop: Ctrl-C" if foreground else f"stop: pybk local down --data-dir {data_dir}")
    print("\n".join(lines), flush=True)


def _down(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir).resolve()
    stopped = control.down(data_dir, timeout=args.timeout)
    if args.output == "json":
        print(json.dumps({"data_dir": str(data_dir), "stopped": stopped}))
    else:
        print(f"stopped the local cluster in {data_dir}: {', '.join(stopped) or 'nothing was running'}")
    return 0


def status_of(data_dir: Path) -> dict[str, Any]:
    """local.json plus whether each recorded process is alive, and the supervisor's pid."""
    doc = read_local_json(data_dir)
    doc["supervisor_pid"] = running_supervisor(data_dir)
    doc["etcd"]["alive"] = pid_alive(doc["etcd"].get("pid"))
    for b in doc["bookies"] + doc.setdefault("autorecovery", []):
        b["alive"] = pid_alive(b.get("pid"))
    try:
        doc["last_apply"] = json.loads((data_dir / APPLY_JSON).read_text())
    except (OSError, ValueError):
        doc["last_apply"] = None
    return doc


def _status(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir).resolve()
    doc = status_of(data_dir)
    healthy = (doc["supervisor_pid"] is not None and doc["etcd"]["alive"]
               and all(p["alive"] for p in doc["bookies"] + doc["autorecovery"]))
    if args.output == "json":
        print(json.dumps(doc, indent=2))
    else:
        state = lambda alive: "running" if alive else "EXITED"
        print(f"local cluster in {data_dir} ({'supervisor pid ' + str(doc['supervisor_pid']) if doc['supervisor_pid'] else 'NO SUPERVISOR'})")
        print(f"metadata service URI: {doc['metadata_service_uri']}")
        if doc.get("security"):
            print(f"security: on (TLS, etcd auth, tokens; files in {data_dir / 'security'})")
        restarts = lambda p: f"{p.get('restarts', 0)}" + (f" (last exit {p['last_exit_code']})"
                                                          if p.get("last_exit_code") is not None else "")
        print(f"{'PROCESS':<15} {'PID':<8} {'STATE':<8} {'RESTARTS':<20} ENDPOINTS")
        print(f"{'etcd':<15} {doc['etcd']['pid']:<8} {state(doc['etcd']['alive']):<8} {restarts(doc['etcd']):<20} "
              f"{doc['etcd']['client_url']}")
        for b in doc["bookies"]:
            print(f"{b['id']:<15} {b['pid']:<8} {state(b['alive']):<8} {restarts(b):<20} grpc {b['grpc']}  "
                  f"http {b['http']}")
        for r in doc["autorecovery"]:
            print(f"{r['id']:<15} {r['pid']:<8} {state(r['alive']):<8} {restarts(r):<20} http {r['http']}")
        last = doc["last_apply"]
        if last:
            outcome = "in progress" if not last.get("done") else (f"failed: {last['error']}" if last.get("error")
                                                                 else "done")
            print(f"last apply: {outcome}")
            for c in last.get("conditions") or []:
                if c["status"] and c["type"] in ("Progressing", "Decommissioning", "Degraded"):
                    print(f"  {c['type']}: {c['reason']}" + (f" - {c['message']}" if c["message"] else ""))
    return 0 if healthy else 1


def _apply(args: argparse.Namespace) -> int:
    from . import logs

    if logs.has_logs(args.file) or logs.has_secrets(args.file):
        data_dir = Path(args.data_dir).resolve()
        if running_supervisor(data_dir) is None:
            raise LocalClusterError(f"no local cluster is running in {data_dir}; start one with "
                                    f"`pybk local up -f examples/cluster.yaml --data-dir {data_dir}`")
        if logs.has_cluster(args.file):
            code = _apply_cluster(args)
            if code:
                return code
        stored = logs.store_secrets(args.file, data_dir)
        if stored and args.output == "text":
            print(f"stored Secret {', '.join(stored)} in {data_dir / 'secrets'}")
        return logs.print_results(logs.apply_logs(args.file, data_dir), args.output)
    return _apply_cluster(args)


def _delete(args: argparse.Namespace) -> int:
    from . import logs

    data_dir = Path(args.data_dir).resolve()
    if logs.has_cluster(args.file):
        raise LocalClusterError(f"{args.file} has a BookieCluster: a local cluster is stopped with "
                                f"`pybk local down --data-dir {data_dir}` (its data stays in {data_dir})")
    if not (logs.has_logs(args.file) or logs.has_secrets(args.file)):
        raise LocalClusterError(f"{args.file} has no BookieLog or Secret to delete")
    code = 0
    if logs.has_logs(args.file):
        if running_supervisor(data_dir) is None:
            raise LocalClusterError(f"no local cluster is running in {data_dir}; start it with "
                                    f"`pybk local up --data-dir {data_dir}` to delete its logs")
        code = logs.print_deleted(logs.delete_logs(args.file, data_dir), args.output)
    removed = logs.delete_secrets(args.file, data_dir)
    if removed and args.output == "text":
        print(f"forgot Secret {', '.join(removed)} (was in {data_dir / 'secrets'})")
    return code


def _apply_cluster(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir).resolve()
    spec = load_spec(args.file)
    supervisor = running_supervisor(data_dir)
    if supervisor is None:
        raise LocalClusterError(f"no local cluster is running in {data_dir}; start one with "
                                f"`pybk local up -f {args.file} --data-dir {data_dir}`")
    target = data_dir / MANIFEST
    tmp = target.with_name(target.name + ".tmp")
    shutil.copyfile(args.file, tmp)
    generation = time.time_ns()
    os.utime(tmp, ns=(generation, generation))
    os.replace(tmp, target)
    os.kill(supervisor, signal.SIGUSR1)
    deadline = time.monotonic() + args.timeout
    result_path = data_dir / APPLY_JSON
    shown: set[str] = set()
    while time.monotonic() < deadline:
        try:
            result = json.loads(result_path.read_text())
        except (OSError, ValueError):
            result = {}
        if result.get("generation") == generation:
            if args.output == "text":
                for c in result.get("conditions") or []:
                    line = f"  {c['type']}: {c['reason']}" + (f" - {c['message']}" if c["message"] else "")
                    if c["status"] and c["type"] in ("Progressing", "Decommissioning") and line not in shown:
                        shown.add(line)
                        print(line, flush=True)
            if result.get("done"):
                if result.get("error"):
                    raise LocalClusterError(result["error"])
                doc = read_local_json(data_dir)
                if args.output == "json":
                    print(json.dumps(doc, indent=2))
                else:
                    print(f"applied {args.file}: {len(doc['bookies'])} bookies "
                          f"({', '.join(b['id'] for b in doc['bookies'])})")
                return 0
        if running_supervisor(data_dir) is None:
            raise LocalClusterError(f"the local cluster stopped while applying; see {data_dir / 'local.log'}")
        time.sleep(0.2)
    raise LocalClusterError(f"the change to {spec.replicas} bookies did not finish within {args.timeout:.0f}s; "
                            f"it goes on in the background (see `pybk local status --data-dir {data_dir}` and "
                            f"{data_dir / 'local.log'}); applying another manifest takes over from it")

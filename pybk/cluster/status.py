"""Status of a BookieCluster from a plan and an observation: counts and conditions.

Conditions follow the Kubernetes convention (type, status "True"/"False", reason, message,
observedGeneration, lastTransitionTime); the transition time only moves when status flips.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Iterable

from .actions import SetCondition
from .observed import Observed, Registration


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def conditions(new: Iterable[SetCondition], old: list[dict[str, Any]] | None, generation: int,
               now: str | None = None) -> list[dict[str, Any]]:
    """Merge SetConditions into the previous condition list, keeping transition times."""
    now = now or now_rfc3339()
    previous = {c.get("type"): c for c in (old or [])}
    out: list[dict[str, Any]] = []
    for c in new:
        status = "True" if c.status else "False"
        before = previous.get(c.type)
        since = before.get("lastTransitionTime") if before and before.get("status") == status else None
        out.append({"type": c.type, "status": status, "reason": c.reason, "message": c.message,
                    "observedGeneration": generation, "lastTransitionTime": since or now})
    return out


def status(observed: Observed, actions: list, old_status: dict[str, Any] | None, generation: int,
           selector: str | None = None, now: str | None = None) -> dict[str, Any]:
    """The whole `.status` object to write."""
    old_status = old_status or {}
    registered = {o: b for o, b in observed.bookies.items()}
    writable = sorted(b.bookie_id for b in registered.values() if b.registration is Registration.WRITABLE)
    readonly = sorted(b.bookie_id for b in registered.values() if b.registration is Registration.READONLY)
    st: dict[str, Any] = {
        "observedGeneration": generation,
        "replicas": observed.replicas,
        "readyReplicas": observed.ready,
        "writableBookies": writable,
        "readonlyBookies": readonly,
        "conditions": conditions([a for a in actions if isinstance(a, SetCondition)],
                                 old_status.get("conditions"), generation, now),
    }
    if selector:
        st["selector"] = selector
    meta = observed.metadata
    if meta is not None:
        st["underReplicatedLedgers"] = meta.under_replicated
        if meta.last_audit:
            st["lastAudit"] = meta.last_audit
    elif "underReplicatedLedgers" in old_status:
        st["underReplicatedLedgers"] = old_status["underReplicatedLedgers"]
    draining = [b for o, b in sorted(observed.bookies.items())
                if b.decommission.value in ("in_progress", "failed", "done") and b.pod_exists]
    if draining:
        b = draining[-1]
        st["decommissioning"] = {"bookie": b.bookie_id, "ordinal": b.ordinal,
                                 "ledgersLeft": b.ledgers_left if b.ledgers_left is not None else -1,
                                 "state": b.decommission.value}
    else:
        st["decommissioning"] = None
    return st

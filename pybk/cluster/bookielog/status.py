"""The `.status` of a BookieLog from an observation and the plan's Ready condition."""
from __future__ import annotations

from typing import Any

from pybk.cluster.status import conditions

from .actions import SetCondition
from .observed import Observed
from .spec import BookieLogSpec


def status(spec: BookieLogSpec, observed: Observed, actions: list, old_status: dict[str, Any] | None,
           managed_id: int | None, now: str | None = None) -> dict[str, Any]:
    """The whole status to write: the log's offsets, segments, bytes, epoch, writer, cursors and the
    open segment's replication when it was observed (else the last known values), and conditions."""
    old_status = old_status or {}
    st: dict[str, Any] = {
        "observedGeneration": spec.generation,
        "logName": spec.log,
        "conditions": conditions([a for a in actions if isinstance(a, SetCondition)],
                                 old_status.get("conditions"), spec.generation, now),
    }
    if managed_id is not None:
        st["logId"] = managed_id
    log = observed.log
    if log is not None and log.log_id == managed_id:
        st.update(startOffset=log.start_offset, endOffset=log.end_offset, segments=len(log.segments),
                  bytes=log.bytes, epoch=log.epoch, writer=log.writer or "",
                  cursors=[{"name": c.name, "offset": c.offset, "lag": c.lag} for c in log.cursors])
        rep = log.open_replication
        st["replication"] = (None if rep is None else
                             {"ensemble": rep.ensemble, "writeQuorum": rep.write_quorum, "ackQuorum": rep.ack_quorum})
    else:
        for key in ("startOffset", "endOffset", "segments", "bytes", "epoch", "writer", "cursors", "replication"):
            if key in old_status:
                st[key] = old_status[key]
    return st

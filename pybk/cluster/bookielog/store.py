"""The log side of a BookieLog: observe the log through `pybk.log.Logs`, and carry out the
controller's actions on it. Shared by the operator and the local platform; what surrounds it
(the BookieCluster, the Secret, the status) is each platform's own."""
from __future__ import annotations

import logging

from pybk.entry import password_hash
from pybk.log import LogError, LogNotFoundError, Logs, SegmentState

from .actions import Action, AdoptLog, CreateLog, DeleteLog, ReconfigureLog, TruncateLog
from .observed import LogObservation, Replication
from .spec import BookieLogSpec

log = logging.getLogger(__name__)


async def observe_log(logs: Logs, name: str, password: bytes | None) -> LogObservation | None:
    """The log called `name` (None if there is none): its configuration, whether `password` is
    its password, head, offsets, segments, cursors, and the open segment's replication."""
    try:
        ref = await logs.ref(name)
    except LogNotFoundError:
        return None
    matches = password is not None and password_hash(password) == ref.password_hash
    try:
        d = await logs.describe(name, password if matches else None)
    except LogNotFoundError:
        return None
    open_rep = None
    for s in reversed(d.segments):
        if s.state is SegmentState.OPEN:
            md = await logs.bk.store.ledgers.get(s.ledger_id)
            open_rep = Replication(md.ensemble_size, md.write_quorum, md.ack_quorum)
            break
    return LogObservation(log_id=d.log_id, config=d.config, password_matches=matches, epoch=d.epoch,
                          writer=d.writer, start_offset=d.start_offset, end_offset=d.end_offset,
                          segments=tuple(d.segments), cursors=tuple(d.cursors), open_replication=open_rep)


class LogChangedError(LogError):
    """The name points to another log than the one the actions were planned for."""


async def _still(logs: Logs, name: str, log_id: int | None) -> None:
    """Act only on the log that was observed: the name may have been deleted and created again
    since (the controller then decides anew, LogReplaced)."""
    now = (await logs.ref(name)).log_id
    if now != log_id:
        raise LogChangedError(f"log {name!r} is now id {now}, not id {log_id} as observed: looking again")


async def execute(logs: Logs, spec: BookieLogSpec, password: bytes | None, actions: list[Action],
                  managed_id: int | None) -> int | None:
    """Carry out the actions in order; returns the managed log id afterwards."""
    name = spec.log
    for a in actions:
        if isinstance(a, (ReconfigureLog, TruncateLog)):
            await _still(logs, name, managed_id)
        if isinstance(a, CreateLog):
            ref = await logs.create(name, a.config, password=password)
            managed_id = ref.log_id
            log.info("created log %r (id %d) on cluster %r for BookieLog %s/%s", name, ref.log_id, spec.cluster,
                     spec.namespace, spec.name)
        elif isinstance(a, AdoptLog):
            managed_id = a.log_id
            log.info("BookieLog %s/%s adopted the existing log %r (id %d)", spec.namespace, spec.name, name, a.log_id)
        elif isinstance(a, ReconfigureLog):
            await logs.reconfigure(name, a.config, password=password)
            log.info("reconfigured log %r: %s", name, "; ".join(a.changes))
        elif isinstance(a, TruncateLog):
            start = await logs.truncate(name, a.before, password=password)
            log.info("retention of log %r: it now starts at offset %d", name, start)
        elif isinstance(a, DeleteLog):
            try:
                await _still(logs, name, a.log_id)
                await logs.delete(name, password=None if a.force else password, force=a.force)
            except LogNotFoundError:
                pass
            log.info("deleted log %r (id %d)%s", name, a.log_id, " with the admin role" if a.force else "")
    return managed_id

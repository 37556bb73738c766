"""The plan of a log scan that pybk's JVM reader reads (its Java side: LogPlan.java).

The partitions are the Python planner's (`logreader.batch_partitions`: which logs, from where
to where, data loss, the edges' entries), with what an executor's JVM needs to read them with no
Python: each ledger's digest type, its ensembles as bookie addresses, and the credentials' files.
A scan the JVM cannot read (a striped ensemble, option reader=python) is answered "python": the
Python data source then reads all of it.
"""
from __future__ import annotations

import base64
import json
from typing import Any, Mapping

from pybk.security.settings import ENV

from ..logoptions import LogReadOptions, ScanReader, is_log_options
from ..options import OptionError
from ..runtime import client, with_credentials


async def _address(bk, bookie_id: str, known: dict[str, str]) -> str:
    """Where a bookie listens (remembered in `known` for the plan's other partitions); for one not
    registered now (down), its id, which names its host and port (the JVM then fails to reach it
    and reads the other replicas, as the Python reader does)."""
    from pybk.client.errors import BookieUnavailableError
    if bookie_id not in known:
        try:
            known[bookie_id] = await bk.address(bookie_id)
        except BookieUnavailableError:
            known[bookie_id] = bookie_id
    return known[bookie_id]


def handles(options: Mapping[str, str]) -> bool:
    """Whether the JVM reads batch scans with these options: reads of logs, unless option reader
    says python (options that do not parse: the JVM's planning reports them)."""
    if not is_log_options(options):
        return False
    try:
        return LogReadOptions.parse(options).reader is not ScanReader.PYTHON
    except OptionError:
        return True


async def plan(options: Mapping[str, str], schema_json: str) -> dict[str, Any]:
    """{"partitions": [...], "security", "failOnDataLoss", "timeoutMs"}, or {"python": why}."""
    from pyspark.sql.types import StructType

    from ..logreader import batch_partitions
    from ..logscan import LogPartition, projection
    opts = with_credentials(LogReadOptions.parse(options))
    projection(StructType.fromJson(json.loads(schema_json)))   # the columns asked for are log columns
    bk = await client(opts.metadata_uri, opts.security)
    parts = []
    ledgers: dict[int, Any] = {}
    addresses: dict[str, str] = {}
    for p in await batch_partitions(opts):
        if not isinstance(p, LogPartition):
            continue
        md = ledgers.get(p.ledger_id)
        if md is None:
            md = ledgers[p.ledger_id] = await bk.ledger_metadata(p.ledger_id)
        if md.ensemble_size != md.write_quorum:
            return {"python": f"ledger {md.ledger_id} is striped (ensemble {md.ensemble_size} > write quorum "
                              f"{md.write_quorum})"}
        frags = [f for i, f in enumerate(md.fragments)
                 if f.first_entry_id <= p.last_entry and (i + 1 == len(md.fragments)
                                                          or md.fragments[i + 1].first_entry_id > p.first_entry)]
        parts.append({
            "log": p.log, "ledger": p.ledger_id, "first": p.first_entry, "last": p.last_entry,
            "segFirst": p.seg_first, "lo": p.lo, "hi": p.hi, "digest": md.digest_type.value,
            "password": base64.b64encode(p.password).decode(),
            "fragments": [[f.first_entry_id, [await _address(bk, b, addresses) for b in f.bookies]] for f in frags],
        })
    security = opts.security.as_mapping() if opts.security is not None else None
    return {"partitions": parts, "security": security, "securityEnv": ENV, "failOnDataLoss": opts.fail_on_data_loss,
            "timeoutMs": int(bk.options.read_timeout * 1000)}

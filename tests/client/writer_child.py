"""A ledger writer run as a child process by the fault tests, so it can be killed with -9.

Usage: python writer_child.py URI E QW QA COUNT WINDOW
Prints `LEDGER <id>` once the ledger exists, then `ACK <entry id>` for every acked entry
(flushed at once), and `DONE` after COUNT entries (COUNT < 0: forever). Payloads are
`client_helpers.payload(ledger_id, entry_id)`.
"""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from client_helpers import payload  # noqa: E402

from pybk.client import BookKeeper  # noqa: E402


async def main(uri: str, e: int, qw: int, qa: int, count: int, window: int) -> None:
    bk = await BookKeeper.connect(uri)
    lh = await bk.create_ledger(e, qw, qa, password=b"pw")
    print(f"LEDGER {lh.ledger_id}", flush=True)
    sem = asyncio.Semaphore(window)
    out = sys.stdout

    def acked(fut):
        sem.release()
        if not fut.cancelled() and fut.exception() is None:
            out.write(f"ACK {fut.result()}\n")
            out.flush()

    i = 0
    while count < 0 or i < count:
        await sem.acquire()
        lh.add_entry_async(payload(lh.ledger_id, i)).add_done_callback(acked)
        i += 1
    await lh.close()
    print("DONE", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], *map(int, sys.argv[2:])))

"""A log client run as a child process by the fault tests, so it can be killed with -9 at a failpoint.

Usage: python log_child.py URI NAME PASSWORD FAILPOINT ACTION ARG
ACTION `append`: open a writer and append b"record-%06d" % (ARG + i) for i = 0, 1, ... pipelined,
printing `ACK <offset> <i>` for each acknowledged record. `truncate`: truncate before offset ARG.
`delete`: delete the log. At FAILPOINT (or never, for `none`) it prints `AT <failpoint>` and stops
there for good, as a process that died at that step would.
"""
from __future__ import annotations

import asyncio
import sys

from pybk.client import BookKeeper
from pybk.log import Logs, WriterOptions, failpoints


async def main(uri: str, name: str, password: str, point: str, action: str, arg: int) -> None:
    if point != "none":
        async def stop_here(at: str) -> None:
            print(f"AT {at}", flush=True)
            await asyncio.Event().wait()
        failpoints.arm(point, stop_here)
    bk = await BookKeeper.connect(uri)
    logs = Logs(bk)
    pw = password.encode()
    if action == "truncate":
        await logs.truncate(name, arg, password=pw)
    elif action == "delete":
        await logs.delete(name, password=pw)
    else:
        w = await logs.open_writer(name, password=pw, options=WriterOptions(batch_bytes=60))
        print(f"OPEN {w.epoch}", flush=True)
        i = 0
        while True:
            pending = [(i + k, w.append_nowait(b"record-%06d" % (arg + i + k))) for k in range(20)]
            for k, p in pending:
                await p
                print(f"ACK {p.offset} {k}", flush=True)
            i += 20
    print("DONE", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6], int(sys.argv[6])))

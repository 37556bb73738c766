"""A separate process that takes a lock or campaigns for leadership and then holds it until killed.

Usage: python meta_holder.py URI lock|lead NAME VALUE; prints HELD/LEADING once it holds it.
"""
import asyncio
import sys

from pybk.meta import MetadataStore


async def main(uri: str, what: str, name: str, value: str) -> None:
    store = await MetadataStore.connect(uri)
    if what == "lock":
        await store.locks.acquire(name, value.encode())
        print("HELD", flush=True)
    else:
        await store.election.campaign(value, name=name)
        print("LEADING", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))

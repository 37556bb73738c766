"""Pure output helpers of `pybk shell` (and the Spark jobs' text output): tables, sizes, times,
payload previews and the JSON form of bytes and entries."""
from __future__ import annotations

import base64
import time
from typing import Any, Sequence


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], empty: str = "(none)") -> str:
    """Left-aligned columns under upper-case headers, None shown blank; `empty` when there are
    no rows. Every table pybk prints for people (shell commands, Spark jobs) comes from here."""
    if not rows:
        return empty
    cells = [[str(h).upper() for h in headers]] + [["" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def payload_preview(data: bytes, limit: int = 60) -> str:
    """Printable UTF-8 as text (quoted, cut at limit), anything else as hex."""
    try:
        text = data.decode("utf-8")
        if text.isprintable():
            return repr(text[:limit]) + ("..." if len(text) > limit else "")
    except UnicodeDecodeError:
        pass
    shown = data[: limit // 2].hex()
    return f"0x{shown}" + ("..." if len(data) > limit // 2 else "")


def bytes_json(data: bytes) -> str:
    """Bytes in JSON output are base64 (standard alphabet)."""
    return base64.b64encode(data).decode("ascii")


def entry_json(entry_id: int, data: bytes) -> dict[str, Any]:
    """One entry for `-o json`: id, length, base64 payload, and the text when it is UTF-8."""
    try:
        text: str | None = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {"entry_id": entry_id, "length": len(data), "payload_base64": bytes_json(data), "payload_text": text}


def ctime_text(ms: int | None) -> str:
    """A creation time in epoch milliseconds as UTC text, "-" when unset."""
    if not ms:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + "Z"


def last_text(v: int | None) -> str:
    """An entry id for people: "-" for none (None or -1)."""
    return "-" if v is None or v < 0 else str(v)


def human_bytes(n: int | None) -> str:
    """1536 -> '1.5 KiB'."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


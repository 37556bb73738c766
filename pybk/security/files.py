"""What a server or client looks at to notice that files it loaded were replaced (a rotated
Kubernetes Secret, an edited auth file): one stamp per file, compared between looks."""
from __future__ import annotations

import os
from typing import Iterable

__all__ = ["file_stamps"]


def file_stamps(paths: Iterable[str | None]) -> tuple:
    """(path, mtime, size, inode) per path, following symbolic links as Secret volumes use;
    (path, None) for a path that is unset or cannot be read. Equal stamps: nothing changed."""
    out = []
    for p in paths:
        try:
            st = os.stat(p) if p else None
        except OSError:
            st = None
        out.append((p, st.st_mtime_ns, st.st_size, st.st_ino) if st else (p, None))
    return tuple(out)

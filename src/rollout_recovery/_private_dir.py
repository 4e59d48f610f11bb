"""Whether a directory is private to this user: the one check behind every socket
directory the job trusts (the launched servers', their guards', a run's warm standby).

Standard library only: a rerun handed to its warm standby runs this before it imports
anything else (``cli/_standby_link.py``).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["private_dir_problem"]


def private_dir_problem(directory: Path) -> str | None:
    """Why ``directory`` is not a private directory of this user (a symlink or not a
    directory, another owner, or one another user may enter or write to), or None; a
    socket in such a directory could be another user's. ``OSError`` where it cannot be
    looked at."""
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return (
            f"not a private directory of this user (mode {stat.filemode(info.st_mode)}, "
            f"owner {info.st_uid})"
        )
    return None

"""Writing a file so that a reader (or a crash) sees the old text or the new, never half.

Its own module, free of heavy imports: `tpukit run` writes its reports with it after the
script, where importing the migrate engine (libcst) would cost a second."""

from __future__ import annotations

import os
import re
import stat
import tempfile
import time
from pathlib import Path

TEMP_SUFFIX = ".tpukit"
# `.NAME.XXXXXXXX.tpukit`: mkstemp's 8 random characters between our prefix and suffix.
_TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.[a-z0-9_]{8}" + re.escape(TEMP_SUFFIX) + "$")


def atomic_write(path: Path, text: str, mode: int | None = None, *,
                 like: os.stat_result | None = None, encoding: str = "utf-8") -> None:
    """Write via a temporary file in the same folder and os.replace: old or new, never half.
    `like`: the file being replaced, whose mode and owner (uid:gid) the new file keeps."""
    if like is not None:
        mode = like.st_mode
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "w", encoding=encoding, newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, stat.S_IMODE(mode) if mode is not None else 0o644)
        if like is not None:
            _keep_owner(tmp, like)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _keep_owner(tmp: str, like: os.stat_result) -> None:
    written = os.stat(tmp)
    if (written.st_uid, written.st_gid) != (like.st_uid, like.st_gid):
        # Raises PermissionError where this user may not give the file its owner back:
        # the original stays as it was rather than change hands.
        os.chown(tmp, like.st_uid, like.st_gid)
        if stat.S_IMODE(like.st_mode) & (stat.S_ISUID | stat.S_ISGID):
            os.chmod(tmp, stat.S_IMODE(like.st_mode))  # chown clears set-id bits


# A write lasts milliseconds: a temporary file older than this is no live write's (another
# tpukit migrate, or `tpukit run --json` rewriting its partial report, in the same folder).
STALE_AFTER_S = 60


def stale_temp_files(folder: Path, now: float | None = None) -> list[Path]:
    """Temporary files of ours in `folder` that a killed run left behind (a SIGKILL between
    the write and the rename): `.NAME.XXXXXXXX.tpukit`, untouched for STALE_AFTER_S."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    now = time.time() if now is None else now
    found = []
    for name in names:
        if not (name.endswith(TEMP_SUFFIX) and _TEMP_NAME.match(name)):
            continue
        try:
            if now - os.stat(folder / name).st_mtime > STALE_AFTER_S:
                found.append(folder / name)
        except OSError:  # renamed or removed meanwhile: a live write after all
            pass
    return found


def remove_stale_temp_files(folders) -> int:
    """Remove our leftover temporary files from `folders`; how many were removed."""
    removed = 0
    for folder in dict.fromkeys(folders):
        for leftover in stale_temp_files(folder):
            try:
                leftover.unlink()
                removed += 1
            except OSError:
                pass
    return removed

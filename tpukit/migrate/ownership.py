"""Whose code a file is: decided once per file, from what the user says, and nowhere else.

- **program**: everything the user names (files, folders, a whole repository with packages of
  its own) and the local modules a named script imports. Ported whole, one answer everywhere
  to "is there a CUDA device".
- **foreign**: someone else's code. An installed package (under a `site-packages` or
  `dist-packages` folder, or listed in a `*.dist-info/RECORD` beside it, as `pip install
  --target` leaves it), and the folders the user marks as libraries (`--library PATH`,
  `[tool.tpukit] library = [...]`). Never rewritten: `tpukit run`'s runtime layer is what
  handles CUDA calls there.
- **library**: code ported in *library mode* (`--library-mode`), for a library's own authors: a
  package module keeps its own choices as written, each with a finding (its tests of the
  host's CUDA and what they guard, its seeds, its launcher variables, its own choice of
  device, torch.save). A standalone script of the library (an example, a benchmark) is still
  a program.

"""

from __future__ import annotations

import functools
import site
import sysconfig
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from tpukit.config import real_path


class Owner(str, Enum):
    PROGRAM = "program"
    LIBRARY = "library"
    FOREIGN = "foreign"


_INSTALL_FOLDERS = {"site-packages", "dist-packages"}


@functools.cache
def _install_roots() -> tuple[Path, ...]:
    """This interpreter's package folders (a venv's, the user's, the system's)."""
    roots = set()
    for key in ("purelib", "platlib"):
        try:
            roots.add(real_path(Path(sysconfig.get_paths()[key])))
        except (KeyError, OSError):
            pass
    for folder in [*getattr(site, "getsitepackages", lambda: [])(), site.getusersitepackages()]:
        roots.add(real_path(Path(folder)))
    return tuple(roots)


@functools.cache
def _recorded(folder: Path) -> frozenset[str]:
    """The files the `*.dist-info/RECORD`s in `folder` list, relative to it: what pip
    installed there (`pip install --target DIR` leaves no site-packages in the path)."""
    listed: set[str] = set()
    try:
        infos = [p for p in folder.iterdir() if p.name.endswith(".dist-info")]
    except OSError:
        return frozenset()
    for info in infos:
        try:
            text = (info / "RECORD").read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        listed.update(line.split(",", 1)[0] for line in text.splitlines() if line)
    return frozenset(listed)


def installed(path: Path) -> bool:
    """Is `path` part of an installed package?"""
    resolved = real_path(path)
    if any(part in _INSTALL_FOLDERS for part in resolved.parts[:-1]):
        return True
    if any(root in resolved.parents for root in _install_roots()):
        return True
    for folder in resolved.parents:
        records = _recorded(folder)
        if records and resolved.relative_to(folder).as_posix() in records:
            return True
    return False


def _shown(folder: Path) -> str:
    try:
        return folder.relative_to(real_path(Path.cwd())).as_posix() or "."
    except ValueError:
        return folder.as_posix()


@dataclass(frozen=True)
class Ownership:
    """What the user said: the folders that are libraries, and whether the named code is a
    library to port in library mode."""

    library_folders: tuple[Path, ...] = ()
    library_mode: bool = False

    def of(self, path: Path) -> tuple[Owner, str]:
        """(whose `path` is, why), the reason in words for the summary."""
        resolved = real_path(path)
        marked = next((f for f in self.library_folders
                       if f == resolved or f in resolved.parents), None)
        if marked is not None:
            return (Owner.LIBRARY if self.library_mode else Owner.FOREIGN,
                    f"under the library folder {_shown(marked)}")
        if installed(resolved):
            return (Owner.LIBRARY if self.library_mode else Owner.FOREIGN,
                    "part of an installed package")
        return (Owner.LIBRARY if self.library_mode else Owner.PROGRAM,
                "library mode" if self.library_mode else "named")

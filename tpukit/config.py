"""`[tool.tpukit]` in the nearest pyproject.toml: select, ignore, exclude, target, eager-mode,
library (folders that are someone else's code), library-mode."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from tpukit.rules import TARGETS

KEYS = {"select", "ignore", "exclude", "target", "unsafe-fixes", "eager-mode", "library",
        "library-mode"}
# TorchTPU's eager modes, by the name `--eager-mode` takes: the `torch.tpu.EagerMode` member.
EAGER_MODES = {
    "debug": "DEFER_NEVER_AND_LAUNCH_BLOCKING",
    "strict": "DEFER_NEVER",
    "fused": "DEFER_AND_FUSE",
}
DEFAULT_EAGER_MODE = "fused"


class ConfigError(Exception):
    pass


@dataclass
class Config:
    select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    target: str = "xla"
    unsafe_fixes: bool = False
    eager_mode: str | None = None  # torchtpu only; None: the default, fused
    path: Path | None = None  # the pyproject.toml it came from
    root: Path = field(default_factory=Path.cwd)  # exclude patterns are relative to this
    # Folders of someone else's code (ownership.py), relative to `root`: never rewritten.
    library: list[str] = field(default_factory=list)
    library_mode: bool = False  # port the named code as a library (ownership.py)


def real_path(path: Path) -> Path:
    """`path` with links resolved as far as they go: a link loop is left as it is (Path.resolve
    raises on one), and reading it later is that file's error."""
    return Path(os.path.realpath(path))


def display_path(path: Path) -> str:
    """`path` as the user sees it: relative to the working directory when it is under it, else
    as given. abspath, not resolve: a symlink is shown under its own name."""
    absolute = Path(os.path.abspath(path))
    try:
        return absolute.relative_to(real_path(Path.cwd())).as_posix()
    except ValueError:
        return path.as_posix()


def find_pyproject(start: Path) -> Path | None:
    start = real_path(start)
    for folder in [start, *start.parents] if start.is_dir() else start.parents:
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def load_config(start: Path) -> Config:
    path = find_pyproject(start)
    if path is None:
        return Config()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    section = data.get("tool", {}).get("tpukit")
    if section is None:
        return Config(root=path.parent)
    unknown = set(section) - KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown [tool.tpukit] keys: {', '.join(sorted(unknown))}")
    for key in ("select", "ignore", "exclude", "library"):
        value = section.get(key, [])
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise ConfigError(f"{path}: [tool.tpukit] {key} must be a list of strings")
    target = section.get("target", "xla")
    if target not in TARGETS:
        raise ConfigError(f"{path}: [tool.tpukit] target must be one of {', '.join(TARGETS)}")
    eager_mode = section.get("eager-mode")
    if eager_mode is not None and eager_mode not in EAGER_MODES:
        raise ConfigError(
            f"{path}: [tool.tpukit] eager-mode must be one of {', '.join(EAGER_MODES)}")
    return Config(
        select=section.get("select", []),
        ignore=section.get("ignore", []),
        exclude=section.get("exclude", []),
        target=target,
        unsafe_fixes=bool(section.get("unsafe-fixes", False)),
        eager_mode=eager_mode,
        library=section.get("library", []),
        library_mode=bool(section.get("library-mode", False)),
        path=path,
        root=path.parent,
    )

"""The local modules a script imports: what `python train.py` would import from the script's
own folder (its `sys.path[0]`), followed transitively.

`tpukit migrate train.py` ports them with the script: a `model.py` beside it that decides fused
AdamW on `device_type == 'cuda'`, a config module holding `backend = 'nccl'`, a logging helper
allocating `torch.cuda.FloatTensor(1)`, all run in the ported process, so a port of the script
alone would still crash or stay on CUDA. Only files under the script's folder are followed
(never an installed package, a virtual environment or a hidden folder), with Python's `ast`
(no import is executed and torch is never imported).

Folders named beside the script are the user's too: `tpukit migrate projects/chargpt/chargpt.py
mingpt` (minGPT, whose script imports `mingpt.trainer` from the repository's root, installed
or on PYTHONPATH) finds `mingpt/trainer.py` inside the named `mingpt`: a named package is
looked up from its parent folder, a named plain folder from itself, and only files inside the
named folder count.
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

from tpukit.config import real_path

_SKIP = {".venv", "venv", "__pycache__", "node_modules", "site-packages", ".tox", ".git"}


def _module_file(root: Path, dotted: str) -> list[Path]:
    """`a.b.c` under `root`: the packages' `__init__.py` files and the module's own file,
    as importing it runs them; [] when it is not a local module."""
    parts = [p for p in dotted.split(".") if p]
    if not parts:
        return []
    files = []
    folder = root
    for i, part in enumerate(parts):
        if i == len(parts) - 1 and (folder / f"{part}.py").is_file():
            files.append(folder / f"{part}.py")
            break
        if (folder / part / "__init__.py").is_file():
            files.append(folder / part / "__init__.py")
        elif not (folder / part).is_dir():  # not a module (a name `from pkg import` binds)
            break
        folder = folder / part  # a package, or a namespace package (nothing of its own runs)
    return files


def _type_checking(test: ast.expr) -> bool:
    """`TYPE_CHECKING` (`typing.TYPE_CHECKING`), alone or or-ed with a flag: the branch type
    checkers read, False when the program runs (unless a flag such as diffusers'
    `DIFFUSERS_SLOW_IMPORT` asks for every import at once)."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        return any(_type_checking(value) for value in test.values)
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        and isinstance(test.value, ast.Name) and test.value.id in ("typing", "typing_extensions"))


def _run_imports(tree: ast.Module):
    """The import statements that run, in source order: those under `if TYPE_CHECKING:` do
    not (a lazily importing package such as diffusers lists its whole tree there, and
    `tpukit migrate script.py` followed all 1,085 of its modules)."""
    queue: deque[ast.AST] = deque([tree])
    while queue:
        node = queue.popleft()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        if isinstance(node, ast.If) and _type_checking(node.test):
            queue.extend(node.orelse)
            continue
        queue.extend(ast.iter_child_nodes(node))


def _imported(path: Path, tree: ast.Module, roots: list[Path]) -> list[Path]:
    """The files `path` imports, each absolute import looked up under every root."""
    found: list[Path] = []
    for node in _run_imports(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                for root in roots:
                    found += _module_file(root, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the importing module's package
                base = path.parent
                for _ in range(node.level - 1):
                    base = base.parent
                bases = [base]
            else:
                bases = roots
            prefix = node.module or ""
            for base in bases:
                found += _module_file(base, prefix) if prefix else []
                for alias in node.names:  # `from pkg import module`
                    if alias.name != "*":
                        found += _module_file(
                            base, f"{prefix}.{alias.name}" if prefix else alias.name)
    return found


def _lookup(folder: Path) -> tuple[Path, Path]:
    """(where imports are looked up, what they must lie under) for a folder named beside a
    script: a package from its parent (`import mingpt` finds the named `mingpt/`), a plain
    folder (a repository's root) from itself."""
    folder = real_path(folder)
    if (folder / "__init__.py").is_file():
        return folder.parent, folder
    return folder, folder


def _skipped(path: Path, root: Path) -> bool:
    parts = path.relative_to(root).parts[:-1]
    return any(p.startswith(".") or p in _SKIP for p in parts)


def local_modules(script: Path, folders: list[Path] | tuple[Path, ...] = ()) -> list[Path]:
    """The `.py` files under `script`'s folder, or inside one of `folders` (named beside it),
    that running it imports, in the order found (the script itself excluded). A file that
    does not parse is not followed further."""
    root = real_path(script).parent
    places = [(root, root)] + [_lookup(f) for f in folders]
    roots = list(dict.fromkeys(base for base, _ in places))
    seen = {real_path(script)}
    queue, found = [real_path(script)], []
    while queue:
        current = queue.pop(0)
        try:
            tree = ast.parse(current.read_bytes(), filename=str(current))
        except (SyntaxError, ValueError, OSError, RecursionError):
            continue
        for candidate in _imported(current, tree, roots):
            resolved = real_path(candidate)
            inside = next((top for _, top in places
                           if top in resolved.parents and not _skipped(resolved, top)), None)
            if resolved in seen or inside is None:
                continue
            seen.add(resolved)
            queue.append(resolved)
            found.append(script.parent / resolved.relative_to(root) if inside == root
                         else resolved)
    return found

"""Where a redirected CUDA call came from: the line that made it (a package's or the
program's), the program's line that led there, and whether the migrator should have ported it.

A call site is recorded once: the caller's code object and instruction are the key, so a call
made every step costs a dict lookup after its first time, never a walk of the stack."""

from __future__ import annotations

import ast
import linecache
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

_TPUKIT = str(Path(__file__).resolve().parents[1]) + "/"


def _torch_root() -> str | None:
    torch = sys.modules.get("torch")
    if torch is None or not getattr(torch, "__file__", None):
        return None
    return str(Path(torch.__file__).resolve().parent) + "/"


def _library_roots() -> tuple[str, ...]:
    """torch's and Python's own folders: frames there are the machinery between the code that
    made a call and the layer (Module.to -> _apply, autocast's subclasses), never its site."""
    roots = {_TPUKIT}
    for key in ("stdlib", "platstdlib"):
        try:
            roots.add(str(Path(sysconfig.get_paths()[key]).resolve()) + "/")
        except (KeyError, OSError):
            pass
    if _torch_root():
        roots.add(_torch_root())
    return tuple(roots)


@dataclass
class Redirect:
    """One call site the layer acted on."""

    api: str  # what was called, as written in torch: "torch.zeros(device='cuda')", "torch.cuda.synchronize"
    action: str  # what the layer did, in words
    refused: bool
    path: str  # the line that made the call
    line: int
    col: int  # 1-based, where the call's expression starts (1 where unknown)
    program_path: str | None  # the program's line that led there (the same line for program code)
    program_line: int | None
    in_program: bool  # the site itself is program code
    literal: bool  # the call's own text holds the CUDA device (the migrator ports that)
    count: int = 0
    code: str = ""  # the call's source text, where it could be read


@dataclass
class CallSites:
    """The redirected call sites of one run; `program_roots`: the folders of the code the user
    named (the script's folder), whose files not installed as packages are the program."""

    program_roots: tuple[str, ...]
    redirects: dict[tuple, Redirect] = field(default_factory=dict)
    _by_frame: dict[tuple, Redirect] = field(default_factory=dict)
    _skip: tuple[str, ...] = field(default_factory=_library_roots)
    torch_root: str | None = field(default_factory=_torch_root)
    _program_cache: dict[str, bool] = field(default_factory=dict)

    def note(self, api: str, action: str, depth: int = 2, refused: bool = False) -> Redirect:
        """Records a call to `api` made `depth` frames above this one (torch's and tpukit's own
        frames between are passed over: the site is the code that called into them); returns
        its record."""
        caller = sys._getframe(depth)
        skip = self._skip
        while caller.f_back is not None and caller.f_code.co_filename.startswith(skip):
            caller = caller.f_back
        key = (caller.f_code, caller.f_lasti, api)
        found = self._by_frame.get(key)
        if found is None:
            found = self._by_frame[key] = self._locate(caller, api, action, refused)
        found.count += 1
        return found

    def is_program(self, filename: str) -> bool:
        known = self._program_cache.get(filename)
        if known is None:
            known = self._program_cache[filename] = self._classify(filename)
        return known

    def _classify(self, filename: str) -> bool:
        if filename.startswith("<"):
            return False
        resolved = Path(filename).resolve()
        text = str(resolved)
        if not any(text.startswith(root) for root in self.program_roots):
            return False
        from tpukit.migrate.ownership import installed

        return not installed(resolved)

    def _locate(self, site, api: str, action: str, refused: bool) -> Redirect:
        program = site
        while program is not None and not self.is_program(program.f_code.co_filename):
            program = program.f_back
        text, col = _call_text(site)
        record = Redirect(
            api=api, action=action, refused=refused, path=site.f_code.co_filename,
            line=site.f_lineno, col=col, program_path=program.f_code.co_filename if program else None,
            program_line=program.f_lineno if program else None,
            in_program=program is site, literal=_names_cuda(text, api), code=text or "")
        self.redirects[(record.path, record.line, record.col, api)] = record
        return record

    def records(self) -> list[Redirect]:
        return sorted(self.redirects.values(), key=lambda r: (r.path, r.line, r.col, r.api))


def _call_text(frame) -> tuple[str | None, int]:
    """The source of the expression the frame is executing (the call that reached the layer),
    and its 1-based column."""
    try:
        positions = list(frame.f_code.co_positions())[frame.f_lasti // 2]
    except (AttributeError, IndexError):
        return None, 1
    start, end, col, end_col = positions
    if None in positions:
        return None, 1
    lines = [linecache.getline(frame.f_code.co_filename, n) for n in range(start, end + 1)]
    if not all(lines):
        return None, col + 1
    if len(lines) == 1:
        return lines[0][col:end_col], col + 1
    return "".join([lines[0][col:], *lines[1:-1], lines[-1][:end_col]]), col + 1


def _names_cuda(text: str | None, api: str) -> bool:
    """Does the call's own text hold what makes it CUDA's: a `.cuda()` call, a 'cuda' /
    'cuda:N' device or the 'nccl' backend as a string constant (what `tpukit migrate` ports
    where it is written)?"""
    if api.endswith(".cuda()"):
        return True
    if not text:
        return False
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in ("cuda", "nccl") or node.value.startswith("cuda:"):
                return True
    return False

"""Reads torch_xla's PT_XLA_DEBUG_LEVEL=2 analysis file as it grows.

torch_xla writes one block per graph compilation and per graph execution:

    Compilation Analysis: ==========...
    Compilation Analysis: Compilation Cause
    Compilation Analysis:   user torch_xla.sync
    Compilation Analysis: Graph Info:
    Compilation Analysis:   Graph Hash: e6cb26003218af4d4dfd99dea3513a2a
    Compilation Analysis:   Number of Graph Inputs: 3
    Compilation Analysis:   Number of Graph Outputs: 2
    Compilation Analysis: Python Frame Triggered Execution:
    Compilation Analysis:   sync (/.../torch_xla/torch_xla.py:87)
    Compilation Analysis:   <module> (/tmp/train.py:16)
    Compilation Analysis: ----------...
    Compilation Analysis: ==========...

Blocks of other kinds (post-compilation sizes) are skipped. A block still being written when
the file is read is kept for the next read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

_PREFIXES = {"Compilation Analysis:": "compile", "Execution Analysis:": "execute"}
_FRAME = re.compile(r"^\s+(?P<func>.*) \((?P<file>.*):(?P<line>\d+)\)$")


@dataclass
class GraphEvent:
    """One compilation or execution of an XLA graph, with the Python frames that caused it."""

    kind: str  # "compile" | "execute"
    graph_hash: str = ""
    cause: str = ""
    frames: list[tuple[str, str, int]] = field(default_factory=list)  # innermost first
    step: int = 0  # 1-based step it happened in (set by the probe)


class DebugLog:
    def __init__(self, path: Path, skip_existing: bool = False) -> None:
        """`skip_existing`: start at the file's current end (a file the user named, with
        earlier runs in it)."""
        self.path = path
        self._offset = path.stat().st_size if skip_existing and path.exists() else 0
        self._stream = None
        self._pending: dict[str, list[str]] = {"compile": [], "execute": []}

    def read_new(self) -> list[GraphEvent]:
        """Events completed since the last call, in file order."""
        if self._stream is None:
            try:
                self._stream = open(self.path, "rb")  # kept open: read at every step
            except FileNotFoundError:
                return []
        self._stream.seek(self._offset)
        data = self._stream.read()
        end = data.rfind(b"\n") + 1  # only whole lines; the rest is read next time
        self._offset += end
        events = []
        for raw in data[:end].decode("utf-8", "replace").splitlines():
            for prefix, kind in _PREFIXES.items():
                if raw.startswith(prefix):
                    event = self._feed(kind, raw[len(prefix):])
                    if event is not None:
                        events.append(event)
                    break
        return events

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def _feed(self, kind: str, text: str) -> GraphEvent | None:
        lines = self._pending[kind]
        if text.strip().startswith("====="):
            if lines:  # the closing rule of a block
                self._pending[kind] = []
                return _parse(kind, lines)
            lines.append(text)  # the opening rule
            return None
        if lines:
            lines.append(text)
        return None


def _parse(kind: str, lines: list[str]) -> GraphEvent:
    event = GraphEvent(kind)
    section = ""
    for text in lines[1:]:
        stripped = text.strip()
        if stripped.endswith("Cause"):
            section = "cause"
        elif stripped.startswith("Graph Info"):
            section = "graph"
        elif stripped.startswith("Python Frame"):
            section = "frames"
        elif stripped.startswith("-----"):
            section = ""
        elif section == "cause" and stripped:
            event.cause = f"{event.cause} {stripped}".strip()
        elif section == "graph":
            key, _, value = stripped.partition(":")
            value = value.strip()
            if key == "Graph Hash":
                event.graph_hash = value
        elif section == "frames":
            match = _FRAME.match(text)
            if match:
                event.frames.append((match["func"], match["file"], int(match["line"])))
    return event

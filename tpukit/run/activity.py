"""What the run is doing right now, for a report that must be written while the script cannot
answer: a graph barrier or a host read that is compiling or running a graph.

XLA:CPU spends minutes compiling one graph of a ViT or a UNet. A signal that lands then is
only seen by Python when the compile returns, and a SIGKILL never is; the last report would
end at the last finished step with nothing about the minutes since. So the probe's barrier and
host-read patches say when they enter and leave the runtime (`Activity.begin`/`end`), and a
watcher thread, which runs while the main thread is inside XLA (torch_xla releases the GIL
there), does two things:
- it reads the signal numbers Python's C-level handler writes to a wakeup fd
  (`signal.set_wakeup_fd`) the moment a signal arrives, says at once on stderr what the run
  was doing, and keeps it for the final report (`stopped_in`);
- while one barrier or read lasts longer than LONG_S, it has the live report (--json) written
  again every LONG_S, with what is in progress (`in_progress`), so even a SIGKILL leaves it;
- every MAPPINGS_EVERY_S it counts the process's memory mappings, and near the kernel's limit
  (which an XLA:CPU run that compiles ~1,300 graphs reaches, and then aborts) says so on
  stderr and in the live report (`mappings`) before the abort can;
- each pass it calls `tick` (storm_watch.StormWatch: a compile storm no barrier or host read
  sees is stopped from here).
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

from tpukit.run.summary import describe_activity, describe_mappings

LONG_S = 10.0  # a barrier or read running this long is worth a live report
MAPPINGS_EVERY_S = 5.0  # how often the process's memory mappings are counted
NEAR_LIMIT = 0.8  # ... and the share of the kernel's limit that is worth a warning


def mapping_limit() -> int | None:
    """The kernel's limit on one process's memory mappings (vm.max_map_count), None where it
    cannot be read. XLA:CPU's JIT keeps about 48 mappings for each compiled graph (measured:
    100 graphs, 4,980 mappings, at LLVM -O0 and at the default), so a run that compiles ~1,300
    graphs reaches the usual 65,530 and dies in LLVM ("Unable to allocate section memory", an
    abort: no Python code runs after it)."""
    try:
        with open("/proc/sys/vm/max_map_count") as limit:
            return int(limit.read())
    except (OSError, ValueError):
        return None


def mappings_in_use() -> int | None:
    try:
        with open("/proc/self/maps", "rb") as maps:
            return maps.read().count(b"\n")
    except OSError:
        return None


@dataclass
class Doing:
    call: str  # "graph barrier" | "host read"
    path: str
    line: int
    new_graph: bool | None  # a graph not seen before in this run (None: not known)
    began: float  # time.perf_counter()

    def to_dict(self, now: float | None = None) -> dict:
        now = time.perf_counter() if now is None else now
        return {"call": self.call, "path": self.path, "line": self.line,
                "doing": _doing(self.new_graph), "for_s": round(now - self.began, 3)}


def _doing(new_graph: bool | None) -> str:
    if new_graph is None:
        return "compiling or running its graph"
    return "compiling a graph not seen before in this run" if new_graph \
        else "running a graph seen before"


class Activity:
    def __init__(self) -> None:
        self.current: Doing | None = None
        self.stopped_in: dict | None = None  # what a signal found the run doing
        # the process near the kernel's limit on memory mappings: {"mappings", "limit"}
        self.mappings: dict | None = None
        self._watcher: _Watcher | None = None
        # asked by the watcher about once a second (storm_watch.StormWatch); None: nothing
        self.tick: Callable[[], None] | None = None

    def begin(self, call: str, where: tuple[str, int] | None, new_graph: bool | None) -> None:
        if where is not None:
            self.current = Doing(call, where[0], where[1], new_graph, time.perf_counter())

    def end(self) -> None:
        self.current = None

    def in_progress(self) -> dict | None:
        doing = self.current
        return doing.to_dict() if doing is not None else None

    # -- the watcher ------------------------------------------------------------------------
    def watch(self, write_live: Callable[[], None] | None) -> None:
        """Start watching (from the main thread: the wakeup fd is the main thread's)."""
        if threading.current_thread() is not threading.main_thread():
            return
        self._watcher = _Watcher(self, write_live)
        self._watcher.start()

    def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None

    def signalled(self, signum: int) -> None:
        doing = self.current
        if doing is None or self.stopped_in is not None:
            return
        self.stopped_in = {**doing.to_dict(), "signal": signal.Signals(signum).name}
        print(f"tpukit: {describe_activity(self.stopped_in)}; the script stops when it returns",
              file=sys.stderr, flush=True)


    def near_mapping_limit(self, used: int, limit: int) -> None:
        if self.mappings is not None:
            return
        self.mappings = {"mappings": used, "limit": limit}
        print(f"tpukit: {describe_mappings(self.mappings)}", file=sys.stderr, flush=True)


class _Watcher(threading.Thread):
    def __init__(self, activity: Activity, write_live: Callable[[], None] | None) -> None:
        super().__init__(name="tpukit-activity", daemon=True)
        self.activity = activity
        self.write_live = write_live
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)
        self.previous = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        self.closed = threading.Event()
        self.written: tuple[int, float] | None = None  # (id of the Doing, when) last written
        self.limit = mapping_limit()
        self.counted = 0.0  # when the mappings were last counted

    def run(self) -> None:
        while not self.closed.is_set():
            ready, _, _ = select.select([self.read_fd], [], [], 1.0)
            if ready:
                try:
                    data = os.read(self.read_fd, 64)
                except OSError:
                    return
                for signum in data:
                    if signum in (signal.SIGINT, signal.SIGTERM):
                        self.activity.signalled(signum)
                        self._write()
            self._maybe_write()
            self._count_mappings()
            tick = self.activity.tick
            if tick is not None:
                try:
                    tick()
                except Exception:  # a report aid: never the reason a run fails
                    pass

    def _count_mappings(self) -> None:
        now = time.perf_counter()
        if not self.limit or self.activity.mappings is not None \
                or now - self.counted < MAPPINGS_EVERY_S:
            return
        self.counted = now
        used = mappings_in_use()
        if used is not None and used >= NEAR_LIMIT * self.limit:
            self.activity.near_mapping_limit(used, self.limit)
            self._write()

    def _maybe_write(self) -> None:
        doing = self.activity.current
        if doing is None or self.write_live is None:
            return
        now = time.perf_counter()
        if now - doing.began < LONG_S:
            return
        if self.written and self.written[0] == id(doing) and now - self.written[1] < LONG_S:
            return
        self._write()
        self.written = (id(doing), now)

    def _write(self) -> None:
        if self.write_live is not None:
            try:
                self.write_live()
            except Exception:  # a report aid: never the reason a run fails
                pass

    def close(self) -> None:
        self.closed.set()
        try:
            signal.set_wakeup_fd(self.previous)
        except ValueError:
            pass
        self.join(timeout=2.0)
        for fd in (self.read_fd, self.write_fd):
            os.close(fd)

"""Steps grouped into loops by the line that ends them, and each loop's warm-up."""

from __future__ import annotations

from tpukit.run.steps import Step

SETTLED = 3  # quiet steps after a loop's last compile that show its warm-up is over


class Loops:
    """Steps grouped by the line that ends them: a training loop, an eval loop, ... Warm-up is
    per loop: the first K steps of each loop compile its graphs (an eval loop that first runs at
    step 500 warms up then, and its first compile there is not a recompile)."""

    def __init__(self, steps: list[Step], warmup: int) -> None:
        self.warmup = warmup
        self.ordinal: dict[int, int] = {}
        self.members: dict[tuple, list[Step]] = {}
        for step in steps:
            members = self.members.setdefault(self.key(step), [])
            members.append(step)
            self.ordinal[step.index] = len(members)
        self._settled = {key: self._settled_at(members) for key, members in self.members.items()}

    @staticmethod
    def key(step: Step) -> tuple:
        return step.boundary_at or (step.boundary, 0)

    def steady(self, step: Step) -> bool:
        return step.complete and self.ordinal[step.index] > self.warmup

    def steady_of(self, key: tuple) -> list[Step]:
        return [s for s in self.members.get(key, []) if self.steady(s)]

    def settled_at(self, key: tuple) -> int | None:
        """The loop's own warm-up, when it outlasts --warmup: every step up to the S-th compiled,
        none after, and at least SETTLED complete steps ran after; else None. (DDP's reducer
        changes the graph in a loop's first 3-4 steps, then never again.)"""
        return self._settled.get(key)

    def _settled_at(self, members: list[Step]) -> int | None:
        compiled = [bool(s.compiles) for s in members]
        if True not in compiled:
            return None
        last = len(compiled) - compiled[::-1].index(True)  # ordinal of the last compiling step
        quiet = sum(1 for s in members[last:] if s.complete)
        if last > self.warmup and all(compiled[:last]) and quiet >= SETTLED:
            return last
        return None

    def main(self) -> tuple | None:
        """The loop with the most steps (the training loop, almost always)."""
        complete = {k: v for k, v in self.members.items() if any(s.complete for s in v)}
        return max(complete, key=lambda k: len(complete[k])) if complete else None

"""The run report's `summary`, typed: the JSON object is these dataclasses' fields, in this
order, and its JSON schema (`json_schema`, in docs/run-summary.schema.json) is made from them.

No torch, no torch_xla: the renderers (tpukit.render) and `tpukit report` import it."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INLINE = {"inline": True}  # a field whose own fields are the summary's (StepStats)


@dataclass
class StepStats:
    """What the step analysis (analysis.py) found in the probe's steps."""

    steps: int  # complete training steps
    eval_batches: int  # complete evaluation batches (no backward, no optimizer step): not steps
    warmup: int  # --warmup, per loop
    steady_steps: int
    step_time_median_s: float | None  # median wall time of the main loop's steps after warm-up
    main_loop: dict  # {"path", "line"} of the loop with the most steps (+ "boundary" when no line)
    loops: list[dict]  # each loop: {"path", "line", "steps", "steady_steps", "step_time_median_s"}
    compiles: int
    compile_s: float
    distinct_graphs: int
    recompiles_after_warmup: int
    recompiles_in_long_warmup: int  # of those, in a loop whose compiles stop for good by then
    # compiles after warm-up of a line's first and only graph (code that first ran then: an
    # evaluation, a logging step, a checkpoint): not in recompiles_after_warmup
    first_graphs_after_warmup: int
    fallbacks: int  # aten:: CPU fallback calls (not counting .item())
    host_syncs: int  # device-to-host reads seen at user lines
    host_wait_s: float  # time spent inside host reads
    host_transfers: int  # torch_xla's TransferFromDevice count
    stopped_early: bool  # --max-steps ended the script
    step_records: list[dict]  # one per step: steps.Step.to_dict() and "warmup"
    # time spent hashing (and, for a new graph, lowering) each barrier's graph for graph diffs
    graph_capture_s: float = 0.0


@dataclass
class RunSummary:
    script: str
    args: list[str]
    device: str  # PJRT_DEVICE the run used
    outcome: str  # ok | exit | error | interrupted | terminated | max-steps | running
    exit_code: int
    error: str
    wall_s: float
    partial: bool  # written while the script ran
    stats: StepStats = field(metadata=INLINE)
    launches: list[dict] = field(default_factory=list)
    attention: list[dict] = field(default_factory=list)
    tpu_generation: str = ""
    profile: dict | None = None
    time_shares: dict[str, float] = field(default_factory=dict)  # compile, host_wait: of wall_s
    failed_on: list[str] = field(default_factory=list)  # the --fail-on kinds that occurred
    # findings `# tpukit: ignore[...]` comments silenced: each finding's JSON and `suppressed_by`
    suppressed: list[dict] = field(default_factory=list)
    # A partial report: the graph barrier or host read under way as it was written (call,
    # path, line, doing, for_s; activity.py). A stopped run: what the signal found the run
    # doing, with the signal's name.
    in_progress: dict | None = None
    stopped_in: dict | None = None
    # The process near the kernel's limit on memory mappings (activity.py): {"mappings", "limit"}
    mappings: dict | None = None
    # torch_xla's persistent compilation cache (compile_cache.summary): path, source,
    # read_only, problem, hits, misses, failures, load_s, hits_after_warmup; None: not asked
    compile_cache: dict | None = None

    def to_dict(self) -> dict:
        """The JSON report's `summary` object."""
        return _flat(self)


def _flat(obj) -> dict:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.metadata.get("inline"):
            out.update(_flat(value))
        else:
            out[f.name] = value
    return out


def _flat_hints(cls) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.metadata.get("inline"):
            out.update(_flat_hints(hints[f.name]))
        else:
            out[f.name] = hints[f.name]
    return out


def _schema_of(hint) -> dict:
    if hint is Any:
        return {}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        kinds = [_schema_of(a) for a in args if a is not type(None)]
        if len(kinds) == 1 and set(kinds[0]) == {"type"} and type(None) in args:
            return {"type": [kinds[0]["type"], "null"]}
        return {"anyOf": kinds + ([{"type": "null"}] if type(None) in args else [])}
    if hint is type(None):
        return {"type": "null"}
    if origin is list:
        return {"type": "array", "items": _schema_of(args[0])} if args else {"type": "array"}
    if origin is dict:
        if args and args[1] is not Any:
            return {"type": "object", "additionalProperties": _schema_of(args[1])}
        return {"type": "object"}
    simple = {str: "string", bool: "boolean", int: "integer", float: "number", dict: "object",
              list: "array"}
    return {"type": simple[hint]}


def json_schema() -> dict:
    """The JSON schema (draft 2020-12) of a run report's `summary`, from RunSummary's fields."""
    properties = {name: _schema_of(hint) for name, hint in _flat_hints(RunSummary).items()}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "tpukit run summary",
        "type": "object",
        "properties": properties,
        "required": list(properties),
    }


def describe_activity(entry: dict) -> str:
    """`entry` (in_progress or stopped_in) in words."""
    where = f"{Path(entry['path']).name}:{entry['line']}"
    said = f"in the {entry['call']} at {where} for {entry['for_s']:.1f} s, {entry['doing']}"
    if entry.get("signal"):
        said = f"{entry['signal']} arrived {said}"
    return said


def describe_mappings(entry: dict) -> str:
    return (f"the process holds {entry['mappings']:,} of the {entry['limit']:,} memory mappings "
            "the kernel allows one process (vm.max_map_count): XLA:CPU keeps about 48 for each "
            "compiled graph and the process dies at the limit (\"LLVM ERROR: Unable to allocate "
            "section memory\"); the graphs compiled again and again are the cause (the "
            "recompile findings), and `sysctl vm.max_map_count=...` only moves the limit")

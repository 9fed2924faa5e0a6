"""Worker for test_torchtpu_wheel.py, run by the interpreter of a venv with the real torch-tpu:
resolves attribute chains and makes calls against the imported torch and torch_tpu, one JSON
line per item on stdout.

stdin: {"chains": ["torch.tpu.EagerMode.DEFER_AND_FUSE", ...],
        "calls": [{"func": "torch.accelerator.synchronize", "code": "torch.accelerator.synchronize()",
                   "statement": true, "call": true}, ...],
        "assignments": ["torch.tpu.eager_mode = torch.tpu.EagerMode.DEFER_AND_FUSE", ...],
        "helpers": {"_tpu_launch_process_count": "def _tpu_launch_process_count(): ..."}}

Each item runs in a thread with a time limit: a hang is reported, not waited on (one that holds
the GIL still stops the worker; the test's own time limit says so). libtpu looks for a TPU VM's
metadata server before it gives up on finding a chip (30 tries per key, minutes in all, with
the GIL held: `torch.tpu.Stream()` hung so): TPU_SKIP_MDS_QUERY=1 makes it say at once that
there is none ("TPU initialization failed: No jellyfish device found").
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import threading
import warnings

LIMIT_S = 30


def _resolve(chain: str):
    import torch

    obj = torch
    for part in chain.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def _is_context_manager_factory(obj) -> bool:
    """A callable whose call only builds a context manager: a contextlib.contextmanager
    function, or a class with __enter__ (torch.accelerator.device_index)."""
    if isinstance(obj, type):
        return hasattr(obj, "__enter__")
    return inspect.isgeneratorfunction(inspect.unwrap(obj))


def _timed(fn) -> dict:
    result: dict = {}

    def run():
        try:
            result.update(fn())
        except BaseException as exc:  # noqa: BLE001  (every outcome is reported)
            result.update(error=type(exc).__name__, message=str(exc).splitlines()[0][:300])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(LIMIT_S)
    return result if not thread.is_alive() else {"error": "Hang", "message": f">{LIMIT_S} s"}


def main() -> None:
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    warnings.simplefilter("ignore")
    request = json.load(sys.stdin)
    import torch
    import torch_tpu  # noqa: F401

    namespace = {"torch": torch, "torch_tpu": torch_tpu}
    for name, source in request.get("helpers", {}).items():
        exec(source, namespace)  # noqa: S102  (tpukit's own inserted helper)
    for chain in request["chains"]:
        print(json.dumps({"chain": chain, **_timed(lambda: (_resolve(chain), {})[1])}), flush=True)
    for call in request["calls"]:
        def make(call=call):
            callee = eval(call["func"], namespace)  # noqa: S307
            if call["statement"] and _is_context_manager_factory(callee):
                return {"error": "BareContextManager",
                        "message": f"{call['func']} builds a context manager"}
            if not call["call"]:  # arguments that only the script's run knows
                return {"value": "not called"}
            value = eval(call["code"], namespace)  # noqa: S307
            return {"value": repr(value)[:100]}
        print(json.dumps({"call": call["code"], "key": call.get("key"), **_timed(make)}),
              flush=True)
    for statement in request.get("assignments", []):
        def assign(statement=statement):
            target, _, value = statement.partition(" = ")
            exec(statement, namespace)  # noqa: S102
            got, wanted = eval(target, namespace), eval(value, namespace)  # noqa: S307
            if got != wanted:
                return {"error": "NotSet", "message": f"{target} is {got!r} after the assignment"}
            return {"value": repr(got)}
        print(json.dumps({"assignment": statement, **_timed(assign)}), flush=True)


if __name__ == "__main__":
    main()

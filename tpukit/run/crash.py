"""A run that died of an op XLA has no kernel for, said at the user's line (TPU507).

torch's dispatcher raises NotImplementedError naming the op and the backend it has no kernel
for ("Could not run 'aten::mm' with arguments from the 'SparseXLA' backend", "Could not run
'new_compressed_tensor' from the 'xla:0' device"). The migrate rule TPU507 finds the sparse
constructors and products it knows by name; this finds whatever op the run reached, through
any wrapper, at the innermost line of the user's code in the traceback.
"""

from __future__ import annotations

import re
import traceback

from tpukit.rules import load_rules
from tpukit.run.frames import is_user_file
from tpukit.run.run_finding import RunFinding, finding

# the dispatcher's own words for a missing kernel: the op, then the backend or device
_NO_KERNEL = re.compile(r"Could not run '([^']+)'(?: with arguments)? from the '([^']+)' "
                        r"(backend|device)")


def crash_findings(exception: BaseException | None) -> list[RunFinding]:
    if not isinstance(exception, NotImplementedError):
        return []
    found = _NO_KERNEL.search(str(exception))
    if found is None or "xla" not in found.group(2).lower():
        return []
    op, backend = found.group(1), found.group(2)
    user = [f for f in traceback.extract_tb(exception.__traceback__) if is_user_file(f.filename)]
    if not user:
        return []
    frame = user[-1]
    rule = load_rules()["TPU507"]
    message = rule.say("xla", "crashed", op=op, backend=backend, code=(frame.line or "").strip())
    return [finding("TPU507", message.what, (frame.filename, frame.lineno), cause=message.cause,
                    fix=message.fix, op=op, backend=backend)]

"""`python -m tpukit.shim SCRIPT ARGS` (or `-m MODULE ARGS`): run a program with the runtime
layer installed, as `python SCRIPT ARGS` would, and say on stderr which CUDA calls it
redirected or refused, once per call site. `--to cpu` redirects to the CPU instead: an
original CUDA script run as the reference on a host without CUDA."""

from __future__ import annotations

import sys


USAGE = "usage: python -m tpukit.shim [--to xla|cpu] SCRIPT [ARGS...] | -m MODULE [ARGS...]"


def main(argv: list[str]) -> int:
    to = "xla"
    if argv[:1] == ["--to"] and len(argv) > 1:
        to, argv = argv[1], argv[2:]
        if to not in ("xla", "cpu"):
            print(f"python -m tpukit.shim: --to takes xla or cpu, not {to!r}", file=sys.stderr)
            return 2
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        print(USAGE, file=sys.stderr)
        return 2
    module = argv[1] if argv[0] == "-m" else None
    script = None if module else argv[0]
    args = argv[2:] if module else argv[1:]
    if script is not None:
        from pathlib import Path

        if not Path(script).is_file():
            print(f"python -m tpukit.shim: {script}: no such file", file=sys.stderr)
            return 2
    import tpukit.shim
    from tpukit.run.script import run_target
    from tpukit.shim.report import describe

    shim = tpukit.shim.install(script, to)
    try:
        import random

        random.setstate(tpukit.RANDOM_STATE_AT_START)  # what the script would have found
        outcome = run_target(script, module, args, ())
    finally:
        shim.uninstall()
    for line in describe(shim.records()):
        print(f"tpukit shim: {line}", file=sys.stderr)
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

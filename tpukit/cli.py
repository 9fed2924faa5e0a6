"""The `tpukit` command line: wiring only; the work is in tpukit.migrate, tpukit.explain."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from tpukit import __version__
from tpukit.config import DEFAULT_EAGER_MODE, EAGER_MODES, ConfigError, load_config
from tpukit.render import Format
from tpukit.rules import TARGETS, RuleError, load_rules, unknown_prefixes
from tpukit.run.steps import STORM_GRAPHS

app = typer.Typer(
    help="Port PyTorch CUDA training code to TPUs and explain why it is slow there.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def fail(message: str, code: int = 2) -> None:
    """One line on stderr and exit 2: the tool could not do its job."""
    print(f"tpukit: error: {message}", file=sys.stderr)
    raise typer.Exit(code)


def _codes(values: list[str] | None) -> list[str]:
    codes = [c.strip().upper() for v in values or [] for c in v.split(",") if c.strip()]
    unknown = unknown_prefixes(codes)
    if unknown:
        fail(f"unknown rule code or prefix: {', '.join(unknown)} (see `tpukit rules`)")
    return codes


def _version(value: bool) -> None:
    if value:
        print(f"tpukit {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    pass


@app.command()
def migrate(
    paths: List[Path] = typer.Argument(..., help="Python files or folders to migrate."),
    diff: bool = typer.Option(False, "--diff", help="Print a unified diff; write nothing."),
    check: bool = typer.Option(False, "--check",
                               help="Write nothing; exit 1 if a file would change or a "
                                    "finding needs a person."),
    out: Optional[Path] = typer.Option(None, "-o", "--out",
                                       help="Write migrated copies under this folder, "
                                            "mirroring the tree; leave the originals alone."),
    target: Optional[str] = typer.Option(None, "--target", help="xla (default) or torchtpu."),
    eager_mode: Optional[str] = typer.Option(
        None, "--eager-mode",
        help="torchtpu only: debug, strict or fused (default): the TorchTPU eager mode set at "
             "start-up."),
    select: Optional[List[str]] = typer.Option(None, "--select",
                                               help="Only these codes or prefixes (TPU1,TPU901)."),
    ignore: Optional[List[str]] = typer.Option(None, "--ignore", help="Skip these codes or prefixes."),
    unsafe_fixes: bool = typer.Option(False, "--unsafe-fixes",
                                      help="Also apply fixes that change behaviour."),
    fmt: Format = typer.Option(Format.TEXT, "--format", help="Output format."),
    jobs: int = typer.Option(0, "-j", "--jobs", min=0, help="Worker processes (0: one per core)."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="Print only the summary."),
    show_fixes: bool = typer.Option(False, "--show-fixes", help="Also list the fixes applied."),
    exit_zero: bool = typer.Option(False, "--exit-zero", help="Exit 0 even with findings."),
    follow_imports: bool = typer.Option(
        True, "--follow-imports/--no-follow-imports",
        help="Also migrate the local modules a named script imports (from its own folder)."),
    strict: bool = typer.Option(
        False, "--strict",
        help="Also report `# tpukit: ignore` comments that silence nothing (TPU009)."),
    library: Optional[List[Path]] = typer.Option(
        None, "--library",
        help="A folder of someone else's code (vendored, third-party): never rewritten. "
             "Repeatable; adds to [tool.tpukit] library."),
    library_mode: bool = typer.Option(
        False, "--library-mode",
        help="Port the named code as a library: its package modules keep their own "
             "choices (tests of the host's CUDA, seeds, launcher variables, torch.save) as "
             "written, with findings."),
) -> None:
    """Rewrite CUDA code for TPU in place (or --diff, --check, -o DIR)."""
    from tpukit.errors import UsageError
    from tpukit.migrate.command import MigrateRequest, run_migrate
    from tpukit.migrate.files import Mode

    if sum([diff, check, out is not None]) > 1:
        fail("--diff, --check and --out cannot be combined")
    try:
        config = load_config(paths[0] if paths else Path.cwd())
    except ConfigError as exc:
        fail(str(exc))
    if target is not None:
        if target not in TARGETS:
            fail(f"unknown target {target!r}: choose {' or '.join(TARGETS)}")
        config.target = target
    if eager_mode is not None:
        if eager_mode not in EAGER_MODES:
            fail(f"unknown eager mode {eager_mode!r}: choose {', '.join(EAGER_MODES)}")
        if config.target != "torchtpu":
            fail(f"--eager-mode applies to --target torchtpu only (the target is {config.target!r})")
        config.eager_mode = eager_mode
    if config.target == "torchtpu" and config.eager_mode is None:
        config.eager_mode = DEFAULT_EAGER_MODE
    config.unsafe_fixes = config.unsafe_fixes or unsafe_fixes
    mode = Mode.DIFF if diff else Mode.CHECK if check else Mode.OUT if out else Mode.WRITE
    request = MigrateRequest(
        paths=list(paths), config=config, mode=mode, out_dir=out, fmt=fmt, jobs=jobs,
        quiet=quiet, exit_zero=exit_zero, show_fixes=show_fixes,
        select=_codes(select), ignore=_codes(ignore), follow_imports=follow_imports,
        strict=strict, library=list(library or []), library_mode=library_mode,
    )
    try:
        code = run_migrate(request)
    except UsageError as exc:
        fail(str(exc))
    raise typer.Exit(code)


@app.command()
def rules(
    code: Optional[str] = typer.Argument(None, help="A code (TPU101) or prefix (TPU9)."),
    fmt: Format = typer.Option(Format.TEXT, "--format", help="text or json."),
) -> None:
    """List every rule, or explain one: what, why on TPU, the fix, examples."""
    from tpukit.explain import explain, rules_json, rules_table

    all_rules = list(load_rules().values())
    chosen = [r for r in all_rules if code is None or r.code.startswith(code.upper())]
    if not chosen:
        fail(f"unknown rule {code!r} (see `tpukit rules`)")
    if fmt is Format.JSON:
        rules_json(chosen, sys.stdout)
        return
    if fmt is not Format.TEXT:
        fail("`tpukit rules` prints text or json")
    con = Console(highlight=False, soft_wrap=False)
    if code is None:
        rules_table(chosen, con)
    else:
        for rule in chosen:
            explain(rule, con)


@app.command()
def doctor(
    paths: Optional[List[Path]] = typer.Argument(None, help="Code to scan (default: the project here)."),
    fmt: Format = typer.Option(Format.TEXT, "--format", help="Output format."),
    strict: bool = typer.Option(False, "--strict", help="Warnings fail too."),
    require_tpu: bool = typer.Option(False, "--require-tpu", help="No TPU is a failure."),
    no_smoke: bool = typer.Option(False, "--no-smoke", help="Skip the device smoke test."),
    no_code: bool = typer.Option(False, "--no-code", help="Skip the code scan."),
    timeout: float = typer.Option(180.0, "--timeout", min=1, help="Seconds for the device probe."),
    select: Optional[List[str]] = typer.Option(None, "--select", help="Code rules to run."),
    ignore: Optional[List[str]] = typer.Option(None, "--ignore", help="Code rules to skip."),
    jobs: int = typer.Option(0, "-j", "--jobs", min=0, help="Worker processes for the code scan."),
    scan_target: Optional[str] = typer.Option(
        None, "--target", help="xla or torchtpu: the code scan's target (default: torchtpu on a "
                               "host with TorchTPU and no torch_xla, else [tool.tpukit] target)."),
) -> None:
    """Pre-flight check for CI and a fresh TPU VM: environment, device, leftover CUDA code."""
    from tpukit.doctor.checks import DoctorContext
    from tpukit.doctor.command import DoctorRequest, run_doctor
    from tpukit.errors import UsageError

    targets = list(paths) if paths else [Path.cwd()]
    try:
        config = load_config(targets[0])
    except ConfigError as exc:
        fail(str(exc))
    if scan_target is not None and scan_target not in TARGETS:
        fail(f"unknown target {scan_target!r}: choose {' or '.join(TARGETS)}")
    context = DoctorContext(probe_timeout=timeout, smoke=not no_smoke, require_tpu=require_tpu)
    request = DoctorRequest(
        paths=targets, config=config, context=context, fmt=fmt, strict=strict,
        code=not no_code, jobs=jobs, select=_codes(select), ignore=_codes(ignore),
        target=scan_target,
    )
    try:
        code = run_doctor(request)
    except UsageError as exc:
        fail(str(exc))
    raise typer.Exit(code)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def verify(
    ctx: typer.Context,
    script: Path = typer.Argument(..., help="The original script; what follows `--` is its argv."),
    port: Optional[Path] = typer.Option(
        None, "--port", help="The ported script (default: a migrated temporary copy)."),
    steps: int = typer.Option(10, "--steps", min=1, help="Training steps to compare."),
    rtol: Optional[float] = typer.Option(
        None, "--rtol", min=0.0, help="Relative tolerance per step (default: 1e-3, or 5e-2 "
                                      "when the port computes in bfloat16)."),
    seed: int = typer.Option(0, "--seed", help="The seed both runs start from."),
    verify_target: Optional[str] = typer.Option(None, "--target",
                                                help="xla (default) or torchtpu: the migration's."),
    fmt: Format = typer.Option(Format.TEXT, "--format", help="Report format."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Also write the JSON report here."),
    timeout: Optional[float] = typer.Option(None, "--timeout", min=1.0,
                                            help="Seconds each side may run."),
    original_arg: Optional[List[str]] = typer.Option(
        None, "--original-arg", help="An argument for the original's run only, after ARGS "
                                     "(`--original-arg=--device=cpu` where its default is CUDA). "
                                     "Repeatable."),
) -> None:
    """Run the original (CPU) and its port (XLA) side by side and compare every step's loss.
    Exit 0 match, 1 diverged, 2 a side could not run, 3 nothing comparable."""
    from tpukit.errors import UsageError
    from tpukit.verify.command import VerifyRequest, run_verify

    args = list(ctx.args)
    if args and args[0] == "--":
        args.pop(0)
    if verify_target is not None and verify_target not in TARGETS:
        fail(f"unknown target {verify_target!r}: choose {' or '.join(TARGETS)}")
    request = VerifyRequest(script=script, args=args, port=port, steps=steps, rtol=rtol,
                            seed=seed, target=verify_target or "xla", fmt=fmt.value,
                            json_path=json_path, timeout=timeout,
                            original_args=list(original_arg or []))
    try:
        code = run_verify(request)
    except UsageError as exc:
        fail(str(exc))
    raise typer.Exit(code)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                "allow_interspersed_args": False})
def run(
    ctx: typer.Context,
    script: Optional[str] = typer.Argument(None, help="The script; what follows is its argv."),
    module: Optional[str] = typer.Option(None, "-m", help="Run a module, like `python -m`."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", min=1,
                                            help="End the script cleanly after N steps."),
    storm_graphs: int = typer.Option(
        STORM_GRAPHS, "--storm-graphs", min=0,
        help="Stop the script when one step compiles this many new graphs (0: never)."),
    warmup: int = typer.Option(2, "--warmup", min=0,
                               help="Steps left out of steady-state figures and recompile findings."),
    fmt: Format = typer.Option(Format.TEXT, "--format", help="Report format."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Also write the JSON report here."),
    output: Optional[Path] = typer.Option(None, "-o", "--output",
                                          help="Write the --format report here, not to stdout."),
    fail_on: Optional[List[str]] = typer.Option(
        None, "--fail-on", help="Exit 1 if any of these occur: recompile,fallback,sync."),
    no_cuda_check: bool = typer.Option(False, "--no-cuda-check",
                                       help="Skip the check for CUDA idioms left in the script."),
    profile: bool = typer.Option(False, "--profile",
                                 help="Capture an XProf trace of steady-state steps."),
    logdir: Optional[Path] = typer.Option(
        None, "--logdir", help="Where --profile writes (default ./tpukit-profile/<timestamp>)."),
    profile_steps: Optional[str] = typer.Option(
        None, "--profile-steps", help="Steps A:B to profile, 1-based, inclusive "
                                      "(default: the 3 after warm-up)."),
    tpu_generation: Optional[str] = typer.Option(
        None, "--tpu-generation", help="v2, v3, v4, v5e, v5p, v6e or v7: the MXU width for the "
                                       "head-dim advice (default: this TPU's, else v5e)."),
    bucket_budget: int = typer.Option(4, "--bucket-budget", min=1, max=64,
                                      help="Compile budget k for the shape-bucket advice."),
    html: Optional[Path] = typer.Option(None, "--html",
                                        help="Also write a self-contained HTML report here."),
    run_target: Optional[str] = typer.Option(
        None, "--target", help="xla or torchtpu (default: torchtpu for a script that imports "
                               "torch_tpu, else [tool.tpukit] target, else xla)."),
    eager_mode: Optional[str] = typer.Option(
        None, "--eager-mode", help="torchtpu target: debug, strict or fused (default fused)."),
    explain_graphs: bool = typer.Option(
        False, "--explain-graphs", help="Dump every graph's HLO and name what differs in a "
                                        "recompiled graph, at its line (slower: a diagnosis run)."),
    no_shim: bool = typer.Option(
        False, "--no-shim", help="Do not install the runtime layer that redirects CUDA calls in "
                                 "code tpukit does not rewrite (installed packages, devices "
                                 "from argv) to the TPU."),
    no_graph_diffs: bool = typer.Option(
        False, "--no-graph-diffs", help="Do not hash and lower each barrier's and host read's "
                                        "graph (recompiles are then explained by shapes only)."),
    compile_cache: Optional[Path] = typer.Option(
        None, "--compile-cache", help="Keep compiled graphs in this folder for the next run "
                                      "(default: ~/.cache/tpukit/xla-compile-cache, or "
                                      "XLA_PERSISTENT_CACHE_PATH or TPUKIT_COMPILE_CACHE)."),
    no_compile_cache: bool = typer.Option(
        False, "--no-compile-cache", help="No persistent compilation cache: every graph is "
                                          "compiled, and every compile explained."),
) -> None:
    """Run a script on the TPU (XLA:CPU without one) and explain its recompiles, CPU fallbacks
    and host syncs, step by step."""
    from tpukit.run.run_finding import FAIL_ON
    from tpukit.errors import UsageError
    from tpukit.run.command import RunRequest, run_command

    args = list(ctx.args)
    if module is None and script is None:
        fail("give a SCRIPT or -m MODULE")
    if module is not None and script is not None:
        args.insert(0, script)  # with -m every positional belongs to the module
        script = None
    if args and args[0] == "--":
        args.pop(0)
    if output is not None and fmt is Format.TEXT:
        fail("-o/--output writes the --format json, sarif or github report; the text report "
             "goes to stderr")
    kinds = [k.strip() for v in fail_on or [] for k in v.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in FAIL_ON]
    if unknown:
        fail(f"--fail-on takes {','.join(FAIL_ON)}; not {', '.join(unknown)}")
    from tpukit.run.advisors import MXU_WIDTH
    from tpukit.run.profile import parse_steps

    if run_target is not None and run_target not in TARGETS:
        fail(f"unknown target {run_target!r}: choose {' or '.join(TARGETS)}")
    if eager_mode is not None and eager_mode not in EAGER_MODES:
        fail(f"unknown eager mode {eager_mode!r}: choose {', '.join(EAGER_MODES)}")
    if tpu_generation is not None and tpu_generation not in MXU_WIDTH:
        fail(f"--tpu-generation takes {', '.join(MXU_WIDTH)}; not {tpu_generation!r}")
    if compile_cache is not None and no_compile_cache:
        fail("--compile-cache and --no-compile-cache contradict each other")
    if explain_graphs and no_graph_diffs:
        fail("--explain-graphs and --no-graph-diffs contradict each other")
    if (logdir is not None or profile_steps is not None) and not profile:
        fail("--logdir and --profile-steps go with --profile")
    try:
        steps = parse_steps(profile_steps) if profile_steps is not None else None
    except ValueError as exc:
        fail(str(exc))
    request = RunRequest(script=script, module=module, args=args, max_steps=max_steps,
                         storm_graphs=storm_graphs, warmup=warmup, fmt=fmt, json_path=json_path, output=output,
                         fail_on=kinds, check_cuda=not no_cuda_check, profile=profile,
                         logdir=logdir, profile_steps=steps, tpu_generation=tpu_generation,
                         bucket_budget=bucket_budget, html=html, target=run_target,
                         eager_mode=eager_mode, explain_graphs=explain_graphs,
                         graph_diffs=not no_graph_diffs, shim=not no_shim,
                         compile_cache=str(compile_cache) if compile_cache is not None else None,
                         use_compile_cache=not no_compile_cache)
    from tpukit.run.watch import fork_watched

    fork_watched(json_path)  # the parent waits, and says so if the run dies of a signal
    try:
        code = run_command(request)
    except UsageError as exc:
        fail(str(exc))
    if request.stopped_mid_loop:
        import logging
        import os

        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        os._exit(code)  # the report is written; skip the teardown of a loop stopped mid-way
    raise typer.Exit(code)


@app.command()
def report(
    path: Path = typer.Argument(..., help="A JSON report saved by --json or --format json."),
    fmt: Format = typer.Option(Format.TEXT, "--format", help="Output format."),
    html: Optional[Path] = typer.Option(None, "--html", help="Also write a run report as HTML."),
) -> None:
    """Show a saved JSON report again (a killed run's partial one too), in any format."""
    from tpukit.render import render
    from tpukit.render.saved import SavedReportError, load_report

    try:
        saved = load_report(path)
    except SavedReportError as exc:
        fail(str(exc))
    if html is not None:
        if saved.command != "run":
            fail(f"{path}: --html renders a run report; this one is {saved.command!r}")
        from tpukit.render.html import HtmlUnavailable, write_html

        try:
            write_html(html, saved)
        except HtmlUnavailable as exc:
            fail(str(exc))
    if fmt is Format.TEXT and saved.command == "run" and "steps" in saved.summary:
        from tpukit.render.run_summary import print_summary

        print_summary(saved.summary, sys.stdout)
    render(saved, fmt, sys.stdout, sys.stderr)


def main() -> None:
    try:
        app()
    except RuleError as exc:
        print(f"tpukit: error: broken rule file: {exc}", file=sys.stderr)
        sys.exit(2)

"""The command line through the real console script, in subprocesses, as a user runs it."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from conftest import FIXTURES, ROOT

CUDA_SCRIPT = 'import torch\n\ndevice = torch.device("cuda")\nx = torch.zeros(2).cuda()\n'
CLEAN_SCRIPT = "import torch\n\nx = torch.zeros(2)\n"
MANUAL_SCRIPT = "import torch\n\ns = torch.cuda.Stream()\n"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text(CUDA_SCRIPT)
    (tmp_path / "pkg" / "clean.py").write_text(CLEAN_SCRIPT)
    (tmp_path / "notes.txt").write_text("cuda cuda")
    return tmp_path


def test_migrate_rewrites_in_place(project, run_cli):
    proc = run_cli("migrate", "pkg", cwd=project, check_rc=0)
    text = (project / "pkg" / "train.py").read_text()
    assert "torch_xla.device()" in text and ".cuda()" not in text
    assert (project / "pkg" / "clean.py").read_text() == CLEAN_SCRIPT
    assert "Changed 1 of 2 files (2 fixes applied); 0 findings need a person." in proc.stdout
    # A second run changes nothing.
    again = run_cli("migrate", "pkg", cwd=project, check_rc=0)
    assert "Changed 0 of 2 files" in again.stdout


def test_diff_writes_nothing_and_exits_1(project, run_cli):
    proc = run_cli("migrate", "--diff", "pkg", cwd=project, check_rc=1)
    assert proc.stdout.startswith("--- a/pkg/train.py\n+++ b/pkg/train.py\n")
    assert '\n-device = torch.device("cuda")\n' in proc.stdout
    assert "\n+device = torch_xla.device()\n" in proc.stdout
    assert "Would change" not in proc.stdout and "Would change 1 of 2 files" in proc.stderr
    patched = subprocess.run(["patch", "-p1", "--dry-run"], input=proc.stdout, cwd=project,
                             capture_output=True, text=True)
    assert patched.returncode == 0, patched.stdout + patched.stderr
    assert (project / "pkg" / "train.py").read_text() == CUDA_SCRIPT


def test_check_exit_codes(project, run_cli):
    proc = run_cli("migrate", "--check", "pkg", cwd=project, check_rc=1)
    assert "pkg/train.py:3:10: TPU101 [*]" in proc.stdout
    assert (project / "pkg" / "train.py").read_text() == CUDA_SCRIPT
    run_cli("migrate", "--check", "pkg/clean.py", cwd=project, check_rc=0)


def test_manual_finding_fails_check_and_write_but_not_with_exit_zero(tmp_path, run_cli):
    (tmp_path / "s.py").write_text(MANUAL_SCRIPT)
    proc = run_cli("migrate", "s.py", cwd=tmp_path, check_rc=1)
    assert "s.py:3:5: TPU911 `torch.cuda.Stream()`" in proc.stdout
    assert "1 finding needs a person" in proc.stdout
    run_cli("migrate", "--exit-zero", "s.py", cwd=tmp_path, check_rc=0)


def test_out_dir_mirrors_the_tree_and_leaves_originals(project, run_cli):
    run_cli("migrate", "-o", "migrated", "pkg", cwd=project, check_rc=0)
    assert (project / "pkg" / "train.py").read_text() == CUDA_SCRIPT
    assert "torch_xla.device()" in (project / "migrated" / "train.py").read_text()
    assert (project / "migrated" / "clean.py").read_text() == CLEAN_SCRIPT
    # The output folder is not scanned as input when it lies inside the input.
    run_cli("migrate", "-o", "pkg/out", "pkg", cwd=project, check_rc=0)
    assert not (project / "pkg" / "out" / "out").exists()


def test_bad_files_get_one_line_each_stay_untouched_and_others_are_done(tmp_path, run_cli):
    files = {
        "a_syntax.py": b"import torch\ndef f(:\n    torch.cuda.synchronize()\n",
        "b_latin1.py": "import torch\nx = 'caf\xe9'\ntorch.cuda.synchronize()\n".encode("latin-1"),
        "c_binary.py": b"\x00\x01cuda\x02",
        "d_readonly.py": CUDA_SCRIPT.encode(),
        "e_good.py": CUDA_SCRIPT.encode(),
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    os.chmod(tmp_path / "d_readonly.py", 0o444)
    (tmp_path / "f_dangling.py").symlink_to(tmp_path / "missing.py")
    proc = run_cli("migrate", ".", cwd=tmp_path, check_rc=2)
    assert proc.stderr.strip().splitlines() == [
        "a_syntax.py:2:7: error: syntax error: invalid syntax",
        "b_latin1.py:2:9: error: not UTF-8 (byte 0xe9)",
        "c_binary.py:1:1: error: binary file (NUL byte), not Python source",
        "d_readonly.py:1:1: error: read-only file: not rewritten",
        "f_dangling.py:1:1: error: file not found (a dangling link?)",
    ]
    assert "Changed 1 of 6 files" in proc.stdout and "5 files could not be migrated" in proc.stdout
    for name, data in files.items():
        if name != "e_good.py":
            assert (tmp_path / name).read_bytes() == data, name
    assert "torch_xla.device()" in (tmp_path / "e_good.py").read_text()
    assert stat.S_IMODE((tmp_path / "d_readonly.py").stat().st_mode) == 0o444


def test_missing_path_is_a_usage_error(tmp_path, run_cli):
    proc = run_cli("migrate", "nope.py", cwd=tmp_path, check_rc=2)
    assert proc.stderr.strip() == "tpukit: error: no such file or directory: nope.py"


def test_empty_directory_is_fine(tmp_path, run_cli):
    (tmp_path / "empty").mkdir()
    proc = run_cli("migrate", "empty", cwd=tmp_path, check_rc=0)
    assert "No Python files found." in proc.stdout


def test_skips_venv_hidden_and_pycache_folders(tmp_path, run_cli):
    for folder in (".venv/lib", ".hidden", "__pycache__", "src"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "m.py").write_text(CUDA_SCRIPT)
    proc = run_cli("migrate", "--check", ".", cwd=tmp_path, check_rc=1)
    assert "Would change 1 of 1 files" in proc.stdout


def test_file_mode_is_kept(tmp_path, run_cli):
    script = tmp_path / "run.py"
    script.write_text(CUDA_SCRIPT)
    os.chmod(script, 0o751)
    run_cli("migrate", "run.py", cwd=tmp_path, check_rc=0)
    assert stat.S_IMODE(script.stat().st_mode) == 0o751
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".run.py")]


def test_pyproject_config_select_ignore_exclude(tmp_path, run_cli):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.tpukit]\nignore = ["TPU102"]\nexclude = ["legacy"]\n'
    )
    (tmp_path / "legacy").mkdir()
    (tmp_path / "legacy" / "old.py").write_text(CUDA_SCRIPT)
    (tmp_path / "train.py").write_text(CUDA_SCRIPT)
    run_cli("migrate", ".", cwd=tmp_path, check_rc=0)
    text = (tmp_path / "train.py").read_text()
    assert "torch_xla.device()" in text and ".cuda()" in text  # TPU102 ignored
    assert (tmp_path / "legacy" / "old.py").read_text() == CUDA_SCRIPT
    # The command line wins over the config.
    run_cli("migrate", "--select", "TPU102", "train.py", cwd=tmp_path, check_rc=0)
    assert ".cuda()" not in (tmp_path / "train.py").read_text()


def test_bad_config_and_codes_are_errors(tmp_path, run_cli):
    (tmp_path / "t.py").write_text(CUDA_SCRIPT)
    proc = run_cli("migrate", "--select", "XYZ9", "t.py", cwd=tmp_path, check_rc=2)
    assert "unknown rule code or prefix: XYZ9" in proc.stderr
    (tmp_path / "pyproject.toml").write_text('[tool.tpukit]\ntarget = "gpu"\n')
    proc = run_cli("migrate", "t.py", cwd=tmp_path, check_rc=2)
    assert "target must be one of" in proc.stderr
    assert (tmp_path / "t.py").read_text() == CUDA_SCRIPT


def test_json_output_is_the_documented_schema(project, run_cli):
    proc = run_cli("migrate", "--check", "--format", "json", "pkg", cwd=project, check_rc=1)
    report = json.loads(proc.stdout)
    assert report["schema_version"] == 1 and report["command"] == "migrate"
    assert report["summary"] == {
        "files": 2, "files_changed": 1, "fixes": 2, "needs_person": 0, "errors": 0, "mode": "check"
    }
    first = report["findings"][0]
    assert set(first) >= {"code", "name", "severity", "message", "path", "line", "col",
                          "end_line", "end_col", "fix", "applied", "help"}
    assert (first["code"], first["path"], first["line"], first["col"]) == ("TPU101", "pkg/train.py", 3, 10)


def test_sarif_output_validates_against_the_official_schema(tmp_path, run_cli):
    (tmp_path / "train.py").write_text(CUDA_SCRIPT + MANUAL_SCRIPT
                                       + "torch.backends.cudnn.benchmark = True\n")
    (tmp_path / "bad.py").write_text("import torch\ndef f(:\n    torch.cuda.synchronize()\n")
    proc = run_cli("migrate", "--check", "--format", "sarif", ".", cwd=tmp_path, check_rc=2)
    sarif = json.loads(proc.stdout)
    schema = json.loads((ROOT / "tests" / "data" / "sarif-schema-2.1.0.json").read_text())
    jsonschema.validate(sarif, schema)
    run = sarif["runs"][0]
    assert {r["ruleId"] for r in run["results"]} == {"TPU101", "TPU102", "TPU120", "TPU911"}
    assert run["invocations"][0]["executionSuccessful"] is False
    levels = {r["ruleId"]: r["level"] for r in run["results"]}
    # a CUDA device crashes on a TPU VM (error); a cuDNN flag does nothing there (warning)
    assert levels["TPU911"] == levels["TPU101"] == "error" and levels["TPU120"] == "warning"
    help_uris = {r["id"]: r.get("helpUri") for r in run["tool"]["driver"]["rules"]}
    assert help_uris["TPU101"].startswith("https://") and all(help_uris.values())


def test_sarif_schema_rejects_a_broken_log():
    # The schema check above can fail: a log without the required version is rejected.
    schema = json.loads((ROOT / "tests" / "data" / "sarif-schema-2.1.0.json").read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"runs": []}, schema)


def test_github_annotations(tmp_path, run_cli):
    (tmp_path / "t.py").write_text(MANUAL_SCRIPT)
    proc = run_cli("migrate", "--check", "--format", "github", "t.py", cwd=tmp_path, check_rc=1)
    line = proc.stdout.strip().splitlines()[0]
    assert line.startswith("::error file=t.py,line=3,col=5,endLine=3,endColumn=24,"
                           "title=TPU911 (cuda-only-streams)::`torch.cuda.Stream()`")


def test_quiet_prints_only_the_summary(project, run_cli):
    proc = run_cli("migrate", "--check", "-q", "pkg", cwd=project, check_rc=1)
    assert proc.stdout.strip().splitlines() == ["Would change 1 of 2 files (2 fixes); 0 findings need a person."]


def test_parallel_and_serial_runs_agree(tmp_path, run_cli):
    for i in range(12):
        (tmp_path / f"m{i:02d}.py").write_text(CUDA_SCRIPT if i % 2 else MANUAL_SCRIPT)
    serial = run_cli("migrate", "--check", "-j", "1", ".", cwd=tmp_path)
    parallel = run_cli("migrate", "--check", "-j", "2", ".", cwd=tmp_path)
    assert serial.returncode == parallel.returncode == 1
    assert serial.stdout == parallel.stdout and serial.stdout.count("\n") > 12


def test_no_progress_bar_or_colour_without_a_terminal(project, run_cli):
    proc = run_cli("migrate", "--check", "pkg", cwd=project, env={"NO_COLOR": ""})
    assert "\x1b[" not in proc.stdout + proc.stderr


def test_rules_list_and_explain(run_cli):
    listing = run_cli("rules", check_rc=0).stdout
    assert "TPU101" in listing and "TPU911" in listing
    page = run_cli("rules", "TPU112", check_rc=0).stdout
    assert "torch_xla.sync()" in page and "xm.wait_device_ops()" in page and "Example 1" in page
    data = json.loads(run_cli("rules", "TPU1", "--format", "json", check_rc=0).stdout)
    assert all(r["code"].startswith("TPU1") for r in data) and len(data) >= 10
    assert "unknown rule" in run_cli("rules", "TPU999", check_rc=2).stderr


def test_python_dash_m_works(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tpukit", "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("tpukit ")


def test_migrate_never_imports_torch(tmp_path, run_cli):
    # A `torch` that explodes on import, first on the path: migrate must not touch it.
    blocker = tmp_path / "blocker" / "torch"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('tpukit migrate imported torch')\n")
    (tmp_path / "t.py").write_text(CUDA_SCRIPT)
    proc = run_cli("migrate", "--diff", "t.py", cwd=tmp_path,
                   env={"PYTHONPATH": str(tmp_path / "blocker")}, check_rc=1)
    assert "torch_xla.device()" in proc.stdout and "imported torch" not in proc.stderr


def test_fixture_tree_in_one_run(tmp_path, run_cli):
    proc = run_cli("migrate", "--check", "--format", "json", str(FIXTURES), cwd=tmp_path)
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and report["summary"]["errors"] == 0
    assert report["summary"]["files"] == len(list(FIXTURES.rglob("*.py")))


def test_progress_bar_on_a_terminal_only(tmp_path):
    import shutil

    if shutil.which("script") is None:
        pytest.skip("util-linux `script` (a pseudo-terminal) is not installed")
    from conftest import tpukit_executable

    for i in range(25):
        (tmp_path / f"m{i:02d}.py").write_text(CUDA_SCRIPT)
    command = f"{tpukit_executable()} migrate --check -j 1 ."
    on_tty = subprocess.run(["script", "-qec", command, "/dev/null"], cwd=tmp_path,
                            capture_output=True, text=True, env={**os.environ, "TERM": "xterm"})
    assert "migrating" in on_tty.stdout  # rich's progress line, drawn on the terminal
    piped = subprocess.run(command.split(), cwd=tmp_path, capture_output=True, text=True)
    assert "migrating" not in piped.stdout + piped.stderr


def test_migrate_dir_reports_torchrun_lines_in_shell_scripts(tmp_path, run_cli):
    (tmp_path / "train.py").write_text("import torch\n")
    script = tmp_path / "launch.sh"
    text = "#!/bin/bash\n# torchrun in a comment is not a launch\ntorchrun --nproc_per_node=8 train.py\n"
    script.write_text(text)
    proc = run_cli("migrate", "--check", "--format", "json", tmp_path, cwd=tmp_path)
    report = json.loads(proc.stdout)
    (finding,) = [f for f in report["findings"] if f["code"] == "TPU414"]
    assert (finding["path"], finding["line"], finding["col"]) == ("launch.sh", 3, 1)
    assert "--nproc_per_node=8" in finding["message"]
    assert "PJRT_DEVICE=TPU" in finding["explanation"]["fix"]  # the message's parts, as fields
    assert "torch_xla.launch" in finding["explanation"]["cause"]
    assert report["summary"]["shell_scripts"] == 1 and report["summary"]["files"] == 1
    assert proc.returncode == 1  # a launch line needs a person
    assert script.read_text() == text  # reported, never rewritten
    ignored = run_cli("migrate", "--check", "--ignore", "TPU414", tmp_path, cwd=tmp_path)
    assert "TPU414" not in ignored.stdout and ignored.returncode == 0


# -- the torchtpu target -----------------------------------------------------------------
def test_target_torchtpu_rewrites_for_the_tpu_device_with_the_fused_eager_mode(project, run_cli):
    run_cli("migrate", "--target", "torchtpu", "pkg", cwd=project, check_rc=0)
    text = (project / "pkg" / "train.py").read_text()
    assert 'device = torch.device("tpu")' in text and ".to(device)" in text
    assert "import torch_tpu\n" in text and "torch_xla" not in text
    assert text.count("torch.tpu.eager_mode = torch.tpu.EagerMode.DEFER_AND_FUSE\n") == 1
    assert "set_eager_mode" not in text  # a context manager: a bare call sets nothing
    again = run_cli("migrate", "--target", "torchtpu", "pkg", cwd=project, check_rc=0)
    assert "Changed 0 of 2 files" in again.stdout


@pytest.mark.parametrize("mode,member", [("debug", "DEFER_NEVER_AND_LAUNCH_BLOCKING"),
                                         ("strict", "DEFER_NEVER"), ("fused", "DEFER_AND_FUSE")])
def test_eager_mode_option_picks_the_eager_mode_member(tmp_path, run_cli, mode, member):
    (tmp_path / "t.py").write_text(CUDA_SCRIPT)
    run_cli("migrate", "--target", "torchtpu", "--eager-mode", mode, "t.py", cwd=tmp_path, check_rc=0)
    assert f"torch.tpu.eager_mode = torch.tpu.EagerMode.{member}\n" in (tmp_path / "t.py").read_text()


def test_eager_mode_without_the_torchtpu_target_is_a_usage_error(tmp_path, run_cli):
    (tmp_path / "t.py").write_text(CUDA_SCRIPT)
    proc = run_cli("migrate", "--eager-mode", "strict", "t.py", cwd=tmp_path, check_rc=2)
    assert proc.stderr.strip().splitlines() == [
        "tpukit: error: --eager-mode applies to --target torchtpu only (the target is 'xla')"]
    proc = run_cli("migrate", "--target", "torchtpu", "--eager-mode", "lazy", "t.py", cwd=tmp_path,
                   check_rc=2)
    assert "unknown eager mode 'lazy'" in proc.stderr
    assert (tmp_path / "t.py").read_text() == CUDA_SCRIPT


def test_config_target_and_eager_mode(tmp_path, run_cli):
    (tmp_path / "t.py").write_text(CUDA_SCRIPT)
    (tmp_path / "pyproject.toml").write_text('[tool.tpukit]\ntarget = "torchtpu"\neager-mode = "debug"\n')
    run_cli("migrate", "t.py", cwd=tmp_path, check_rc=0)
    text = (tmp_path / "t.py").read_text()
    assert 'torch.device("tpu")' in text and "EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING" in text
    (tmp_path / "pyproject.toml").write_text('[tool.tpukit]\neager-mode = "lazy"\n')
    proc = run_cli("migrate", "t.py", cwd=tmp_path, check_rc=2)
    assert "eager-mode must be one of debug, strict, fused" in proc.stderr


def test_torchtpu_target_reports_a_bad_file_in_one_line_and_leaves_it(tmp_path, run_cli):
    (tmp_path / "bad.py").write_text("import torch\nx = torch.zeros(2).cuda(\n")
    proc = run_cli("migrate", "--target", "torchtpu", "bad.py", cwd=tmp_path, check_rc=2)
    errors = [line for line in proc.stderr.splitlines() if ": error:" in line]
    assert len(errors) == 1 and errors[0].startswith("bad.py:")
    assert (tmp_path / "bad.py").read_text() == "import torch\nx = torch.zeros(2).cuda(\n"


def test_rules_page_shows_both_targets_side_by_side(run_cli):
    page = run_cli("rules", "TPU112", check_rc=0).stdout
    header = next(line for line in page.splitlines() if "xla" in line and "torchtpu" in line)
    assert header.index("xla") < header.index("torchtpu")
    assert "torch.accelerator.synchronize()" in page and "torch_xla.sync()" in page
    skipped = run_cli("rules", "TPU303", check_rc=0).stdout
    assert "nothing to do on this target" in skipped
    data = json.loads(run_cli("rules", "TPU301", "--format", "json", check_rc=0).stdout)
    assert data[0]["targets"]["torchtpu"]["skip"] is True


def test_shell_launch_advice_follows_the_target(tmp_path, run_cli):
    (tmp_path / "launch.sh").write_text("torchrun --nproc_per_node=8 train.py\n")
    proc = run_cli("migrate", "--check", "--target", "torchtpu", ".", cwd=tmp_path, check_rc=1)
    assert "set_tpu_launch_env" in proc.stdout and "torch_xla.launch" not in proc.stdout


# -- tpukit report: a saved JSON report shown again -------------------------------------------
def test_report_renders_a_saved_migrate_report_in_every_format(tmp_path, run_cli):
    (tmp_path / "t.py").write_text("import torch\nx = torch.zeros(2).cuda()\n")
    saved = tmp_path / "m.json"
    saved.write_text(run_cli("migrate", "--check", "--format", "json", "t.py", cwd=tmp_path).stdout)
    original = json.loads(saved.read_text())
    again = json.loads(run_cli("report", saved, "--format", "json", check_rc=0).stdout)
    assert again["findings"] == original["findings"] and again["command"] == "migrate"
    text = run_cli("report", saved, cwd=tmp_path, check_rc=0).stdout
    assert "t.py:2:" in text and "TPU102" in text
    sarif = json.loads(run_cli("report", saved, "--format", "sarif", check_rc=0).stdout)
    assert sarif["runs"][0]["results"][0]["ruleId"] == "TPU102"


@pytest.mark.parametrize("content,says", [
    ("{not json", "m.json:1:2: not a JSON report"),
    ('{"a": 1}', "not a tpukit report"),
    ('{"tool": {"name": "tpukit"}, "schema_version": 9, "findings": []}', "schema_version 9"),
    ('{"tool": {"name": "tpukit"}, "schema_version": 1, "findings": [{"code": "X"}]}',
     "a finding or error is malformed"),
])
def test_report_of_a_bad_file_is_one_line_and_exit_2(tmp_path, run_cli, content, says):
    (tmp_path / "m.json").write_text(content)
    proc = run_cli("report", tmp_path / "m.json", check_rc=2)
    assert proc.stderr.count("\n") == 1 and says in proc.stderr and proc.stdout == ""


def test_report_of_a_missing_file_is_one_line_and_exit_2(tmp_path, run_cli):
    proc = run_cli("report", tmp_path / "none.json", check_rc=2)
    assert proc.stderr.strip() == f"tpukit: error: {tmp_path / 'none.json'}: No such file or directory"

"""`glm-grpo --version` and `glm-grpo env`: the installed versions, "not installed" for what is
missing, no crash when torch cannot be imported, and nothing heavy imported (no model, no DeepSpeed)."""

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_gpu import fake_gpu_bin  # noqa: E402  (tests/unit/fake_gpu.py)

from glm_grpo_ds.commands.cli import main
from glm_grpo_ds.runtime import cuda_check
from glm_grpo_ds.runtime.versions import NOT_INSTALLED, PACKAGES, package_version

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)


def test_version_flag_prints_the_installed_package_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"glm-grpo-ds {importlib.metadata.version('glm-grpo-ds')}\n"


def test_env_lists_every_package_with_its_installed_version_and_the_hardware(capsys):
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    rows = dict(line[2:].split(":", 1) for line in out.splitlines() if line.startswith("- "))
    rows = {key: value.strip() for key, value in rows.items()}
    for shown, names in PACKAGES:
        assert rows[shown] == package_version(*names)
    assert rows["torch"] == importlib.metadata.version("torch") and rows["Python"] == sys.version.split()[0]
    import torch

    assert rows["CUDA available"] == str(torch.cuda.is_available())
    assert rows["torch CUDA build"] == (torch.version.cuda or "none (CPU-only build)")
    assert rows["GPUs"].startswith(str(torch.cuda.device_count()))
    assert {"Platform", "NCCL"} <= rows.keys()
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        assert rows["flash-attn"] == NOT_INSTALLED


def test_env_takes_log_level_as_every_command_does(capsys):
    """`--log-level debug` (any command, says `glm-grpo --help`) was an unrecognized argument of env only."""
    assert main(["env", "--log-level", "debug"]) == 0
    assert "- torch:" in capsys.readouterr().out


def test_a_reader_that_stops_early_is_no_failure_of_the_command():
    """`glm-grpo env | head -1` ended in a BrokenPipeError traceback and exit 1, env's status for a dependency out of
    range; now it is quiet with the status a shell gives SIGPIPE (`| true`: a reader gone before the first write)."""
    code = "import sys; from glm_grpo_ds.commands.cli import main; sys.exit(main(['env']))"
    for buffered in (True, False):  # stdout written at the end (a pipe's default), or as it comes
        env = {k: v for k, v in ENV.items() if k != "PYTHONUNBUFFERED"} | (
            {} if buffered else {"PYTHONUNBUFFERED": "1"}
        )
        proc = subprocess.run(
            ["bash", "-c", f'set -o pipefail; {sys.executable} -c "{code}" | true'],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 141 and proc.stderr == "", (buffered, proc.stderr)


def test_a_broken_pipe_of_the_commands_own_is_its_error_as_it_came(monkeypatch):
    """Only a closed stdout is the reader's doing: a socket's or a child process's broken pipe is raised."""
    from glm_grpo_ds.commands import env

    def broken(argv):
        raise BrokenPipeError("a socket of its own")

    monkeypatch.setattr(env, "main", broken)
    with pytest.raises(BrokenPipeError, match="a socket of its own"):
        main(["env"])


def test_env_shows_the_nvidia_driver_next_to_torchs_cuda_build(monkeypatch, tmp_path, capsys):
    """The pair that decides whether CUDA works (a torch CUDA build newer than the driver's CUDA does
    not): the driver from nvidia-smi (a fake one here), or "none" without a driver."""
    monkeypatch.setenv("PATH", str(fake_gpu_bin(tmp_path)))
    assert main(["env"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("- ")]
    at = next(i for i, line in enumerate(lines) if line.startswith("- torch CUDA build:"))
    assert lines[at + 1] == "- NVIDIA driver:    535.104.05 (CUDA <= 12.2)"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no nvidia-smi, no kernel driver
    monkeypatch.setattr(cuda_check, "PROC_VERSION", tmp_path / "no-driver")
    assert main(["env"]) == 0
    assert "- NVIDIA driver:    none\n" in capsys.readouterr().out


def test_a_missing_package_is_reported_not_raised():
    assert package_version("surely-not-an-installed-package-glm") == NOT_INSTALLED
    assert package_version("surely-not-an-installed-package-glm", "torch") == importlib.metadata.version("torch")


def test_env_is_fast_and_survives_a_torch_that_cannot_be_imported():
    """A broken torch install is what a bug report must show: the block still prints, saying so.
    And the command imports neither DeepSpeed nor a model library."""
    proc = _run(
        "import sys; sys.modules['torch'] = None  # import torch raises ImportError\n"
        "from glm_grpo_ds.commands.cli import main\n"
        "assert main(['env']) == 0\n"
        "print('heavy:', sorted(m for m in ('deepspeed', 'transformers', 'diffusers', 'peft') if m in sys.modules))"
    )
    assert proc.returncode == 0, proc.stderr
    assert "- torch import:" in proc.stdout and "failed: ModuleNotFoundError" in proc.stdout
    assert "heavy: []" in proc.stdout and proc.stderr == ""


def test_env_names_a_dependency_below_its_floor_with_the_fix(tmp_path):
    """A peft older than setup.py's floor (its metadata first on the path, as an old install would be):
    env names it, its supported range and the pip line that fixes it, and exits 1."""
    from glm_grpo_ds.install.ranges import dependency_rows

    peft = next(row for row in dependency_rows() if row.name == "peft")
    old = tmp_path / "old-site"
    (old / "peft-0.0.1.dist-info").mkdir(parents=True)
    (old / "peft-0.0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: peft\nVersion: 0.0.1\n")
    env = dict(ENV, PYTHONPATH=f"{old}{os.pathsep}{ROOT}")
    proc = subprocess.run(
        [sys.executable, "-m", "glm_grpo_ds", "env"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.strip().startswith("peft "))
    assert "0.0.1" in line and f'OUTSIDE: pip install "peft>={peft.floor},<={peft.tested}"' in line
    assert f"peft 0.0.1 is outside the supported range >={peft.floor}" in proc.stdout
    assert "glm-grpo wheelhouse" in proc.stdout  # the way for a node without a package index
    # the installed, in-range environment: every row inside, exit 0
    assert main(["env"]) == 0


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[name.lower().replace("_", "-")] = version
    return pins


def test_the_supported_range_is_the_floor_files_pin_to_constraints_txts_pin():
    """The rows come from the installed metadata: setup.py's floor is constraints-floor.txt's pin (what
    `make test-floor` tests), the tested top constraints.txt's (what `make test` tests), for every dependency."""
    from glm_grpo_ds.install.ranges import dependency_rows

    top, floor = _pins(ROOT / "constraints.txt"), _pins(ROOT / "constraints-floor.txt")
    rows = {row.name.lower().replace("_", "-"): row for row in dependency_rows()}
    assert {"torch", "transformers", "diffusers", "peft", "deepspeed", "bitsandbytes"} <= rows.keys()
    for name, row in rows.items():
        assert (row.floor, row.tested) == (floor.get(name), top.get(name)), name
        assert row.specifier.contains(row.tested), name
        assert row.problem is None and row.installed == importlib.metadata.version(row.name)
    assert floor.keys() == top.keys()  # the floor job installs the same set of packages


def test_a_checkout_that_is_not_installed_reads_the_same_ranges_from_setup_py():
    """No metadata for the distribution (a name nothing installed): the ranges come from setup.py's REQUIRES (read
    with ast, setup() not run) and constraints.txt, and they are the ones the installed metadata declares."""
    from glm_grpo_ds.install.ranges import declared

    checkout = declared("glm-grpo-ds-not-installed-anywhere", ROOT / "setup.py")
    assert checkout.setup_py == ROOT / "setup.py"
    installed = declared()
    assert installed.setup_py is None
    assert [str(r) for r in checkout.requirements] == [str(r) for r in installed.requirements if not r.marker] + [
        str(r) for r in installed.requirements if r.marker and r.marker.evaluate({"extra": "tested"})
    ]


def test_env_runs_from_a_checkout_that_is_not_pip_installed(tmp_path):
    """`python -m glm_grpo_ds env` from a copy of the checkout that pip never installed: site-packages without
    glm-grpo-ds's dist-info (and its editable finder), so importlib.metadata has no glm-grpo-ds. One line says so,
    glm-grpo-ds's row shows setup.py's version, and the ranges are setup.py's (the installed ones)."""
    import shutil
    import sysconfig

    from glm_grpo_ds.install.ranges import dependency_rows

    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT / "glm_grpo_ds", checkout / "glm_grpo_ds", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.py", "constraints.txt"):
        shutil.copy(ROOT / name, checkout / name)
    site = tmp_path / "site"  # the environment's packages, less glm-grpo-ds's install
    site.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith(("glm_grpo_ds", "glm-grpo-ds", "__editable__")):
            (site / entry.name).symlink_to(entry)
    env = dict(ENV, PYTHONPATH=f"{checkout}{os.pathsep}{site}")
    proc = subprocess.run(  # -S: no site-packages (nor its .pth files) but those on PYTHONPATH
        [sys.executable, "-S", "-m", "glm_grpo_ds", "env"], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stderr == "", proc.stdout + proc.stderr
    version = importlib.metadata.version("glm-grpo-ds")  # the same setup.py's
    assert f"- glm-grpo-ds:      not installed (a checkout: setup.py says {version})" in proc.stdout
    note = f"glm-grpo-ds is not installed (running from the checkout {checkout}): the ranges below are read from"
    assert note in proc.stdout
    shown = [line.split() for line in proc.stdout.split("(constraints.txt):\n", 1)[1].splitlines()[:-1]]
    assert [row[0] for row in shown] == [row.name for row in dependency_rows()]
    assert [" ".join(row[2:]) for row in shown] == [row.tested_range for row in dependency_rows()]


def test_a_containers_own_build_of_the_floor_release_is_in_range():
    """NVIDIA's containers carry torch 2.11.0a0+<commit>, their build of 2.11.0: setup.py's >=2.11.0 counted it too
    old (glm-grpo env said OUTSIDE; the offline bundle replaced the container's torch with PyPI's)."""
    from packaging.specifiers import SpecifierSet

    from glm_grpo_ds.install.ranges import CHECKOUT, DependencyRow, checkout_requirements

    torch_req = next(r for r in checkout_requirements(CHECKOUT / "setup.py") if r.name == "torch")
    row = DependencyRow("torch", torch_req.specifier, "2.15.0", "2.11.0a0+ecf3bae40a")
    assert row.problem is None and row.floor == "2.11.0"
    assert DependencyRow("torch", torch_req.specifier, "2.15.0", "2.10.0").problem is not None
    assert DependencyRow("torch", SpecifierSet(">=2.11.0"), "2.15.0", "2.11.0a0+ecf3bae40a").problem is not None

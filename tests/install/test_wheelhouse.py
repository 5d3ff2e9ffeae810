"""``glm-grpo wheelhouse`` for real: a bundle built from the package index for this machine, without the
torch this environment has (``--skip-installed``), installed with ``--no-index`` into a fresh venv that
has that torch (kept, same version and files), and glm-grpo-ds run from it (tiny model, one training
step); a wheel deleted from the bundle is named by the check, exit 2, and the install then installs
nothing; a bundle for a torch 2.11 container on Python 3.12 / manylinux_2_28 holds only wheels for it.

Needs the package index (`make test-install`); ~4 minutes on 2 cores, most of it the install and the step.
"""

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

from glm_grpo_ds.install.pip_runs import platform_tags, read_freeze

pytestmark = pytest.mark.install  # downloads from the package index: `make test-install`, not `make test`
ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, HF_HUB_OFFLINE="1", DS_ACCELERATOR="cpu", PYTHONPATH="")
# pip with none of this machine's settings: no configured find-links or index can complete a bundle
OFFLINE_PIP = {key: value for key, value in ENV.items() if not key.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}


def _closure(roots: list[str]) -> dict[str, str]:
    """``{name: version}`` of the installed ``roots`` and everything they require (extras followed)."""
    seen, todo, done = {}, [(root, frozenset()) for root in roots], set()
    while todo:
        name, extras = todo.pop()
        if (canonicalize_name(name), extras) in done:
            continue
        done.add((canonicalize_name(name), extras))
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # a marker-gated dependency not installed here
        seen[canonicalize_name(name)] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ["", *extras]):
                todo.append((req.name, frozenset(req.extras)))
    return seen


TORCH = _closure(["torch", "torchvision"])  # what a GPU container brings: torch, its CUDA wheels, ...


def _wheelhouse(*args, check=True):
    proc = subprocess.run(
        [sys.executable, "-m", "glm_grpo_ds", "wheelhouse", *map(str, args)],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    return proc


def _venv_with_torch(path: Path) -> Path:
    """A fresh venv that has this environment's torch, as a GPU container has its own: the torch family's
    files linked into one folder on the venv's path (a .pth), not copied (~5 GB)."""
    venv.create(path, with_pip=True)
    python = path / "bin" / "python"
    site = Path(
        subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True
        ).strip()
    )
    here = Path(importlib.metadata.distribution("torch").locate_file(""))
    linked = path / "container-site"
    linked.mkdir()
    for name in TORCH:
        for file in importlib.metadata.distribution(name).files or []:
            top = file.parts[0]
            if top != ".." and (here / top).exists() and not (linked / top).exists():
                (linked / top).symlink_to(here / top)
    (site / "container.pth").write_text(f"{linked}\n")
    # the venv's own (older) setuptools would hide the container's, which torch requires at its version
    subprocess.run([python, "-m", "pip", "uninstall", "-q", "-y", "setuptools"], env=OFFLINE_PIP, check=True)
    return python


def _torch_of(python: Path) -> str:
    code = "import importlib.metadata as m, torch; print(m.version('torch'), torch.__file__)"
    return subprocess.check_output([python, "-c", code], env=ENV, text=True).strip()


def _installed(python: Path) -> list[str]:
    return subprocess.check_output([python, "-m", "pip", "list", "--format=freeze"], env=OFFLINE_PIP, text=True).split()


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """The bundle for this machine, made without this environment's torch family."""
    work = tmp_path_factory.mktemp("wheelhouse")
    freeze = work / "container-freeze.txt"
    freeze.write_text("".join(f"{name}=={version}\n" for name, version in TORCH.items()))
    proc = _wheelhouse(work / "wheels", "--skip-installed", freeze)
    assert "bundle complete for" in proc.stdout and "built here from source: deepspeed" in proc.stdout
    return work / "wheels", proc.stdout


def test_the_bundle_ships_none_of_the_targets_torch_and_pins_it(bundle):
    folder, out = bundle
    shipped = {canonicalize_name(parse_wheel_filename(w.name)[0]) for w in folder.glob("*.whl")}
    assert not shipped & set(TORCH), shipped & set(TORCH)
    assert {"glm-grpo-ds", "deepspeed", "transformers", "diffusers", "peft", "bitsandbytes", "hjson"} <= shipped
    pins = (folder / "constraints.txt").read_text()
    assert (
        f"torch=={TORCH['torch']}\n" in pins and f"torch=={TORCH['torch']}\n" in (folder / "installed.txt").read_text()
    )
    assert json.loads((folder / "bundle.json").read_text())["built_from_source"] == ["deepspeed"]
    assert f"pip install --no-index --find-links {folder} -c {folder}/constraints.txt" in out
    size = sum(w.stat().st_size for w in folder.glob("*.whl")) / 1e6
    assert f"{len(list(folder.glob('*.whl')))} wheels, {size:.1f} MB" in out


def test_it_installs_with_no_index_keeps_the_torch_there_and_trains(bundle, tmp_path):
    folder, _ = bundle
    python = _venv_with_torch(tmp_path / "venv")
    before = _torch_of(python)
    proc = subprocess.run(
        [python, "-m", "pip", "--isolated", "install", "-q", "--no-index", "--find-links", folder, "-c",
         folder / "constraints.txt", "glm-grpo-ds"],
        env=OFFLINE_PIP, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _torch_of(python) == before  # same version, same files: the container's torch was not replaced
    bin_dir = python.parent
    run = lambda *args: subprocess.run(  # noqa: E731
        [bin_dir / "glm-grpo", *map(str, args)], env=ENV, cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    env = run("env")
    assert env.returncode == 0 and "Every dependency is inside its supported range." in env.stdout, env.stdout
    assert run("tiny-model", tmp_path / "tiny").returncode == 0
    config = ROOT / "launch" / "configs" / "tiny_cpu.yaml"
    data = run(
        "tiny-data", "--config", config, f"model.path={tmp_path / 'tiny'}", f"data.train_file={tmp_path / 'd.jsonl'}"
    )
    assert data.returncode == 0, data.stderr[-2000:]
    train = run(
        "train", "--config", config, "--deepspeed", ROOT / "ds_configs" / "zero2.json",
        f"model.path={tmp_path / 'tiny'}", f"data.train_file={tmp_path / 'd.jsonl'}", f"output_dir={tmp_path / 'run'}",
        "max_steps=1",
    )  # fmt: skip
    assert train.returncode == 0, train.stderr[-3000:]
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in steps if "reward_mean" in row] == [1]
    assert (tmp_path / "run" / "final_adapter" / "adapter_config.json").is_file()


def test_a_deleted_wheel_is_named_by_the_check_and_nothing_is_installed(bundle, tmp_path):
    folder, _ = bundle
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken, copy_function=os.link)  # hard links: no 300 MB copy
    (hjson,) = broken.glob("hjson-*.whl")
    hjson.unlink()
    proc = _wheelhouse("--check", broken, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"the bundle in {broken} is incomplete: no wheel of hjson (needed by deepspeed" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    # the bundle's own install script on the target: pip resolves everything first, so nothing is installed
    python = _venv_with_torch(tmp_path / "venv")
    before = _installed(python)
    install = subprocess.run(
        ["sh", broken / "install.sh"], env=OFFLINE_PIP | {"PYTHON": str(python)}, capture_output=True, text=True
    )
    assert install.returncode != 0 and "hjson" in install.stdout + install.stderr
    assert _installed(python) == before


def _container_freeze(tmp_path: Path) -> Path:
    """The freeze of a torch-only GPU container as the issue met it: Python 3.12, manylinux_2_28 x86_64,
    torch 2.11.0+cu130 with the CUDA wheels and everything else torch 2.11 requires (read from the index)."""
    tags = [flag for tag in platform_tags("manylinux_2_28_x86_64") for flag in ("--platform", tag)]
    report = tmp_path / "container.json"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q", "--report", report,
         "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", *tags,
         "--target", tmp_path / "t", "torch==2.11.0", "pip", "setuptools"],
        env=ENV, check=True, capture_output=True,
    )  # fmt: skip
    pins = [f"{i['metadata']['name']}=={i['metadata']['version']}" for i in json.loads(report.read_text())["install"]]
    freeze = tmp_path / "container-freeze.txt"
    freeze.write_text("".join(pin.replace("torch==2.11.0", "torch==2.11.0+cu130") + "\n" for pin in pins))
    return freeze


def test_a_bundle_for_a_python_3_12_torch_2_11_container_fits_it(tmp_path):
    """Every wheel installs there (cp312, abi3 or pure; manylinux <= 2.28); the container's torch is kept
    and torchvision, which it lacks, is the one built for that torch (0.26.0), not the tested top (0.29.2,
    which needs torch >= 2.14): the one tested-top pin that gives way, said so."""
    freeze = _container_freeze(tmp_path)
    out = tmp_path / "wheels312"
    proc = _wheelhouse(out, "--python", "3.12", "--platform", "manylinux_2_28_x86_64", "--skip-installed", freeze)
    assert "Python 3.12, manylinux_2_28_x86_64" in proc.stdout and "(torch 2.11.0+cu130)" in proc.stdout
    assert "not constraints.txt's tested top: torchvision 0.26.0\n" in proc.stdout, proc.stdout
    platforms = platform_tags("manylinux_2_28_x86_64")  # the tags such a machine installs, as pip computes them
    target = {*cpython_tags((3, 12), platforms=platforms), *compatible_tags((3, 12), "cp312", platforms)}
    for wheel in out.glob("*.whl"):
        assert parse_wheel_filename(wheel.name)[3] & target, f"{wheel.name} does not install on the target"
    shipped = {canonicalize_name(parse_wheel_filename(w.name)[0]) for w in out.glob("*.whl")}
    assert not shipped & set(read_freeze(freeze)) and {"glm-grpo-ds", "deepspeed", "torchvision"} <= shipped
    assert "torch==2.11.0+cu130\n" in (out / "constraints.txt").read_text()

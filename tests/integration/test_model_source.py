"""Hub ids as model.path / --model / --base (glm_grpo_ds/model/source.py), on a real huggingface_hub cache
layout holding the tiny pipeline (glm_grpo_ds/testing/hub_cache.py): offline resolution, pinned
revisions, the one-line error when the cache lacks the model, a training run from a Hub id, and
that with downloads allowed only the model's resolution talks to the Hub (a local recording server
stands in for it: nothing here reaches a real hub)."""

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from glm_grpo_ds.config.fields import is_repo_id
from glm_grpo_ds.model.source import ModelSource, ModelSourceError, resolve_model
from glm_grpo_ds.testing.hub_cache import repo_folder, write_hub_cache

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "launch" / "configs" / "tiny_cpu.yaml"
REPO = "org/name"


@pytest.fixture(scope="module")
def hub(tiny_model_dir, tmp_path_factory):
    """A hub cache with REPO at two commits: ``main`` and tag ``v1`` on the first, and an older commit
    with no ref (reachable by its sha only), holding the tiny pipeline built with another seed."""
    from glm_grpo_ds.testing.tiny import build_tiny_pipeline

    cache = tmp_path_factory.mktemp("hf") / "hub"
    head = write_hub_cache(tiny_model_dir, cache, REPO, refs=("main", "v1"))
    other = build_tiny_pipeline(tmp_path_factory.mktemp("tiny1") / "model", seed=1)
    old = write_hub_cache(other, cache, REPO, commit="0" * 39 + "1", refs=())
    return {"cache": cache, "head": head, "old": old}


def env_with(**extra):
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    env.pop("HF_HOME", None)
    env.update(extra)
    return env


def test_the_cache_is_huggingface_hubs_layout(hub):
    from huggingface_hub import scan_cache_dir

    info = scan_cache_dir(hub["cache"])
    assert not info.warnings
    (repo,) = info.repos
    revisions = {r.commit_hash: set(r.refs) for r in repo.revisions}
    assert repo.repo_id == REPO and revisions == {hub["head"].name: {"main", "v1"}, hub["old"].name: set()}


def test_hub_id_resolves_offline_from_the_cache_main_tag_and_commit(hub):
    head, old = hub["head"], hub["old"]
    main = resolve_model(REPO, cache_dir=hub["cache"])
    assert main == ModelSource(head.resolve(), repo_id=REPO, revision=None, commit=head.name)
    tag = resolve_model(REPO, "v1", cache_dir=hub["cache"])
    assert tag.path == head.resolve() and tag.commit == head.name and tag.revision == "v1"
    pinned = resolve_model(REPO, old.name, cache_dir=hub["cache"])
    assert pinned.path == old.resolve() and pinned.commit == old.name
    assert (pinned.path / "vision_language_encoder" / "config.json").is_file()
    assert main.adapter_base() == (REPO, head.name)  # what a trained adapter records


def test_local_directory_is_used_as_is(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tiny_model_dir.parent)
    src = resolve_model(tiny_model_dir.name)  # relative: kept absolute
    assert src == ModelSource(tiny_model_dir.resolve()) and src.path.is_absolute()
    assert src.adapter_base() == (str(tiny_model_dir.resolve() / "vision_language_encoder"), None)
    with pytest.raises(ModelSourceError, match=r"model.revision=v1 applies to Hugging Face Hub ids, but model.path"):
        resolve_model(tiny_model_dir.name, "v1")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "x").mkdir(parents=True)  # an existing directory wins over the Hub id spelled alike
    with pytest.raises(FileNotFoundError, match=r"^model.path org/x is not a GLM-Image pipeline directory \(missing"):
        resolve_model("org/x")


def test_a_mistyped_path_under_a_local_directory_is_missing_not_a_hub_id(tmp_path, monkeypatch):
    """model.path=outputs/nomodel (the directory mistyped) was read as a Hub id: offline "hf download outputs/nomodel",
    online a download attempt. Its first part is a directory here, so it is a path that does not exist."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").mkdir()
    assert is_repo_id("outputs/nomodel")
    with pytest.raises(FileNotFoundError, match=r"^model.path outputs/nomodel is not a GLM-Image pipeline directory"):
        resolve_model("outputs/nomodel")


@pytest.mark.parametrize("name", ["/models/GLM-Image", "a/b/c", "./org/name", "org/na me", "org/", "~/x"])
def test_neither_directory_nor_hub_id_is_the_pipeline_directory_error(name):
    assert not is_repo_id(name)
    with pytest.raises(FileNotFoundError, match=r"is not a GLM-Image pipeline directory .*or a Hugging Face Hub id"):
        resolve_model(name)


def test_not_cached_offline_is_one_line_naming_id_revision_cache_and_fix(hub):
    for revision, rev in ((None, "main"), ("v2", "v2")):
        with pytest.raises(ModelSourceError) as err:
            resolve_model("org/missing" if revision is None else REPO, revision, cache_dir=hub["cache"])
        msg = str(err.value)
        name = "org/missing" if revision is None else REPO
        assert "\n" not in msg
        assert f"model.path {name} (revision {rev}) is neither a local directory nor complete in the" in msg
        assert str(hub["cache"]) in msg and "HF_HUB_OFFLINE=1 forbids downloading it" in msg
        assert f"hf download {name}" + (f" --revision {revision}" if revision else "") in msg
        assert "HF_HUB_OFFLINE=0" in msg


def test_cli_not_cached_exits_2_with_one_line(hub):
    proc = subprocess.run(
        [sys.executable, "-m", "glm_grpo_ds", "verify-logprobs", "--model", "org/missing", "--revision", "abc"],
        env=env_with(HF_HUB_CACHE=str(hub["cache"])),
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("glm-grpo verify-logprobs: --model org/missing (revision abc) is neither")
    assert f"cache {hub['cache']}," in lines[0] and "hf download org/missing --revision abc" in lines[0]


class _RecordingHub(http.server.BaseHTTPRequestHandler):
    """Answers every request 404 and records its path: stands in for the Hub (HF_ENDPOINT)."""

    paths: list = []

    def do_GET(self):  # noqa: N802  (http.server's naming)
        self.paths.append(self.path)
        self.send_response(404)
        self.end_headers()

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


@pytest.mark.slow
def test_downloads_allowed_only_the_model_resolution_asks_the_hub(hub, tiny_model_dir, tmp_path):
    """HF_HUB_OFFLINE=0 (the user's choice): rendering from a local directory sends nothing to the Hub;
    from a Hub id it asks only for that repository's revision (then reads the cache: the fake Hub has
    nothing), and the render works."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RecordingHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_port}"
    env = env_with(HF_HUB_OFFLINE="0", HF_ENDPOINT=endpoint, HF_HUB_CACHE=str(hub["cache"]))
    try:
        seen = {}
        for label, model in (("local", str(tiny_model_dir)), ("hub", REPO)):
            _RecordingHub.paths = []
            proc = subprocess.run(
                [sys.executable, "-m", "glm_grpo_ds", "render", "--model", model, "--prompt", "a red cube"]
                + ["--steps", "1", "--height", "64", "--width", "64", "--out", str(tmp_path / label)],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert proc.returncode == 0, proc.stderr[-2000:]
            assert (tmp_path / label / "000.png").is_file()
            seen[label] = list(_RecordingHub.paths)
    finally:
        server.shutdown()
    assert seen["local"] == []
    repo_requests = [p for p in seen["hub"] if "/models/" in p or "/resolve/" in p]
    assert repo_requests and all(p.startswith(f"/api/models/{REPO}/") for p in repo_requests), seen["hub"]


@pytest.mark.slow
def test_one_process_training_from_a_hub_id(hub, tmp_path):
    """`glm-grpo train` with model.path=org/name model.revision=v1 from the cache (offline): the run
    loads the snapshot, records the id and commit in config.json, and its adapters (final and
    checkpoint) record the Hub id and commit as their base."""
    (tmp_path / "p.txt").write_text("a red cube\na blue ball\n")
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "glm_grpo_ds", "train", "--config", str(CONFIG), "--deepspeed", "ds_configs/zero2.json"]
        + [f"model.path={REPO}", "model.revision=v1", f"data.train_file={tmp_path / 'p.txt'}", f"output_dir={out}"]
        + ["max_steps=1", "save_steps=1", "rollout.height=64", "rollout.width=64", "grpo.group_size=4"]
        + ["lora.r=4", "lora.alpha=8", "optimizer.name=adamw", "logging.progress_bar=false", "logging.plot=false"]
        + ["rewards=[{name: 'python:glm_grpo_ds.testing.tiny_data:mean_brightness'}]"],
        cwd=ROOT,
        env=env_with(HF_HUB_CACHE=str(hub["cache"])),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    head = hub["head"]
    config = json.loads((out / "config.json").read_text())
    assert config["train"]["model"]["path"] == REPO and config["train"]["model"]["revision"] == "v1"
    expected = {"path": str(head.resolve()), "repo_id": REPO, "revision": "v1", "commit": head.name}
    assert config["model_source"] == expected
    assert f"model: {REPO} @ {head.name} (revision v1" in proc.stdout
    for adapter in (out / "final_adapter", out / "checkpoints" / "step_000001" / "adapter"):
        saved = json.loads((adapter / "adapter_config.json").read_text())
        assert (saved["base_model_name_or_path"], saved["revision"]) == (REPO, head.name)


def test_repo_folder_name_is_huggingface_hubs():
    from huggingface_hub.file_download import repo_folder_name

    assert repo_folder("/c", REPO) == Path("/c") / repo_folder_name(repo_id=REPO, repo_type="model")


@pytest.mark.slow
@pytest.mark.distributed
def test_two_ranks_resolve_after_rank_0_and_fail_alike_when_a_cache_lacks_it(hub, tmp_path):
    """Under the deepspeed launcher (2 CPU ranks): both ranks load rank 0's snapshot; when rank 1's cache
    (another node's, not shared) lacks the model, every rank fails with one line that says why."""
    from launching import launch_cmd  # noqa: E402  (tests/integration/launching.py)

    def run(out, *extra):
        out.mkdir()
        cmd, env, _ = launch_cmd(2, [str(ROOT / "tests" / "integration" / "hub_worker.py"), str(out), REPO, *extra])
        env.update(HF_HUB_CACHE=str(hub["cache"]), OMP_NUM_THREADS="1")
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        return proc, [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]

    proc, records = run(tmp_path / "shared")
    assert proc.returncode == 0, proc.stderr[-2000:]
    head = hub["head"]
    expected = {"path": str(head.resolve()), "repo_id": REPO, "revision": None, "commit": head.name}
    assert records[0] == records[1] == expected

    proc, records = run(tmp_path / "split", "--rank1-cache", str(tmp_path / "empty_cache"))
    assert proc.returncode != 0
    assert "rank 0 has it, but another rank finds no complete copy in its Hugging Face cache" in records[0]["error"]
    assert "point HF_HOME (or HF_HUB_CACHE) at shared storage" in records[0]["error"]
    assert "this rank reads the cache only" in records[1]["error"]
    assert f"Hugging Face cache {tmp_path / 'empty_cache'}," in records[1]["error"]

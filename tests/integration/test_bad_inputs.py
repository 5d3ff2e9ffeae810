"""Bad inputs fail fast with one line (exit 2) and leave saved checkpoints alone: each case is
`glm-grpo train` run in this process (tests/in_process.py) on a copy of the shared short run's
output_dir (config, data, reward, model, output_dir, resume and DeepSpeed-JSON errors). The same path
through the real `deepspeed` launcher and as a new process: test_robustness.py and test_console.py."""

import json
import re
import shutil

import pytest
from in_process import train_main  # noqa: E402  (tests/in_process.py)
from launching import CONFIG, FAST, ROOT, common  # noqa: E402  (tests/integration/launching.py)
from run_files import tree_hash  # noqa: E402  (tests/run_files.py)

from glm_grpo_ds.config import ConfigError

pytestmark = pytest.mark.slow  # the shared run they copy is a training process (built once per session)


def _bad_jsonl(tmp):
    (tmp / "bad.jsonl").write_text('{"prompt": "a red cube"}\n{"prompt": "a blue ball",}\n')
    return [f"data.train_file={tmp / 'bad.jsonl'}"], r"bad.jsonl:2: not valid JSON"


def _empty(tmp):
    (tmp / "empty.jsonl").write_text("\n\n")
    return [f"data.train_file={tmp / 'empty.jsonl'}"], r"empty.jsonl holds no prompts; add one JSON object per line"


def _missing_target(tmp):
    (tmp / "t.jsonl").write_text('{"prompt": "a"}\n{"prompt": "b", "target_image": "gone.png"}\n')
    return [
        f"data.train_file={tmp / 't.jsonl'}"
    ], r"t.jsonl:2: target_image gone.png not found at .*gone.png; fix the path"


def _unreadable_target(tmp):
    (tmp / "broken.png").write_bytes(b"\x89PNG but truncated")
    (tmp / "t.jsonl").write_text('{"prompt": "a", "target_image": "broken.png"}\n{"prompt": "b"}\n')
    return [f"data.train_file={tmp / 't.jsonl'}"], r"t.jsonl:1: target_image broken.png cannot be read as an image"


def _unknown_reward(tmp):
    return ["rewards=[{name: pixel_mes}]"], r"rewards\[0\].name: unknown reward 'pixel_mes'; did you mean pixel_mse"


def _height(tmp):
    return ["rollout.height=100"], r"rollout.height=100 must be a positive multiple of 32"


def _micro_batch(tmp):
    return ["batch.micro_batch_size=3"], r"batch.micro_batch_size=3 must divide the sequences per rank per step"


def _offload_8bit(tmp):
    return (
        ["optimizer.name=adamw_8bit", "--deepspeed", "ds_configs/zero3_offload.json"],
        r"optimizer.name=adamw_8bit with zero_optimization.offload_optimizer",
    )


def _not_a_pipeline(tmp):
    (tmp / "model").mkdir()
    return [f"model.path={tmp / 'model'}"], r"model is not a GLM-Image pipeline directory \(missing model_index.json"


def _unwritable_out(tmp):
    # root ignores permission bits, so use a path below a regular file (the checkpoint's `latest`)
    return ["output_dir={out}/checkpoints/latest/sub"], r"output_dir .*latest/sub: .*latest is a file, not a directory"


def _stage_without_partitions(tmp):
    """A checkpoint goes to another ZeRO stage through a universal checkpoint, which stage 0 cannot load."""
    ds = json.loads((ROOT / "ds_configs" / "zero2.json").read_text())
    ds["zero_optimization"] = {"stage": 0}
    (tmp / "zero0.json").write_text(json.dumps(ds))
    return (
        ["resume_from=latest", "--deepspeed", str(tmp / "zero0.json")],
        r"was written with world size 1 and ZeRO stage 2; this run has world size 1 and stage 0, and only ZeRO-1, 2 "
        r"or 3 take a checkpoint written on another world size or stage",
    )


def _unknown_key(tmp):
    return ["grpo.bta=0.1"], r"unknown config key 'grpo.bta'; did you mean 'grpo.beta', 'grpo.delta'\?"


def _bad_ds_json(tmp):
    (tmp / "ds.json").write_text('{\n  "zero_optimization": {"stage": 2,}\n}\n')
    return [
        "--deepspeed",
        str(tmp / "ds.json"),
    ], r"ds.json is not valid JSON: Expecting property name .* at line 2, column 36"


def _reward_field_missing(tmp):
    (tmp / "p.txt").write_text("a red cube\na blue ball\n")
    return [
        f"data.train_file={tmp / 'p.txt'}"
    ], r"rewards\[0\] pixel_mse needs target_image but no row of data.train_file .*p.txt has one"


def _tokenizer_past_embedding(tmp):
    # a model whose AR embedding is smaller than its tokenizer (a processor from another model): issue #27's
    # IndexError mid-run becomes a one-line refusal before any weight loads
    from glm_grpo_ds.testing.tiny import build_tiny_pipeline, tiny_vocab

    model = build_tiny_pipeline(tmp / "model")
    config_file = model / "vision_language_encoder" / "config.json"
    config = json.loads(config_file.read_text())
    config["text_config"]["vocab_size"] = tiny_vocab()["<|assistant|>"]  # the chat template's marker is out
    config_file.write_text(json.dumps(config))
    return [f"model.path={model}"], r"model.path: the chat template's token .* AR embedding has \d+ rows"


def _dit_kernel_not_here(tmp):
    # the DiT's attention kernel is checked with the device, before any model loads
    message = r"decoder.attention=sdpa_cudnn needs a CUDA GPU \(this run decodes on cpu\)"
    return ["decoder.attention=sdpa_cudnn"], message


def _one_step_off_zero3(tmp):
    # two threads' collectives under ZeRO-3 could interleave differently on each rank: refused at the DS config
    message = r"zero3.json: rollout.one_step_off=true with ZeRO-3: the background rollout's parameter gathers"
    args = ["rollout.one_step_off=true", "grpo.sampler_correction=token_truncate"]
    return [*args, "--deepspeed", "ds_configs/zero3.json"], message


def _all_weights_zero(tmp):
    # every advantage 0: a run that learnt from no reward, loss 0 each step, exit 0
    return ["rewards=[{name: pixel_mse, weight: 0}]"], r"rewards: every weight is 0, so every advantage is 0"


CASES = {
    "1_malformed_jsonl": _bad_jsonl,
    "2_empty_dataset": _empty,
    "3_missing_target": _missing_target,
    "3_unreadable_target": _unreadable_target,
    "4_unknown_reward": _unknown_reward,
    "5_height": _height,
    "6_micro_batch": _micro_batch,
    "7_8bit_with_offload": _offload_8bit,
    "8_not_a_pipeline": _not_a_pipeline,
    "9_unwritable_output_dir": _unwritable_out,
    "10_stage_without_partitions": _stage_without_partitions,
    "11_unknown_key": _unknown_key,
    "12_invalid_ds_json": _bad_ds_json,
    "13_reward_field_missing": _reward_field_missing,
    "14_tokenizer_past_embedding": _tokenizer_past_embedding,
    "15_dit_kernel_not_here": _dit_kernel_not_here,
    "16_one_step_off_under_zero3": _one_step_off_zero3,
    "17_all_reward_weights_zero": _all_weights_zero,
}


def _split(args):
    """(overrides, ds_config) from a case's args (a case may swap the --deepspeed file)."""
    if "--deepspeed" in args:
        i = args.index("--deepspeed")
        return args[:i] + args[i + 2 :], args[i + 1]
    return args, "ds_configs/zero2.json"


def train(capfd, *args, ds_config="ds_configs/zero2.json", flags=()):
    return train_main(["--config", CONFIG, "--deepspeed", ds_config, *flags, *args], capfd)


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_one_line_exit_2_checkpoint_intact(case, short_run, tiny_model_dir, data64, tmp_path, capfd):
    out = tmp_path / "out"
    shutil.copytree(short_run / "checkpoints", out / "checkpoints")
    before = tree_hash(out)
    args, pattern = CASES[case](tmp_path)
    overrides, ds_config = _split([a.replace("{out}", str(out)) for a in args])
    code, err = train(capfd, *common(tiny_model_dir, data64, out, *FAST), *overrides, ds_config=ds_config)
    text = "\n".join(err)
    assert code == 2, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    ours = [line for line in err if line.startswith("glm-grpo train:")]
    assert len(ours) == 1, text[-3000:]
    assert re.search(pattern, ours[0]), ours[0]
    assert tree_hash(out) == before  # nothing saved was touched


def test_debug_raises_the_error_itself(tiny_model_dir, data64, tmp_path, capfd):
    """--debug: the exception propagates (a traceback from the interpreter) instead of the one line."""
    with pytest.raises(ConfigError, match=r"rollout.width=33 must be"):
        train(capfd, *common(tiny_model_dir, data64, tmp_path / "out", *FAST), "rollout.width=33", flags=["--debug"])


def test_a_dit_kernel_the_device_lacks_is_refused_before_the_model_files(
    tiny_model_dir, data64, tmp_path, capfd, monkeypatch
):
    """decoder.attention / decoder.fp8 are checked against the device first thing after the process group: before a
    Hub id would download and before any model loads (the decoder's own check would fire only after the policy)."""
    import glm_grpo_ds.startup

    def not_reached(*args, **kwargs):
        raise AssertionError("the model files were read before the DiT's kernel was checked")

    monkeypatch.setattr(glm_grpo_ds.startup, "resolve_for_training", not_reached)
    out = tmp_path / "out"
    code, err = train(capfd, *common(tiny_model_dir, data64, out, *FAST), "decoder.attention=sdpa_cudnn")
    ours = [line for line in err if line.startswith("glm-grpo train:")]
    assert code == 2 and len(ours) == 1 and "decoder.attention=sdpa_cudnn needs a CUDA GPU" in ours[0], err[-20:]
    assert not (out / "checkpoints").exists()


@pytest.mark.parametrize("local_rank", ["0", "1"])
def test_a_node_that_fails_its_input_checks_alone_says_so(local_rank, tiny_model_dir, tmp_path, capfd, monkeypatch):
    """A node whose copy of a path is missing (not on shared storage) fails before the process group, while the
    others may not: its first rank prints the line, named by rank and host (rank 0 prints it unnamed), its other
    ranks print nothing (the launcher shows that node's output once)."""
    from glm_grpo_ds.runtime import log

    monkeypatch.setattr(log.time, "sleep", lambda s: None)  # a rank other than 0 waits for rank 0's line
    monkeypatch.setenv("RANK", "9")
    monkeypatch.setenv("LOCAL_RANK", local_rank)
    monkeypatch.setenv("WORLD_SIZE", "16")
    missing = tmp_path / "only_on_node_0" / "prompts.jsonl"
    code, err = train(capfd, *common(tiny_model_dir, missing, tmp_path / "out", *FAST))
    assert code == 2
    named = [line for line in err if line.startswith("[rank 9, ")]
    if local_rank == "0":
        assert len(named) == 1 and "] glm-grpo train: data.train_file" in named[0] and str(missing) in named[0], err
    else:
        assert named == [] and not any("glm-grpo train:" in line for line in err), err
    assert not (tmp_path / "out").exists()


def test_a_collective_that_timed_out_ends_the_run_with_one_line_and_status_9(
    tiny_model_dir, data64, tmp_path, capfd, monkeypatch
):
    """train's main: a collective's timeout (gloo's own words) is one line naming whom the ranks waited for
    (glm_grpo_ds/observability/stuck.py) and exit 9, not the collective's traceback. Raised where the run's first
    collectives are met, before DeepSpeed builds its engine: this process may hold another test's engine groups."""
    import glm_grpo_ds.train

    def timed_out(*args, **kwargs):
        raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:129] Timed out waiting 60000ms")

    monkeypatch.setattr(glm_grpo_ds.train.Trainer, "from_config", timed_out)
    out = tmp_path / "out"
    code, err = train(capfd, *common(tiny_model_dir, data64, out, *FAST))
    ours = [line for line in err if line.startswith("glm-grpo train:")]
    assert code == 9 and "Traceback" not in "\n".join(err), err[-20:]
    assert len(ours) == 1 and ours[0].startswith(
        "glm-grpo train: rank 0: a collective timed out after dist_timeout_minutes=60 (Timed out waiting 60000ms): "
    ), ours
    assert ours[0].endswith("the run has no checkpoint yet: find what stopped it (its stacks: logs/rank_<r>.log; "
                            "docs/troubleshooting.md#a-run-that-hangs), then launch it again")  # fmt: skip

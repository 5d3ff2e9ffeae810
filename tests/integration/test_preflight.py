"""`glm-grpo train --check` (glm_grpo_ds/preflight.py): the job's own command line checked without loading a model
or opening a process group. A job that would start exits 0; each mistake a user meets on the first day (an unknown
reward, an empty prompt file, a missing resume path, an output_dir that is a file, a target module that matches
nothing, a bad hostfile) is one FAIL line, all of them in one pass, exit 2; a plan that does not fit exits 3 naming
the fastest shipped stage that does; a checkpoint of another cluster shape is planned or refused; nothing is
written. Run in this process (tests/in_process.py)."""

import json
import os

import pytest
from in_process import glm_grpo  # noqa: E402  (tests/in_process.py)
from launching import CONFIG, FAST  # noqa: E402  (tests/integration/launching.py)
from run_files import tree_hash, write_ds_files  # noqa: E402  (tests/run_files.py)

from glm_grpo_ds.config import TrainConfig, to_dict


def _check(tiny_model_dir, data, out, capfd, *extra):
    argv = ["train", "--check", "--config", str(CONFIG), "--deepspeed", "ds_configs/zero2.json"]
    argv += [f"model.path={tiny_model_dir}", f"data.train_file={data}", f"output_dir={out}", *FAST, *extra]
    code, stdout, stderr = glm_grpo(argv, capfd)
    lines = [line.strip() for line in stdout.splitlines()]
    return code, lines, stderr


def _fails(lines):
    return [line[len("FAIL") :].strip() for line in lines if line.startswith("FAIL")]


def test_a_job_that_would_start(tiny_model_dir, tiny_data, tmp_path, capfd):
    out = tmp_path / "run"
    code, lines, _ = _check(tiny_model_dir, tiny_data, out, capfd, "--num-gpus", "2", "--gpu-memory-gb", "24")
    assert code == 0, lines
    assert lines[-1] == "glm-grpo train --check: the job would start"
    assert "ok    config: 1 node(s) x 2 GPU(s) = 2 ranks" in lines
    assert any(line.startswith(f"ok    data.train_file {tiny_data}: ") for line in lines), lines
    assert f"ok    model.path {tiny_model_dir}: a pipeline directory" in lines
    assert "ok    DeepSpeed config ds_configs/zero2.json: ZeRO-2, filled for 2 ranks" in lines
    assert f"ok    output_dir {out}: a fresh start" in lines
    assert any(line.startswith("ok    memory plan: ") for line in lines), lines
    assert any(line.startswith("ok    output_dir disk: a checkpoint ~") and " free" in line for line in lines), lines
    assert not out.exists()  # nothing written


def test_a_disk_without_room_for_one_checkpoint_is_refused(tiny_model_dir, tiny_data, small_disk, capfd):
    """output_dir on a real 1 MiB file system (a tmpfs, where this machine lets a test mount one): the run could write
    no checkpoint (its size + 256 MiB) and no final weights there: one FAIL line naming the disk, exit 2."""
    code, lines, _ = _check(tiny_model_dir, tiny_data, small_disk / "run", capfd, "save_steps=1")
    assert code == 2, lines
    (fail,) = _fails(lines)
    assert fail.startswith("output_dir disk: a checkpoint ~"), fail
    assert fail.endswith("its file system has 1.0 MiB free: free space there"), fail


def test_an_output_dir_that_cannot_be_created_is_one_fail_not_also_a_disk_without_room(
    tiny_model_dir, tiny_data, capfd
):
    """output_dir under /sys (a file system no one writes, 0 bytes free): the line that it cannot be created, not also
    one that the nearest folder above it has no room."""
    if not os.path.ismount("/sys"):
        pytest.skip("no sysfs mounted at /sys here")
    code, lines, _ = _check(tiny_model_dir, tiny_data, "/sys/glm_grpo_run", capfd)
    assert code == 2, lines
    (fail,) = _fails(lines)
    assert fail.startswith("output_dir /sys/glm_grpo_run cannot be created in /sys ("), fail


def test_every_first_day_mistake_in_one_pass(tiny_model_dir, tmp_path, capfd):
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "a_file").write_text("")
    code, lines, _ = _check(
        tiny_model_dir,
        tmp_path / "empty.jsonl",
        tmp_path / "a_file",
        capfd,
        "rewards=[{name: pixel_mes}]",
        f"resume_from={tmp_path / 'no_such_checkpoint'}",
        "lora.target_modules=[q_proj,qkv]",
    )
    assert code == 2, lines
    fails = _fails(lines)
    assert len(fails) == 4, fails
    assert fails[0].startswith("rewards[0].name: unknown reward 'pixel_mes'; did you mean pixel_mse")
    assert "empty.jsonl holds no prompts" in fails[1]
    assert fails[2].startswith("lora.target_modules: 'qkv' names no linear layer")
    assert fails[3].startswith(f"output_dir {tmp_path / 'a_file'} is a file, not a directory")
    assert lines[-1] == "glm-grpo train --check: 4 problem(s): the job would not start"


def test_a_missing_resume_path_is_refused(tiny_model_dir, tiny_data, tmp_path, capfd):
    code, lines, _ = _check(tiny_model_dir, tiny_data, tmp_path / "run", capfd, f"resume_from={tmp_path / 'gone'}")
    assert code == 2
    assert _fails(lines) == [
        f"resume_from {tmp_path / 'gone'} does not exist ({tmp_path} holds none; resume_from=latest takes the newest)"
    ]


def test_a_plan_that_does_not_fit_names_the_stage_that_does(tiny_model_dir, tiny_data, tmp_path, capfd):
    code, lines, _ = _check(tiny_model_dir, tiny_data, tmp_path / "run", capfd, "--gpu-memory-gb", "0.05")
    fails = _fails(lines)
    assert code == 3 and len(fails) == 1, lines
    assert fails[0].startswith("memory plan: ") and "does not fit in 0 GiB; fastest that fits: " in fails[0]


def test_the_hostfile_gives_the_shape_and_a_bad_line_is_one_fail(tiny_model_dir, tiny_data, tmp_path, capfd):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-0 slots=2\nnode-1 slots=2\n")
    code, lines, _ = _check(tiny_model_dir, tiny_data, tmp_path / "run", capfd, "--hostfile", str(hostfile))
    assert code == 0, lines
    assert "ok    config: 2 node(s) x 2 GPU(s) = 4 ranks" in lines
    # --num-nodes takes the hostfile's first nodes, as the launcher does
    code, lines, _ = _check(
        tiny_model_dir, tiny_data, tmp_path / "run", capfd, "--hostfile", str(hostfile), "--num-nodes", "1"
    )
    assert code == 0 and "ok    config: 1 node(s) x 2 GPU(s) = 2 ranks" in lines, lines
    hostfile.write_text("node-0 slots=2\nnode-1 slots two\n")
    code, lines, _ = _check(tiny_model_dir, tiny_data, tmp_path / "run", capfd, "--hostfile", str(hostfile))
    assert code == 2
    assert len(_fails(lines)) == 1 and _fails(lines)[0].startswith(f"hostfile {hostfile}"), lines
    assert ":2" in _fails(lines)[0] or "line 2" in _fails(lines)[0]


def test_unknown_keys_stop_the_check_at_once(tiny_model_dir, tiny_data, tmp_path, capfd):
    code, lines, stderr = _check(
        tiny_model_dir, tiny_data, tmp_path / "run", capfd, "grpo.kl_coef=0.1", "clip_range=0.2"
    )
    assert code == 2
    assert stderr.splitlines()[0].startswith("glm-grpo train --check: 2 unknown config keys (config file ")
    assert "grpo.kl_coef: kl_coef (the seeds' plan, verl) is grpo.beta here" in stderr


def test_a_checkpoint_of_another_cluster_shape_is_planned_or_refused(tiny_model_dir, tiny_data, tmp_path, capfd):
    """A checkpoint written on 4 ranks at ZeRO-3 (trainer_state.json is all the check reads) checked for 2 ranks at
    ZeRO-2: with batch.prompts_per_rank=2 (4 prompts per step kept) it resumes through a conversion, said in its ok
    line; with 1 the global batch would halve: one FAIL naming the setting that keeps it. Nothing is written."""
    out = tmp_path / "run"
    step = out / "checkpoints" / "step_000002"
    write_ds_files(step, 4, 3)
    config = to_dict(TrainConfig())
    config["optimizer"]["name"], config["batch"]["prompts_per_rank"] = "adamw", 1  # as FAST trains
    state = {"step": 2, "world_size": 4, "zero_stage": 3, "sampler": {}, "config": config}
    (step / "trainer_state.json").write_text(json.dumps(state))
    (out / "checkpoints" / "latest").write_text(step.name)
    before = tree_hash(out)
    args = ("--num-gpus", "2", "resume_from=auto", "max_steps=4")
    code, lines, _ = _check(tiny_model_dir, tiny_data, out, capfd, *args, "batch.prompts_per_rank=2")
    assert code == 0, lines
    assert any(
        line.startswith(f"ok    output_dir {out}: resumes from {step} (step 2), written on 4 rank(s) at ZeRO-3: its")
        for line in lines
    ), lines
    code, lines, _ = _check(tiny_model_dir, tiny_data, out, capfd, *args)
    assert code == 2
    assert _fails(lines) == [
        f"resume_from: {step} trained 4 prompts per step (world size 4 x batch.prompts_per_rank 1); this launch would "
        "train 2 (2 x 1): set batch.prompts_per_rank=2 to keep 4, or allow_batch_change=true to go on with 2 prompts "
        "per step; nothing was changed"
    ], lines
    assert tree_hash(out) == before


def test_a_resume_with_the_runs_own_sampling_is_checked_without_sampling_changes(
    short_run, tiny_model_dir, data64, capfd
):
    """The run records grpo.sampling's unset knobs as the model's own (temperature, top_k, top_p); the check compared
    them unfilled and warned `grpo.sampling.temperature 1.0 -> null; ...` where the resume itself warns of nothing."""
    same = ("--num-gpus", "1", "resume_from=latest", "max_steps=2", "save_steps=1", "logging.status_interval_s=0")
    code, lines, err = _check(tiny_model_dir, data64, short_run, capfd, *same)
    assert code == 0, lines
    assert f"ok    output_dir {short_run}: resumes from {short_run}/checkpoints/step_000001 (step 1)" in lines, lines
    assert "grpo.sampling" not in err, err


def test_nodes_with_different_gpu_counts_are_their_sum_and_too_few_prompts_for_a_step_are_refused(
    tiny_model_dir, tmp_path, capfd
):
    """A hostfile of 2 + 1 slots is 3 ranks (DeepSpeed's world: the slots summed), not 2 x the largest: three prompts
    fill its step. On 2 + 2 they do not: the FAIL the ranks would meet after the job queued (PromptOrder)."""
    prompts = tmp_path / "three.txt"
    prompts.write_text("red image\nblue image\ngreen image\n")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-0 slots=2\nnode-1 slots=1\n")
    extra = ("--hostfile", str(hostfile), "rewards=[{name: colour_layout}]")
    code, lines, _ = _check(tiny_model_dir, prompts, tmp_path / "run", capfd, *extra)
    assert code == 0, lines
    assert "ok    config: 2 node(s) = 3 ranks" in lines
    assert "ok    DeepSpeed config ds_configs/zero2.json: ZeRO-2, filled for 3 ranks" in lines
    hostfile.write_text("node-0 slots=2\nnode-1 slots=2\n")
    code, lines, _ = _check(tiny_model_dir, prompts, tmp_path / "run", capfd, *extra)
    assert code == 2
    assert _fails(lines) == [
        "data.train_file has 3 prompts but a step needs 4 distinct ones (world size 4 x batch.prompts_per_rank 1)"
    ], lines


def test_the_gpu_checks_prompts_fill_a_step_of_two_nodes_of_8_gpus():
    """launch/gpu_check.sh --num-gpus 8 (and 2 nodes of 8) trains on gpu_check.yaml's prompts, one per rank: it
    shipped 4, and every rank above the fourth exited 2 after the process group opened."""
    from glm_grpo_ds.config import load_config
    from glm_grpo_ds.data import load_prompts
    from glm_grpo_ds.data.prompt_order import check_enough
    from glm_grpo_ds.rewards.colour_layout import prompt_target

    cfg = load_config(str(CONFIG.parent / "gpu_check.yaml"), [])
    rows = load_prompts(CONFIG.parents[2] / cfg.data.train_file, "data.train_file", cfg.data)
    check_enough(len(rows), 16, cfg.batch.prompts_per_rank)
    assert len({row.prompt for row in rows}) == len(rows)
    for row in rows:  # every prompt in colour_layout's grammar (a prompt outside it fails the reward)
        prompt_target(row.prompt, 64, 64)


def test_cpu_ranks_are_checked_as_they_run(tiny_model_dir, tiny_data, tmp_path, capfd):
    """launch/train.sh on CPU ranks with a DeepSpeed config of bf16 off and model.dtype auto (fp32 on a CPU): the
    check planned for a GPU, where auto is bf16, and refused the job the ranks would run; --device cpu (what
    train.sh passes for CPU ranks) checks it as it runs."""
    ds = json.loads((CONFIG.parents[2] / "ds_configs" / "zero2.json").read_text())
    ds["bf16"] = {"enabled": False}
    (tmp_path / "fp32.json").write_text(json.dumps(ds))
    argv = ["train", "--check", "--config", str(CONFIG), "--deepspeed", str(tmp_path / "fp32.json"), "model.dtype=auto"]
    argv += [f"model.path={tiny_model_dir}", f"data.train_file={tiny_data}", f"output_dir={tmp_path / 'run'}", *FAST]
    code, stdout, _ = glm_grpo(argv, capfd)
    assert code == 2 and "bf16" in stdout, stdout
    code, stdout, _ = glm_grpo([*argv, "--device", "cpu"], capfd)
    assert code == 0, stdout
    # and says so: CPU ranks, not GPUs
    assert "config: 1 node(s) x 8 CPU rank(s) = 8 ranks" in stdout and " GiB per CPU rank; host RAM" in stdout


def test_a_deepspeed_json_deepspeed_would_refuse_is_one_fail_naming_the_file_once(
    tiny_model_dir, tiny_data, tmp_path, capfd
):
    """zero_allow_untested_optimizer=false with bitsandbytes' optimizer passed the check, then DeepSpeed's initialize
    asserted in a traceback; a key given twice was named "DeepSpeed config F: F: ..."."""
    ds = json.loads((CONFIG.parents[2] / "ds_configs" / "zero2.json").read_text())
    ds["zero_allow_untested_optimizer"] = False
    (tmp_path / "strict.json").write_text(json.dumps(ds))
    text = (CONFIG.parents[2] / "ds_configs" / "zero2.json").read_text()
    (tmp_path / "twice.json").write_text(text.replace('"stage": 2,', '"stage": 2, "stage": 3,'))
    for name, message in [
        ("strict.json", "zero_allow_untested_optimizer=false refuses optimizer.name=adamw_8bit"),
        ("twice.json", "Duplicate keys in DeepSpeed config: ['stage']"),
    ]:
        argv = ["train", "--check", "--config", str(CONFIG), "--deepspeed", str(tmp_path / name), "--device", "cpu"]
        argv += [f"model.path={tiny_model_dir}", f"data.train_file={tiny_data}", f"output_dir={tmp_path / 'run'}"]
        code, stdout, _ = glm_grpo([*argv, *FAST, "optimizer.name=adamw_8bit"], capfd)
        assert code == 2, stdout
        (fail,) = [line.strip()[len("FAIL") :].strip() for line in stdout.splitlines() if "FAIL" in line]
        assert fail.startswith(f"{tmp_path / name}: {message}"), fail


def test_the_eval_file_is_checked_as_the_ranks_check_it(tiny_model_dir, tiny_data, tmp_path, capfd):
    """The start refuses an eval.file whose rows lack what a reward needs (pixel_mse: target_image) or whose prompts
    hold ids the model has no embedding for; the check read the eval file and said the job would start."""
    (tmp_path / "eval.jsonl").write_text('{"prompt": "a red square"}\n{"prompt": "a blue square"}\n')
    code, lines, _ = _check(tiny_model_dir, tiny_data, tmp_path / "run", capfd, f"eval.file={tmp_path / 'eval.jsonl'}")
    assert code == 2, lines
    (fail,) = _fails(lines)
    assert "pixel_mse needs target_image but no row of eval.file" in fail, fail


def test_a_setting_the_run_will_not_act_on_is_a_note_not_a_failure(tiny_model_dir, tiny_data, tmp_path, capfd):
    code, lines, _ = _check(tiny_model_dir, tiny_data, tmp_path / "run", capfd, "optimizer.warmup_steps=1000")
    assert code == 0, lines
    assert any(line.startswith("note  optimizer.warmup_steps=1000 is not shorter than the run's") for line in lines)


def test_an_offloaded_optimizer_whose_op_cannot_build_here_is_refused(
    tiny_model_dir, tiny_data, tmp_path, capfd, monkeypatch
):
    """zero3_offload.json steps with DeepSpeed's CPU Adam, an op every rank builds at start: without the compiler
    (CXX here names one that is not there) the ranks failed after the job queued and the model loaded."""
    offload = ["--deepspeed", "ds_configs/zero3_offload.json", "optimizer.name=adamw", "--device", "cpu"]
    code, lines, _ = _check(tiny_model_dir, tiny_data, tmp_path / "run", capfd, *offload)
    assert (
        "ok    ds_configs/zero3_offload.json: DeepSpeed's cpu_adam op for the offloaded optimizer loads here" in lines
    )
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    code, lines, _ = _check(tiny_model_dir, tiny_data, tmp_path / "run", capfd, *offload)
    assert code == 2, lines
    (fail,) = _fails(lines)
    assert fail.startswith("ds_configs/zero3_offload.json: DeepSpeed's cpu_adam op builds at start and needs a C++ ")
    assert "DS_BUILD_CPU_ADAM=1" in fail and fail.endswith("(on the machine this check runs on)")

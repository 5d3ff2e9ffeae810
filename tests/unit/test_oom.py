"""The line a run says when a GPU runs out of memory (glm_grpo_ds/memory/oom.py): torch's figures read from its
message, where the error was met (marked as it left a measured phase and a reward: runtime/oom.py), the plan's
figure for that phase and the settings that plan that phase lower, planned again by the real planner on the shipped
GLM-Image config. The run's end (exit 8, one line from the rank that met it): tests/integration/test_robustness.py."""

from pathlib import Path

import pytest
import torch

from glm_grpo_ds.config import load_config, with_overrides
from glm_grpo_ds.ds.ds_config import read_ds_config
from glm_grpo_ds.memory import oom
from glm_grpo_ds.memory.phases import phase_totals
from glm_grpo_ds.memory.plan import GIB, EstimateConfig, plan
from glm_grpo_ds.memory.sizes import model_sizes
from glm_grpo_ds.observability.meter import Meter
from glm_grpo_ds.rewards.registry import RewardSet
from glm_grpo_ds.runtime.oom import mark, marks, out_of_memory

ROOT = Path(__file__).resolve().parents[2]

# the caching allocator's message as torch 2.15 words it (c10/cuda/CUDACachingAllocator.cpp)
CUDA_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.23 GiB is "
    "free. Including non-PyTorch memory, this process has 77.90 GiB memory in use. Of the allocated memory 70.10 GiB "
    "is allocated by PyTorch, and 6.50 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory "
    "is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
    "documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html)"
)


def test_torch_figures_are_read_from_its_message():
    text, spare, capacity = oom.torch_figures(CUDA_MESSAGE)
    assert text == "tried to allocate 2.00 GiB with 1.23 GiB of 79.15 GiB free"
    assert spare == 6.5 * GIB and capacity == 79.15 * GIB
    # another allocator's words: its first sentence, no figures
    xpu = "XPU out of memory. Tried to allocate 1 GB on device 0."
    assert oom.torch_figures(xpu) == ("XPU out of memory", None, None)


def test_a_measured_phase_and_a_reward_mark_the_error_the_innermost_first():
    meter = Meter()
    with pytest.raises(torch.OutOfMemoryError) as caught, meter.measure("reward"):
        with meter.measure("decode"):  # an inner phase marks first and stays
            raise torch.OutOfMemoryError(CUDA_MESSAGE)
    assert marks(caught.value) == ("decode", None)
    err = torch.OutOfMemoryError("x")
    mark(err, part="reward ocr")
    mark(err, phase="reward", part="the evaluation at step 20")
    assert marks(err) == ("reward", "reward ocr in the evaluation at step 20")


def test_an_error_caused_by_running_out_of_memory_is_told_by_its_chain():
    """A CUDA graph's capture that failed because an allocation inside it did raises its own error from __exit__,
    with the out-of-memory error as its context: the run's line is still the out-of-memory one, with the phase."""

    class Capture:  # as torch.cuda.graph: its __exit__ ends the capture, which fails after an error inside it
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")

    meter = Meter()
    with pytest.raises(RuntimeError) as caught, meter.measure("rollout"), Capture():
        raise torch.OutOfMemoryError(CUDA_MESSAGE)
    starved = out_of_memory(caught.value)
    assert isinstance(starved, torch.OutOfMemoryError) and marks(starved) == ("rollout", None)
    assert out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None


def test_a_reward_out_of_memory_ends_the_step_and_is_no_failure_of_its_samples():
    """A reward's exception makes its samples undefined and the run goes on; out of memory is the run's problem,
    not the samples' (training on the other rewards alone would change what the run optimizes): it leaves the
    reward set, marked with the reward, and no sample is counted failed."""

    def starved(images, prompts, samples):
        raise torch.OutOfMemoryError(CUDA_MESSAGE)

    def broken(images, prompts, samples):
        raise RuntimeError("scorer offline")

    rewards = RewardSet([("starved", 1.0, starved), ("broken", 1.0, broken)])
    images, prompts = torch.zeros(2, 3, 8, 8), ["a", "b"]
    with pytest.raises(torch.OutOfMemoryError) as caught:
        rewards.score(images, prompts, [{}, {}])
    assert marks(caught.value) == (None, "reward starved") and rewards.failed["starved"] == 0
    values = RewardSet([("broken", 1.0, broken)]).score(images, prompts, [{}, {}])
    assert torch.isnan(values["broken"]).all()  # any other exception still only undefines the batch


@pytest.fixture(scope="module")
def lora_plan_of():
    """The shipped LoRA config at ZeRO-2 on 8 x 80 GB, and how the run's line plans a config (as the trainer does)."""
    raw, est = read_ds_config(ROOT / "ds_configs/zero2.json"), EstimateConfig(8, 1, 80.0)
    cfg = load_config(str(ROOT / "launch/configs/glm_image_lora.yaml"), [])
    sizes = model_sizes(cfg)
    return cfg, lambda config: plan(config, raw, est, sizes)


def _oom(phase: str, part: str | None = None, message: str = CUDA_MESSAGE) -> torch.OutOfMemoryError:
    err = torch.OutOfMemoryError(message)
    mark(err, phase=phase, part=part)
    return err


def test_the_line_names_the_phase_its_plan_and_the_settings_that_plan_that_phase_lower(lora_plan_of, tmp_path):
    cfg, plan_of = lora_plan_of
    given = plan_of(cfg)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("step_000010")
    decode = oom.explain(_oom("decode"), 12, tmp_path, plan_of, cfg)
    assert decode.startswith(
        "glm-grpo train: out of GPU memory in the decode phase of step 12: tried to allocate 2.00 GiB with 1.23 GiB "
        f"of 79.15 GiB free; the plan puts this phase at {phase_totals(given)['decode'] / GIB:.1f} of 80.0 GiB; "
        "planned lower with one change: "
    )
    assert decode.endswith(
        "the last checkpoint is step_000010 (checkpoints/latest): make one of these changes, then resume with "
        "resume_from=latest"
    )
    # each named change with what it saves on the decode's planned peak, the largest first; the update's micro-batch
    # saves the decode nothing and is not named, though it lowers the update's peak
    fewer = f"decoder.batch_size={cfg.decoder.batch_size // 2}"
    saved = (phase_totals(given)["decode"] - phase_totals(plan_of(with_overrides(cfg, [fewer])))["decode"]) / GIB
    assert saved > 1 and f"{fewer} -{saved:.1f} GiB: fewer images per DiT forward" in decode
    assert decode.index("decoder.fp8=true -5.6 GiB") < decode.index(fewer)  # the larger saving first
    assert "batch.micro_batch_size" not in decode and "decoder.offload" not in decode  # nothing off the decode's peak
    update = oom.explain(_oom("update"), 12, tmp_path, plan_of, cfg)
    assert "the update phase of step 12" in update and "batch.micro_batch_size=4 -3.0 GiB" in update
    assert "decoder.offload=true -13.5 GiB" in update and "decoder.batch_size" not in update
    # 6.5 GiB reserved but unallocated is 8 % of the GPU: fragmentation is named
    assert "6.50 GiB were reserved but unallocated (fragmentation): launching with " in decode
    calm = CUDA_MESSAGE.replace("6.50 GiB is reserved", "0.50 GiB is reserved")
    assert "fragmentation" not in oom.explain(_oom("decode", message=calm), 12, tmp_path, plan_of, cfg)


def test_a_reward_or_startup_out_of_memory_and_a_plan_that_fails_still_give_the_line(lora_plan_of, tmp_path):
    cfg, plan_of = lora_plan_of
    line = oom.explain(_oom("reward", "reward aesthetic"), 3, tmp_path, plan_of, cfg)
    assert "in the reward phase of step 3 (reward aesthetic):" in line
    # a reward model offloaded between scores is on the GPU while it scores: it saves the reward phase nothing
    assert "decoder.offload=true -13.5 GiB" in line and "rewards[1].args.offload" not in line
    rollout = oom.explain(_oom("rollout"), 3, tmp_path, plan_of, cfg)
    assert "rewards[1].args.offload=true -1.6 GiB: the aesthetic model on the host between scores" in rollout
    assert line.endswith("the run has no checkpoint yet: make one of these changes, then launch it again")
    startup = oom.explain(torch.OutOfMemoryError(CUDA_MESSAGE), None, tmp_path, plan_of, cfg)
    assert "out of GPU memory during startup: tried to allocate" in startup
    assert f"the plan puts the run's peak at {plan_of(cfg)['total_bytes'] / GIB:.1f} of 80.0 GiB" in startup

    def unplannable(config):
        raise OSError("ds_configs/zero2.json: No such file or directory")

    line = oom.explain(_oom("update"), 3, tmp_path, unplannable, cfg)
    assert "the run could not be planned again (ds_configs/zero2.json: No such file or directory)" in line
    assert "6.50 GiB were reserved but unallocated" in line  # 8 % of torch's own capacity, plan or not
    assert line.endswith("then launch it again")


def test_the_trainers_line_plans_each_change_on_the_config_it_runs_with(tmp_path):
    """train_line, as train.py calls it when the error came while the run was built: the run's config file removed
    since it was loaded (a sweep's temporary file) still gives each change, planned on the config in memory."""
    config = tmp_path / "lora.yaml"
    config.write_text((ROOT / "launch/configs/glm_image_lora.yaml").read_text())
    cfg = load_config(str(config), [f"output_dir={tmp_path / 'run'}"])
    config.unlink()
    line = oom.train_line(_oom("decode"), cfg, str(ROOT / "ds_configs/zero2.json"), run=None, step=None)
    assert line.startswith("glm-grpo train: out of GPU memory in the decode phase during startup: tried to allocate")
    assert "planned lower with one change: decoder.fp8=true -" in line and "decoder.batch_size=2 -" in line
    assert line.endswith("the run has no checkpoint yet: make one of these changes, then launch it again")


def test_one_step_off_is_offered_where_its_rollout_beside_the_decode_is_planned():
    """rollout.one_step_off adds the rollout drawn ahead to the decode's peak (rollout_beside_decode): turning it off
    is a change that plans the decode lower, named with its saving there and nowhere else."""
    config, raw = str(ROOT / "launch/configs/glm_image_lora.yaml"), read_ds_config(ROOT / "ds_configs/zero2.json")
    on = ["rollout.one_step_off=true", "grpo.sampler_correction=token_truncate"]
    cfg = load_config(config, on)
    sizes = model_sizes(cfg)
    plan_of = lambda c: plan(c, raw, EstimateConfig(8, 1, 80.0), sizes)  # noqa: E731
    given, serial = plan_of(cfg), plan_of(with_overrides(cfg, ["rollout.one_step_off=false"]))
    saved = (phase_totals(given)["decode"] - phase_totals(serial)["decode"]) / GIB
    decode = oom.explain(_oom("decode"), 5, Path("/nonexistent"), plan_of, cfg)
    assert saved > 0.05 and f"rollout.one_step_off=false -{saved:.1f} GiB: no rollout beside the decode" in decode
    assert "rollout.one_step_off" not in oom.explain(_oom("update"), 5, Path("/nonexistent"), plan_of, cfg)


def test_an_evaluations_line_names_the_change_that_makes_its_phase_smaller(tmp_path):
    """glm-grpo evaluate's line (commands/evaluate.py oom_line, memory/oom.py command_line) by phase: the DiT's batch
    at the decode, --batch-prompts at the rollout and the reward, nothing where none is left to halve; the batches
    its store keeps. The command's end (exit 8): tests/integration/test_evaluate_command.py."""
    from argparse import Namespace

    from glm_grpo_ds.commands.evaluate import oom_line

    cfg = load_config(str(ROOT / "launch/configs/glm_image_lora.yaml"), ["decoder.batch_size=8"])
    store = tmp_path / "progress" / "rank_0"
    for name, batches in (("base", (0, 4, 8)), ("adapter_1", (0, 4))):  # the adapter's third batch not yet done
        (store / name).mkdir(parents=True)
        for start in batches:
            (store / name / f"batch_{start:06d}.pt").write_bytes(b"")

    def line(phase, batch_prompts=4, **overrides):
        err = torch.OutOfMemoryError(CUDA_MESSAGE.replace("6.50 GiB is reserved", "0.50 GiB is reserved"))
        mark(err, phase=phase, part="model adapter_1, prompt rows 8-11")
        config = with_overrides(cfg, [f"{k}={v}" for k, v in overrides.items()])
        names = ["base", "adapter_1"]
        return oom_line(err, Namespace(batch_prompts=batch_prompts, samples_per_prompt=4), config, store, names)

    start = "glm-grpo evaluate: out of GPU memory in the {} phase (model adapter_1, prompt rows 8-11): tried to "
    end = f"; this rank's 2 finished batches of prompts are kept in {store}: the same settings go on"
    assert line("decode").startswith(start.format("decode")) and line("decode").endswith(end)
    fewer_dit = "; decoder.batch_size=4 decodes half as many images per DiT forward (now 8);"
    assert fewer_dit in line("decode")
    fewer_prompts = "; --batch-prompts 2 samples and scores half as many images at once (now 4 prompts x 4 samples);"
    assert fewer_prompts in line("rollout") and fewer_prompts in line("reward")
    # rewards streamed behind the decode score each DiT batch as it comes
    assert fewer_dit in line("reward", **{"decoder.stream_rewards": "true"})
    nothing = "; no setting of this command makes it smaller: a GPU with more free memory;"
    assert nothing in line("decode", **{"decoder.batch_size": 1}) and nothing in line("rollout", batch_prompts=1)
    assert nothing in line(None) and "fragmentation" not in line(None)


def test_decode_agreements_line_names_the_change_that_makes_its_phase_smaller():
    """glm-grpo decode-agreement's line (commands/decode_agreement.py oom_line) by phase: the DiT's batch at the
    decode, --num-prompts at the rollout and the reward, nothing where none is left to halve."""
    from argparse import Namespace

    from glm_grpo_ds.commands.decode_agreement import oom_line

    cfg = load_config(str(ROOT / "launch/configs/glm_image_lora.yaml"), ["decoder.batch_size=8"])

    def line(phase, num_prompts=16):
        err = torch.OutOfMemoryError(CUDA_MESSAGE)
        mark(err, phase=phase)
        return oom_line(err, Namespace(num_prompts=num_prompts), cfg)

    assert line("decode").startswith("glm-grpo decode-agreement: out of GPU memory in the decode phase: tried to ")
    assert "; decoder.batch_size=4 decodes half as many images per DiT forward (now 8); 6.50 GiB were" in line("decode")
    for phase in ("rollout", "reward"):
        assert (
            f"; --num-prompts 8 samples and scores half as many groups at once (now 16 of {cfg.grpo.group_size} "
            in (line(phase))
        )
    assert "; no setting of this command makes it smaller" in line("rollout", num_prompts=1)
    assert line(None).endswith("; nothing was written")

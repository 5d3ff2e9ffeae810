"""rollout.one_step_off under real DeepSpeed (2 CPU ranks, ZeRO-2): step t+1's rollout sampled on a background
thread with step t's weights. With weights that do not move it samples exactly what the on-policy loop samples
(the same prompts, seeds, tokens, rewards); with learning, every step after the first trains on tokens one update
old (the sampler-vs-trainer gap shows it), and a resume from a checkpoint, which keeps the pending rollout, is
exact."""

import json
import re

import pytest
import torch
from launching import common, launch, train_args  # noqa: E402  (tests/integration/launching.py)
from run_files import metrics  # noqa: E402  (tests/run_files.py)
from safetensors.torch import load_file

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # training runs on 2 ranks

VOLATILE = ("time/", "_per_s", "peak_", "memory/")  # wall-clock and memory differ between runs
OFF = ["rollout.one_step_off=true"]
STILL = "optimizer.lr=1e-30"  # AdamW's step then rounds away in fp32: the weights never change


def _stable(record, drop=()):
    return {k: v for k, v in record.items() if not any(tag in k for tag in VOLATILE + tuple(drop))}


def train(args) -> str:
    return launch(2, train_args(*args, ds_config="zero2.json"), 600, launcher=False).stderr


@pytest.fixture(scope="module")
def runs(tiny_model_dir, data64, tmp_path_factory):
    root = tmp_path_factory.mktemp("one_step_off")
    extra = ["rollout.height=64", "rollout.width=64", "logging.progress_bar=false", "logging.plot=false"]
    extra += ["grpo.sampler_correction=token_truncate", "logging.sample_records=1"]
    runs = {name: root / name for name in ("straight", "resumed", "still_off", "still_on")}

    def run(name, *args):
        stderr = train(common(tiny_model_dir, data64, runs[name], *extra, *args))
        root.joinpath(f"{name}.stderr").write_text(stderr)

    # the straight run saves at step 2 with step 3's rollout pending; the resumed one continues from that
    # checkpoint in an output_dir of its own (as a run killed after the save would)
    status = ["logging.progress_bar=true", "logging.status_interval_s=0"]  # every step-status line, for the wait's
    # and the KL's reference reset after step 2: one step off, step 3's rollout was drawn before that reset
    reset = ["grpo.beta=0.04", "grpo.ref_sync_steps=2"]
    run("straight", *OFF, "max_steps=4", "save_steps=2", *status, *reset)
    saved = runs["straight"] / "checkpoints" / "step_000002"
    run("resumed", *OFF, "max_steps=4", "save_steps=2", f"resume_from={saved}", *reset)
    # two iterations and a KL term: the reference's log-probs come from the rollout's thread, the old ones from the
    # update (one step off) where on-policy the rollout computes both
    still = ["max_steps=3", STILL, "grpo.num_iterations=2", "grpo.beta=0.04"]
    run("still_off", *OFF, *still)
    run("still_on", *still)
    return runs


def test_unchanging_weights_sample_what_the_on_policy_loop_samples(runs):
    off, on = metrics(runs["still_off"]), metrics(runs["still_on"])
    assert [r["rollout_overlapped"] for r in off] == [False, True, True]  # the first step samples on-policy
    assert all("time/rollout_wait" in r for r in off) and not any("rollout_overlapped" in r for r in on)
    assert [r["step"] for r in off] == [r["step"] for r in on] == [1, 2, 3]
    for x, y in zip(off, on):
        assert _stable(x, ("rollout_overlapped",)) == _stable(y), x["step"]  # rewards, losses, gaps: all equal


def test_later_steps_train_on_tokens_one_update_old(runs):
    """The sampler-vs-trainer gap: ~0 at the first step (the same weights, fp32), large after (the trainer's
    weights are one update newer), which the sampler correction's weights then move off 1."""
    m = metrics(runs["straight"])
    gap = [r["mismatch/logp_abs_mean"] for r in m]
    assert gap[0] < 1e-4 and min(gap[1:]) > 100 * max(gap[0], 1e-7), gap
    assert abs(m[0]["correction/weight_mean"] - 1) < 1e-4
    assert any(abs(r["correction/weight_mean"] - 1) > 1e-3 for r in m[1:])


def test_the_reference_reset_after_a_step_is_the_next_steps_though_its_rollout_was_drawn_before(runs):
    """Step 3's rollout was drawn during step 2, before step 2's reference reset: its reference log-probs come from
    the update, after the reset, so the KL of step 3's policy (the weights the reset copied) is 0."""
    kl = {r["step"]: r["kl"] for r in metrics(runs["straight"])}
    assert kl[3] == pytest.approx(0.0, abs=1e-9)
    assert kl[2] > 1e-7 and kl[4] > 1e-7, kl


def test_resume_with_the_pending_rollout_is_exact(runs):
    ckpt = runs["straight"] / "checkpoints" / "step_000002"
    assert sorted(p.name for p in (ckpt / "ahead").iterdir()) == ["rank_0.pt", "rank_1.pt"]
    a = load_file(runs["straight"] / "final_adapter" / "adapter_model.safetensors")
    b = load_file(runs["resumed"] / "final_adapter" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bitwise
    ma, mb = metrics(runs["straight"]), metrics(runs["resumed"])
    assert [r["step"] for r in mb] == [3, 4] and mb[0]["rollout_overlapped"]  # step 3 took the saved rollout
    for x, y in zip(ma[2:], mb, strict=True):
        assert _stable(x) == _stable(y), x["step"]


def test_samples_jsonl_holds_the_samples_each_step_trained_on(runs):
    """logging.sample_records one step off: each step's lines are the global batch it trained on (the rollout drawn
    during the step before): their rewards' mean is the step's reward_mean; with weights that do not move they are
    the on-policy loop's, prompt by prompt (a line of the rollout drawn ahead would name the next step's prompts);
    the resumed run's lines of steps 3 and 4, the pending rollout's included, are the straight run's."""

    def lines(run):
        return [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]

    straight, m = lines(runs["straight"]), metrics(runs["straight"])
    assert [line["step"] for line in straight] == [s for s in (1, 2, 3, 4) for _ in range(len(straight) // 4)]
    for record in m:
        step = [line for line in straight if line["step"] == record["step"]]
        assert sum(line["reward"] for line in step) / len(step) == pytest.approx(record["reward_mean"], abs=1e-6)
    assert lines(runs["still_off"]) == lines(runs["still_on"])
    assert len({line["prompt"] for line in lines(runs["still_on"])}) > 1  # the steps' prompts differ
    assert lines(runs["resumed"]) == [line for line in straight if line["step"] > 2]


def test_the_wait_for_the_next_rollout_is_a_phase_of_the_step_status(runs):
    """Rank 0's status lines after the rewards name the gathers, then the wait for the rollout drawn beside this
    step, each with its seconds: a slow background rollout does not read as a slow reward."""
    lines = (runs["straight"].parent / "straight.stderr").read_text().splitlines()
    step = [re.sub(r"\b\d+(\.\d)? s\b", "T s", line) for line in lines if line.startswith("grpo [step 3/4] ")]
    after_rewards = step[next(i for i, line in enumerate(step) if " advantages, " in line) :]
    assert after_rewards == [
        "grpo [step 3/4] advantages, T s into the step (reward took T s)",
        "grpo [step 3/4] rollout wait, T s into the step (advantages took T s)",
        "grpo [step 3/4] update: 0/2 micro-batches, T s into the step (rollout wait took T s)",
        "grpo [step 3/4] update: 1/2 micro-batches, T s into the step",
        "grpo [step 3/4] update: 2/2 micro-batches, T s into the step",
        "grpo [step 3/4] record, T s into the step (update took T s)",
    ], step

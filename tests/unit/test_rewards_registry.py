"""Reward registry, plugins, the weighted combination into advantages (by hand), NaN handling."""

import math

import pytest
import torch

from glm_grpo_ds.advantages import combine_advantages, group_advantages
from glm_grpo_ds.config import RewardSpec
from glm_grpo_ds.rewards import build_reward, build_rewards

NAN = float("nan")


def test_unknown_reward_lists_close_matches():
    with pytest.raises(ValueError, match="unknown reward 'pixel_mes'.*did you mean pixel_mse"):
        build_reward("pixel_mes", {})
    with pytest.raises(ValueError, match="reward ssim: unknown args kernel; it takes kernel_size, sigma"):
        build_reward("ssim", {"kernel": 3})


def test_file_plugin_and_labels(tmp_path):
    plugin = tmp_path / "my_reward.py"
    plugin.write_text(
        "import torch\n"
        "def brightness(images, prompts, samples):\n    return images.mean(dim=(1, 2, 3))\n"
        "def make_const(value):\n    return lambda images, prompts, samples: torch.full((images.shape[0],), value)\n"
    )
    rewards = build_rewards(
        [
            RewardSpec(name=f"{plugin}:brightness", weight=2.0),
            RewardSpec(name=f"{plugin}:make_const", weight=0.5, args={"value": 3.0}),
            RewardSpec(name=f"{plugin}:make_const", weight=1.0, args={"value": 1.0}),
        ]
    )
    images = torch.stack([torch.full((3, 4, 4), 0.25), torch.full((3, 4, 4), 0.5)])
    per = rewards(images, ["a", "b"], [{}, {}])
    assert list(per) == [f"{plugin}:brightness", f"{plugin}:make_const", f"{plugin}:make_const#2"]
    torch.testing.assert_close(per[f"{plugin}:brightness"], torch.tensor([0.25, 0.5]))
    assert rewards.weights[f"{plugin}:make_const"] == 0.5


def test_a_plugins_args_reach_a_reward_a_factory_or_a_class(tmp_path):
    """``args`` given to a plugin function that takes (images, prompts, samples, **args) are passed on each call (it
    was called as a factory with only the args: a TypeError traceback at step 1 after the model had loaded); a
    factory taking only the args still builds the reward; a class is built (with its args or none: given none it
    was called as the reward, and every step was skipped); args that fit nothing are one line at --check."""
    from glm_grpo_ds.rewards.registry import RewardError, check_reward_args

    plugin = tmp_path / "forms.py"
    plugin.write_text(
        "import torch\n"
        "def scaled(images, prompts, samples, scale=1.0):\n    return scale * images.mean(dim=(1, 2, 3))\n"
        "def make(value):\n    return lambda images, prompts, samples: torch.full((images.shape[0],), value)\n"
        "def make_judge(path=None, device='cpu', batch=8, threshold=0.5):\n"
        "    return lambda images, prompts, samples: torch.full((images.shape[0],), threshold)\n"
        "class Sharp:\n"
        "    def __init__(self, gain=1.0):\n        self.gain = gain\n"
        "    def __call__(self, images, prompts, samples):\n        return self.gain * images.amax(dim=(1, 2, 3))\n"
    )
    images = torch.stack([torch.full((3, 4, 4), 0.25), torch.full((3, 4, 4), 0.5)])
    scored = {
        "scaled": build_reward(f"{plugin}:scaled", {"scale": 2.0}),
        "scaled_plain": build_reward(f"{plugin}:scaled", {}),
        "make": build_reward(f"{plugin}:make", {"value": 3.0}),
        # a factory whose first parameters have defaults also fits (images, prompts, samples, **args): a factory
        "judge": build_reward(f"{plugin}:make_judge", {"threshold": 0.7}),
        "sharp": build_reward(f"{plugin}:Sharp", {}),
        "sharp_gain": build_reward(f"{plugin}:Sharp", {"gain": 4.0}),
    }
    got = {name: fn(images, ["a", "b"], [{}, {}]).tolist() for name, fn in scored.items()}
    assert got == {"scaled": [0.5, 1.0], "scaled_plain": [0.25, 0.5], "make": [3.0, 3.0], "sharp": [0.25, 0.5],
                   "sharp_gain": [1.0, 2.0], "judge": pytest.approx([0.7, 0.7])}  # fmt: skip
    assert scored["scaled"].__name__ == "scaled"
    with pytest.raises(RewardError, match=r"args scal fit neither scaled\(images, prompts, samples, scale=1.0\)"):
        check_reward_args(f"{plugin}:scaled", {"scal": 2.0})
    with pytest.raises(RewardError, match=f"reward {plugin}:Sharp: unknown args gian; it takes gain"):
        check_reward_args(f"{plugin}:Sharp", {"gian": 2.0})


def test_a_plugin_file_that_fails_to_import_is_one_line_naming_it(tmp_path):
    """A ``file.py:fn`` plugin whose import raises (a missing package, a syntax error) was a traceback through
    --check's preflight; ``python:module:fn`` already said "cannot import"."""
    from glm_grpo_ds.rewards.registry import RewardError, check_reward_name

    missing = tmp_path / "missing.py"
    missing.write_text("import notapkg_xyz\ndef f(images, prompts, samples):\n    return images.mean()\n")
    with pytest.raises(RewardError, match=f"cannot import {missing} \\(ModuleNotFoundError: No module named"):
        check_reward_name(f"{missing}:f")
    broken = tmp_path / "broken.py"
    broken.write_text("def f(images, prompts, samples):\n    return (\n")
    with pytest.raises(RewardError, match=f"cannot import {broken}:2 \\(SyntaxError: "):
        check_reward_name(f"{broken}:f")


def test_python_module_plugin():
    # a callable of three arguments, as a reward is called (math:fabs, of one, is refused: it could never score)
    assert build_reward("python:builtins:max", {})(-2.0, 5.0, 1.0) == 5.0
    with pytest.raises(ValueError, match="cannot import"):
        build_reward("python:no_such_module_xyz:f", {})


def test_nan_rewards_leave_group_statistics():
    # defined [1, 3]: mean 2, centered [-1, 1], unbiased std sqrt(2); the NaN sample gets 0
    adv = group_advantages(torch.tensor([1.0, NAN, 3.0, NAN, NAN, NAN], dtype=torch.float64), 3, eps=0.0)
    s2 = math.sqrt(2.0)
    torch.testing.assert_close(adv, torch.tensor([-1 / s2, 0, 1 / s2, 0, 0, 0], dtype=torch.float64))


# Group 1: A = [1, 2, nan], B = [0, nan, 3]; weights A 1, B 2.
# Group 2: A all nan, B = [1, 1, 4].  Group 3: A = [5, nan, 1], B = [nan, nan, 2] (sample 2 undefined for both).
A = [1.0, 2.0, NAN, NAN, NAN, NAN, 5.0, NAN, 1.0]
B = [0.0, NAN, 3.0, 1.0, 1.0, 4.0, NAN, NAN, 2.0]
W = {"A": 1.0, "B": 2.0}


def _per():
    return {"A": torch.tensor(A, dtype=torch.float64), "B": torch.tensor(B, dtype=torch.float64)}


def test_sum_then_normalize_by_hand():
    # nan -> that reward's group mean: g1 totals [1 + 0, 2 + 2*1.5, 1.5 + 2*3] = [1, 5, 7.5]
    # g2: A contributes nothing, totals 2*[1, 1, 4]; g3: [5 + 2*2, nan, 1 + 2*2] = [9, nan, 5]
    adv, total = combine_advantages(_per(), W, 3, "sum_then_normalize", "none")
    torch.testing.assert_close(total[:6], torch.tensor([1, 5, 7.5, 2, 2, 8], dtype=torch.float64))
    assert math.isnan(total[7]) and total[6] == 9 and total[8] == 5
    torch.testing.assert_close(adv, torch.tensor([-3.5, 0.5, 3, -2, -2, 4, 2, 0, -2], dtype=torch.float64))
    # group scale, eps 0: g1's spread from each reward's own defined samples, not the imputed totals' (whose two
    # imputed values shrink it to (3.5^2 + 0.5^2 + 3^2) / 2 = 10.75): var A = 0.5 over (1, 2), var B = 4.5 over
    # (0, 3), no covariance (one sample has both) -> 1^2 x 0.5 + 2^2 x 4.5 = 18.5
    adv_g, _ = combine_advantages(_per(), W, 3, "sum_then_normalize", "group", eps=0.0)
    s = math.sqrt(18.5)
    torch.testing.assert_close(adv_g[:3], torch.tensor([-3.5 / s, 0.5 / s, 3 / s], dtype=torch.float64))
    assert adv_g[7] == 0  # undefined for every reward


@pytest.mark.parametrize("scale", ["group", "batch", "rloo", "none"])
def test_a_reward_nobody_learns_from_leaves_a_partly_failed_reward_as_it_was(scale):
    """A = [1, 2, -, -] beside a constant B: the imputed A values counted as samples shrank the group's spread
    (+-1.22 instead of +-0.71) and stood in RLOO's baseline (-0.67 instead of -1)."""
    a, b = torch.tensor([1.0, 2.0, NAN, NAN], dtype=torch.float64), torch.zeros(4, dtype=torch.float64)
    adv, _ = combine_advantages({"a": a, "b": b}, {"a": 1.0, "b": 1.0}, 4, "sum_then_normalize", scale)
    torch.testing.assert_close(adv, group_advantages(a, 4, scale))


def test_the_pairwise_spread_is_the_totals_own_when_nothing_is_missing_and_by_hand_when_something_is():
    from glm_grpo_ds.advantages import _pairwise_total_var

    g = torch.Generator().manual_seed(0)
    per = {"a": torch.rand(12, generator=g, dtype=torch.float64), "b": torch.rand(12, generator=g, dtype=torch.float64)}
    weights = {"a": 1.0, "b": -2.5}
    total = per["a"] - 2.5 * per["b"]
    torch.testing.assert_close(_pairwise_total_var(per, weights, 3).squeeze(1), total.view(3, 4).var(1))
    torch.testing.assert_close(_pairwise_total_var(per, weights, 1).squeeze(), total.var())
    # A = [0, 1, 2], B = [-, 1, 3]: var A 1, var B 2 over (1, 3), cov 1 over samples 2, 3 -> 1 + 2 + 2 x 1 = 5;
    # centered totals [-1, -1, 2] (B's imputed mean 2 adds 0); the imputed totals' own spread would say 3
    a, b = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64), torch.tensor([NAN, 1.0, 3.0], dtype=torch.float64)
    adv, _ = combine_advantages({"a": a, "b": b}, {"a": 1.0, "b": 1.0}, 3, "sum_then_normalize", "group", eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([-1.0, -1.0, 2.0], dtype=torch.float64) / math.sqrt(5))


def test_normalize_then_sum_by_hand():
    # g1, eps 0: A defined [1, 2] -> [-1/sqrt2, 1/sqrt2, 0]; B defined [0, 3] -> [-1/sqrt2, 0, 1/sqrt2]
    # total A + 2B = [-3/sqrt2, 1/sqrt2, 2/sqrt2]
    adv, _ = combine_advantages(_per(), W, 3, "normalize_then_sum", "group", eps=0.0)
    r = 1 / math.sqrt(2.0)
    torch.testing.assert_close(adv[:3], torch.tensor([-3 * r, r, 2 * r], dtype=torch.float64))
    # g2: only B, [1, 1, 4]: mean 2, std sqrt(3) -> 2 * [-1, -1, 2] / sqrt(3)
    torch.testing.assert_close(adv[3:6], 2 * torch.tensor([-1, -1, 2], dtype=torch.float64) / math.sqrt(3.0))
    # g3: A defined [5, 1] -> [1/sqrt2 * sqrt2 ...]: centered [2, -2], std sqrt(8) -> [1/sqrt2, 0, -1/sqrt2];
    # B one value -> 0
    torch.testing.assert_close(adv[6:], torch.tensor([r, 0, -r], dtype=torch.float64))


def test_weights_scale_normalize_then_sum_but_not_group_ranking():
    """Weights {easy: 1, hard: 2}: normalize_then_sum is exactly A_easy + 2 A_hard (each reward's own group z-score),
    so the hard reward's winner ranks first; summed raw first (sum_then_normalize), the easy reward's scale (0-20
    against 0-1) still ranks the group as it alone would, weight 2 or not."""
    f64 = torch.float64
    per = {"easy": torch.tensor([0.0, 10.0, 20.0], dtype=f64), "hard": torch.tensor([1.0, 0.0, 0.0], dtype=f64)}
    weights = {"easy": 1.0, "hard": 2.0}
    adv_sum, total = combine_advantages(per, weights, 3, "sum_then_normalize", "group", eps=0.0)
    adv_norm, _ = combine_advantages(per, weights, 3, "normalize_then_sum", "group", eps=0.0)
    # by hand (unbiased group std): easy centered [-10, 0, 10], std 10 -> [-1, 0, 1]; hard mean 1/3, centered
    # [2, -1, -1] / 3, std 1/sqrt3 -> [2, -1, -1] / sqrt3
    a_easy = torch.tensor([-1.0, 0.0, 1.0], dtype=f64)
    a_hard = torch.tensor([2.0, -1.0, -1.0], dtype=f64) / math.sqrt(3.0)
    torch.testing.assert_close(adv_norm, a_easy + 2 * a_hard)
    assert adv_norm.argmax() == 0  # -1 + 4/sqrt3 = 1.31 against 1 - 2/sqrt3 = -0.15 for the easy reward's winner
    # the raw weighted sum [0 + 2, 10, 20]: centered [-26, -2, 28] / 3, ranked as the easy reward alone ranks the group
    torch.testing.assert_close(total, torch.tensor([2.0, 10.0, 20.0], dtype=f64))
    torch.testing.assert_close(adv_sum, torch.tensor([-26.0, -2.0, 28.0], dtype=f64) / 3 / total.std())
    assert adv_sum.argsort().tolist() == per["easy"].argsort().tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="unknown reward combination"):
        combine_advantages(per, weights, 3, "mean")


def test_reward_that_raises_scores_nan_counts_and_warns_once(capsys):
    from glm_grpo_ds.rewards import RewardSet
    from glm_grpo_ds.runtime import log

    log.setup("info", 0)
    calls = []

    def flaky(images, prompts, samples):
        calls.append(1)
        if len(calls) != 2:
            raise RuntimeError(f"down {len(calls)}")
        return [1.0, float("inf"), float("nan")]

    rs = RewardSet([("flaky", 1.0, flaky)])
    images = torch.zeros(3, 3, 8, 8)
    for expect_failed in (3, 0, 3):
        out = rs(images, ["p"] * 3, [{}] * 3)
        assert rs.failed["flaky"] == expect_failed
    assert torch.isnan(out["flaky"]).all()
    err = capsys.readouterr().err
    assert err.count("reward flaky raised RuntimeError: down 1;") == 1 and "down 3" not in err
    assert err.count("returned None/NaN/inf for 2 of 3 samples") == 1


def test_a_reward_returning_none_for_a_sample_leaves_it_undefined():
    """TRL's convention for "not applicable to this sample" (and the remote protocol's null): that sample is undefined,
    the others keep their values; it crashed the run on that rank (a float tensor cannot hold None)."""
    from glm_grpo_ds.rewards import RewardSet

    out = RewardSet([("p", 1.0, lambda images, prompts, samples: [1.0, None, 0.25])])(
        torch.zeros(3, 3, 4, 4), ["a", "b", "c"], [{}] * 3
    )
    assert out["p"][0] == 1.0 and math.isnan(out["p"][1]) and out["p"][2] == 0.25


def test_a_plugin_reward_runs_without_autograd_and_returns_plain_values():
    """A python: plugin with a model of its own (parameters that require grad, as from_pretrained gives them) built a
    graph: its values kept the model's activations alive through the step's gathers."""
    from glm_grpo_ds.rewards import RewardSet

    head = torch.nn.Linear(3, 1)
    seen = []

    def learned(images, prompts, samples):
        seen.append(torch.is_grad_enabled())
        return head(images.mean(dim=(2, 3))).squeeze(1)

    out = RewardSet([("learned", 1.0, learned)])(torch.rand(2, 3, 4, 4), ["a", "b"], [{}] * 2)
    assert seen == [False] and out["learned"].grad_fn is None and not out["learned"].requires_grad


def test_check_reward_specs_fails_before_building():
    from glm_grpo_ds.config import RewardSpec
    from glm_grpo_ds.rewards import RewardError, check_reward_specs

    check_reward_specs([RewardSpec(name="pixel_mse")])
    with pytest.raises(RewardError, match=r"rewards\[1\].name: unknown reward 'ssmi'; did you mean ssim\?"):
        check_reward_specs([RewardSpec(name="pixel_mse"), RewardSpec(name="ssmi")])


# ----------------------------------------------------------------------------- rewards that cannot be computed
def _rows(tmp_path, lines):
    from glm_grpo_ds.data import load_prompts

    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return load_prompts(path), path


@pytest.mark.parametrize(
    "name,field", [("pixel_mse", "target_image"), ("ssim", "target_image"), ("lpips", "target_image"), ("ocr", "text")]
)
def test_reward_needing_a_field_no_row_has_is_an_input_error(name, field, tmp_path):
    from glm_grpo_ds.rewards import RewardError, check_reward_inputs

    rows, path = _rows(tmp_path, ['{"prompt": "a cat"}', '{"prompt": "a dog"}'])
    specs = [RewardSpec(name="python:glm_grpo_ds.testing.tiny_data:mean_brightness"), RewardSpec(name=name)]
    with pytest.raises(RewardError) as err:
        check_reward_inputs(specs, rows, "data.train_file", path)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"rewards[1] {name} needs {field} but no row of data.train_file {path} has one")


def test_reward_inputs_present_in_some_rows_pass(tmp_path):
    from PIL import Image

    from glm_grpo_ds.rewards import check_reward_inputs

    Image.new("RGB", (8, 8)).save(tmp_path / "t.png")
    rows, path = _rows(
        tmp_path,
        ['{"prompt": "a cat"}', '{"prompt": "a dog", "target_image": "t.png"}', '{"prompt": "a sign \'OPEN\'"}'],
    )
    check_reward_inputs([RewardSpec(name="pixel_mse"), RewardSpec(name="ocr")], rows, "data.train_file", path)
    # the ocr text may also come from the row's text field
    rows, path = _rows(tmp_path, ['{"prompt": "a sign", "text": "OPEN"}'])
    check_reward_inputs([RewardSpec(name="ocr")], rows, "eval.file", path)


def test_score_without_what_the_reward_needs_is_a_one_line_error(tmp_path, capsys):
    from PIL import Image

    from glm_grpo_ds.commands import score

    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    image = str(tmp_path / "a.png")
    assert score.main(["--reward", "pixel_mse", "--prompt", "a cat", "--image", image]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == "glm-grpo score: reward pixel_mse needs target_image: pass --target IMAGE\n"
    assert score.main(["--reward", "ocr", "--prompt", "a sign", "--image", image]) == 2
    assert capsys.readouterr().err.startswith("glm-grpo score: reward ocr needs text: pass --text TEXT")
    assert score.main(["--reward", "pixel_mse", "--prompt", "a cat", "--image", image, "--target", image]) == 0
    assert float(capsys.readouterr().out) == 0.0


def test_score_prints_nan_for_a_reward_that_says_none_or_inf(tmp_path, capsys):
    """TRL's None (not applicable) is undefined in training; `glm-grpo score` crashed on it with a TypeError."""
    from PIL import Image

    from glm_grpo_ds.commands import score

    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    (tmp_path / "plug.py").write_text(
        "def none(images, prompts, samples):\n    return [None] * len(prompts)\n\n"
        "def inf(images, prompts, samples):\n    return [float('inf')] * len(prompts)\n"
    )
    for fn in ("none", "inf"):
        argv = ["--reward", f"{tmp_path / 'plug.py'}:{fn}", "--prompt", "a cat", "--image", str(tmp_path / "a.png")]
        assert score.main(argv) == 0
        assert capsys.readouterr().out == "nan\n"


def test_a_null_region_in_a_rows_text_list_is_no_text_to_render():
    """A row's ``"text": ["HELLO", null]`` expected the OCR to read "HELLO None"."""
    from glm_grpo_ds.rewards.base import text_to_render

    assert text_to_render("a sign", {"text": ["HELLO", None, " ", "WORLD"]}) == "HELLO WORLD"


def test_a_reward_that_returns_no_numbers_is_a_reward_error():
    """A function, a string or ragged lists from a reward were a TypeError/ValueError traceback at step 1 (not an
    input error); now the RewardError train prints in one line, exit 2, as a wrong count is."""
    from glm_grpo_ds.rewards.base import reward_values
    from glm_grpo_ds.rewards.registry import RewardError

    for raw in (lambda x: x, "high", [[1.0], [1.0, 2.0]]):
        with pytest.raises(RewardError, match=r"reward r returned \w+, not numbers .*: a reward returns one value"):
            reward_values("r", raw, 2)
    with pytest.raises(RewardError, match="reward r returned 1 values for 2 images"):
        reward_values("r", torch.tensor(0.5), 2)


def test_a_training_runs_rewards_all_weighted_0_are_refused_and_a_configs_load_is_not():
    """All weights 0: every advantage 0, loss and gradient 0 each step, and the run ended exit 0 having learnt from
    no reward. Refused where a training run checks its rewards (startup, train --check), not where a config loads:
    evaluate measures such rewards. One weight-0 reward beside another is logged only; a negative weight a penalty."""
    from glm_grpo_ds.config import load_config
    from glm_grpo_ds.rewards import RewardError, check_reward_specs

    base = ["model.path=/m", "data.train_file=/d.jsonl"]
    cfg = load_config(None, [*base, "rewards=[{name: pixel_mse, weight: 0}, {name: ssim, weight: 0}]"])
    with pytest.raises(RewardError, match=r"^rewards: every weight is 0, so every advantage is 0 and the run learns"):
        check_reward_specs(cfg.rewards)
    check_reward_specs(load_config(None, [*base, "rewards=[{name: pixel_mse, weight: -0.5}]"]).rewards)
    check_reward_specs(load_config(None, [*base, "rewards=[{name: pixel_mse}, {name: ssim, weight: 0}]"]).rewards)


@pytest.mark.parametrize("args", [{"kernel_size": 4}, {"kernel_size": 0}, {"kernel_size": -3}, {"sigma": 0}])
def test_ssim_values_torchmetrics_refuses_are_refused_before_the_job_queues(args, tmp_path):
    """kernel_size=4 passed `train --check`; at the first score torchmetrics raised, every sample's reward was NaN and
    the run skipped its updates (exit 0 with final weights of nothing learned, or a stop 3 skips later)."""
    from glm_grpo_ds.rewards.registry import RewardError, check_reward_args
    from glm_grpo_ds.rewards.ssim import SSIMReward

    with pytest.raises(RewardError, match=r"^reward ssim: (kernel_size|sigma) .* must be"):
        check_reward_args("ssim", args)
    from PIL import Image

    images = torch.rand(2, 3, 32, 32)
    Image.new("RGB", (32, 32), (200, 40, 40)).save(tmp_path / "t.png")
    samples = [{"target_image": str(tmp_path / "t.png")} for _ in range(2)]
    with pytest.raises(ValueError):  # what the check spares the run: torchmetrics refuses the same values
        SSIMReward(**args)(images, ["a", "b"], samples)
    check_reward_args("ssim", {"kernel_size": 3, "sigma": 0.5})  # what it takes: scored
    assert SSIMReward(kernel_size=3, sigma=0.5)(images, ["a", "b"], samples).isfinite().all()


@pytest.mark.parametrize("confidence", [-0.1, 1.5, "high"])
def test_an_ocr_confidence_outside_0_1_is_refused(confidence):
    from glm_grpo_ds.rewards.registry import RewardError, check_reward_args

    with pytest.raises(RewardError, match=r"^reward ocr: min_confidence .* must be a number in \[0, 1\]"):
        check_reward_args("ocr", {"min_confidence": confidence})

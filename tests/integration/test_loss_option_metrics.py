"""A real training step with the loss options on (one process, the tiny model): the startup summary names the
grpo options that are not the defaults, and metrics.jsonl holds what they did (the sampler correction's weights,
the top-entropy threshold and kept fraction, vespo's mean sequence weight, the diversity shaping's distances and
multipliers; their math by hand:
tests/unit/test_grpo_options.py, tests/unit/test_grpo_math.py)."""

import pytest
from in_process import glm_grpo  # noqa: E402  (tests/in_process.py)
from launching import CONFIG, FAST, common  # noqa: E402  (tests/integration/launching.py)
from run_files import metrics  # noqa: E402  (tests/run_files.py)

pytestmark = [pytest.mark.slow]  # a training step


def test_a_step_with_the_options_on_logs_them_and_what_they_did(tiny_model_dir, data64, tmp_path, capfd):
    out = tmp_path / "run"
    options = ["grpo.sampler_correction=token_truncate", "grpo.top_entropy_quantile=0.5", "grpo.aggregation=seq_mean"]
    options += ["grpo.objective=vespo", "grpo.num_iterations=2"]  # the second update's ratios leave 1
    options += ["grpo.diversity_features=pixels"]  # GARDO's shaping, its distances and multipliers logged
    argv = ["train", "--config", str(CONFIG), "--deepspeed", "ds_configs/zero2.json"]
    argv += common(tiny_model_dir, data64, out, "max_steps=1", *FAST, *options)
    code, stdout, stderr = glm_grpo(argv, capfd)
    assert code == 0, stderr[-3000:]
    line = next(line for line in stdout.splitlines() if "grpo options (not the defaults):" in line)
    for option in ('aggregation="seq_mean"', 'sampler_correction="token_truncate"', 'objective="vespo"'):
        assert option in line, line
    (row,) = metrics(out)
    # the same policy sampled and scores: the sampler's and the trainer's numbers agree to float rounding
    assert 0.9 < row["correction/weight_min"] <= row["correction/weight_mean"] <= row["correction/weight_max"] < 1.1
    assert row["correction/outside_fraction"] == 0.0  # within [0, 3]: nothing clipped
    assert row["top_entropy/threshold"] > 0 and 0.4 <= row["top_entropy/kept_fraction"] <= 0.6
    # phi(w), over both updates' sequences: 1 at the first (w = 1), off 1 at the second, where w has left 1 (its
    # peak is e^lam (k / lam)^k e^-k, 1.21 at w = 2/3)
    assert 0 < row["sequence_weight_mean"] < 1.21 and abs(row["sequence_weight_mean"] - 1) > 1e-6, row
    # the multipliers of the positive advantages average ~1 (d / the group's mean d, over a part of the group)
    assert row["diversity/shaped"] == 1 and 0 < row["diversity/nearest_distance"] <= 2, row
    assert 0 < row["diversity/multiplier_mean"] < 4 and row["diversity/multiplier_max"] > 0, row

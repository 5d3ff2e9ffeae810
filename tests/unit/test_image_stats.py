"""The image statistics and the within-group diversity (monitoring/image_stats.py) on images whose values are
known by hand, and the alarm rules on them (monitoring/alarms.py)."""

import math

import pytest
import torch

from glm_grpo_ds.config import ConfigError, load_config
from glm_grpo_ds.config.run_sections import DEFAULT_ALARMS
from glm_grpo_ds.monitoring import image_stats as st
from glm_grpo_ds.monitoring.alarms import Monitor, RuleError, parse_rule, parse_rules


def _half_black_half_white(n=1, h=32, w=64):
    images = torch.zeros(n, 3, h, w)
    images[..., w // 2 :] = 1.0
    return images


def test_statistics_of_a_half_black_half_white_image_by_hand():
    s = st.image_statistics(_half_black_half_white())
    assert s["brightness"].item() == pytest.approx(0.5)
    assert s["dark_fraction"].item() == s["bright_fraction"].item() == 0.5
    assert s["saturation"].item() == 0.0  # black and white are grey
    assert s["colour_entropy"].item() == pytest.approx(1.0)  # two colours, half each: one bit
    # the step is one Sobel-gradient 1 in the two columns beside it, 0 elsewhere (replicate padding): 2 of 64
    assert s["edge_density"].item() == pytest.approx(2 / 64)
    assert 0 < s["high_frequency"].item() < 0.5  # a step's spectrum falls as 1 / f: mostly low frequencies


def test_statistics_of_flat_saturated_and_noisy_images():
    red = torch.zeros(1, 3, 16, 16)
    red[:, 0] = 1.0
    s = st.image_statistics(red)
    assert s["saturation"].item() == 1.0 and s["colour_entropy"].item() == 0.0
    assert s["brightness"].item() == pytest.approx(0.299)
    assert s["edge_density"].item() == s["high_frequency"].item() == 0.0
    noise = torch.rand(2, 3, 128, 128, generator=torch.Generator().manual_seed(0))
    s = st.image_statistics(noise)
    # white noise: energy spread evenly over the [-0.5, 0.5]^2 frequencies, 1 - pi 0.25^2 of them above 0.25
    assert s["high_frequency"] == pytest.approx(torch.full((2,), 1 - math.pi * 0.25**2), abs=0.01)
    # 512 colours, uniform: 9 bits less the plug-in estimate's bias, (512 - 1) / (2 x 128^2 ln 2) = 0.0225
    assert s["colour_entropy"] == pytest.approx(torch.full((2,), 9.0 - 0.0225), abs=0.005)


def test_identical_samples_have_diversity_0_and_are_all_near_duplicates():
    torch.manual_seed(0)
    one = torch.rand(1, 3, 64, 64)
    copies = one.repeat(4, 1, 1, 1)
    different = torch.rand(4, 3, 64, 64)
    d = st.group_diversity(torch.cat([copies, different]), group_size=4)
    assert d["diversity"][0].item() == 0.0 and d["near_duplicates"][0].item() == 1.0
    # two independent uniform images: E (a - b)^2 = 1/6, so the RMS distance is ~ 1 / sqrt(6)
    assert d["diversity"][1].item() == pytest.approx(1 / math.sqrt(6), abs=0.01)
    assert d["near_duplicates"][1].item() == 0.0


def test_diversity_compares_downsampled_images_and_a_group_of_one_has_none():
    big = torch.zeros(2, 3, 512, 512)
    big[1, :, ::2] = 1.0  # stripes one pixel wide: grey from afar
    big[0] = 0.5
    d = st.group_diversity(big, group_size=2)
    assert d["diversity"].item() < 1e-6  # the box filter averages the stripes to 0.5
    assert math.isnan(st.group_diversity(big, group_size=1)["diversity"][0].item())


def test_lpips_diversity_is_the_mean_lpips_distance_over_each_groups_pairs():
    """With the lpips reward's network (offline: the heads from the wheel, a random backbone): copies are 0 apart,
    and a group's value is the mean of the network's distance over its 6 pairs, each computed alone; without a
    distance function the statistic is left out, not faked."""
    from glm_grpo_ds.rewards.lpips_reward import LPIPSReward
    from glm_grpo_ds.rewards.registry import RewardSet

    torch.manual_seed(0)
    reward = LPIPSReward(pretrained_backbone=False)
    distance = RewardSet([("lpips", 1.0, reward)]).pair_distance()
    assert distance == reward.distance and RewardSet([("mse", 1.0, lambda *a: 0)]).pair_distance() is None
    copies = torch.rand(1, 3, 64, 64).repeat(4, 1, 1, 1)
    different = torch.rand(4, 3, 64, 64)
    d = st.group_diversity(torch.cat([copies, different]), 4, ["lpips_diversity", "diversity"], distance)
    assert d["lpips_diversity"][0].item() == pytest.approx(0.0, abs=1e-6)
    by_hand = [
        reward.distance(different[i : i + 1], different[j : j + 1]).item() for i in range(4) for j in range(i + 1, 4)
    ]
    assert d["lpips_diversity"][1].item() == pytest.approx(sum(by_hand) / 6, rel=1e-5) and min(by_hand) > 0
    assert set(st.group_diversity(different, 4, ["lpips_diversity", "diversity"])) == {"diversity"}
    assert st.computable(["lpips_diversity", "brightness"]) == ["brightness"]


def test_sample_table_and_summary_repeat_group_values_and_skip_nan():
    images = torch.cat([_half_black_half_white(2), torch.zeros(2, 3, 32, 64)])
    names = ["brightness", "diversity"]
    table = st.sample_table(images, 2, names)
    assert table.shape == (4, 2) and table[:, 1].tolist() == [0.0, 0.0, 0.0, 0.0]
    out = st.summarize(names, table)
    assert out["images/brightness"] == pytest.approx(0.25) and out["images/brightness_spread"] == pytest.approx(0.25)
    assert st.summarize(["diversity"], torch.full((3, 1), float("nan"))) == {
        "images/diversity": None,
        "images/diversity_spread": None,
    }


def test_alarm_rules_parse_and_fire_against_the_start():
    start = {"step": 0, "images/dark_fraction": 0.1, "images/dark_fraction_spread": 0.05, "images/diversity": 0.4}
    rules = parse_rules(
        ["dark_fraction > start + 0.25", "diversity < 0.5 x start", "dark_fraction > start + 3 spread"]
        + ["near_duplicates > 0.5"]
    )
    monitor = Monitor(rules, start=start)
    fields, lines = monitor.check({"step": 10, "images/dark_fraction": 0.3, "images/diversity": 0.3})
    assert fields == {"alarm/dark_fraction": 1, "alarm/diversity": 0} and len(lines) == 1  # 0.3 > 0.1 + 3 x 0.05
    assert lines[0].startswith("glm-grpo: alarm at step 10: dark_fraction is 0.3, was 0.1 (spread 0.05) at step 0")
    fields, lines = monitor.check({"step": 20, "images/dark_fraction": 0.4, "images/diversity": 0.1})
    assert fields == {"alarm/dark_fraction": 1, "alarm/diversity": 1}
    assert [line.split(":")[1] for line in lines] == [" alarm at step 20", " alarm at step 20"]  # each rule once
    fields, lines = monitor.check({"step": 30, "images/dark_fraction": 0.1, "images/diversity": 0.4})
    assert fields == {"alarm/dark_fraction": 0, "alarm/diversity": 0} and lines == [] and not monitor.holding


def test_the_first_checked_record_is_the_start_and_missing_values_never_fire():
    monitor = Monitor(parse_rules(["brightness < 0.5 x start"]), prefix="eval/images/")
    assert monitor.check({"step": 0, "eval/images/brightness": 0.6}) == ({"alarm/brightness": 0}, [])
    assert monitor.check({"step": 5}) == ({}, [])
    assert monitor.check({"step": 6, "eval/images/brightness": None}) == ({}, [])
    assert monitor.check({"step": 7, "eval/images/brightness": 0.2})[0] == {"alarm/brightness": 1}


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("darkness > 0.5", "unknown statistic 'darkness'"),
        ("dark_fraction >> 0.5", "cannot read the bound"),
        ("dark_fraction 0.5", "is not an alarm rule"),
        ("dark_fraction > 2 x begin", "cannot read the bound"),
    ],
)
def test_a_malformed_rule_or_unknown_statistic_is_one_line_naming_it(text, fragment):
    with pytest.raises(RuleError) as err:
        parse_rule(text, "monitor.alarms[0]")
    assert fragment in str(err.value) and str(err.value).startswith("monitor.alarms[0]: ")
    assert "\n" not in str(err.value)


def test_the_config_refuses_bad_monitor_settings_with_one_line_each(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("model: {path: m}\nrewards: [{name: pixel_mse}]\ndata: {train_file: p.txt}\n")
    overrides = ["monitor.statistics=[brightness,sharpness]", "monitor.alarms=[diversity < 0.5 x start, x]"]
    with pytest.raises(ConfigError) as err:
        load_config(str(config), overrides)
    lines = [line for line in str(err.value).splitlines() if line.startswith("monitor.")]
    assert "monitor.statistics: unknown statistic 'sharpness'" in lines[0]
    assert any(line.startswith("monitor.alarms[1]: 'x' is not an alarm rule") for line in lines)
    with pytest.raises(ConfigError, match=r"monitor.alarms\[0\]: 'diversity < 0.5 x start' watches diversity"):
        load_config(str(config), ["monitor.statistics=[brightness]", "monitor.alarms=[diversity < 0.5 x start]"])
    with pytest.raises(ConfigError, match=r"monitor.alarms\[0\]: .* watches lpips_diversity, which needs an lpips"):
        load_config(str(config), ["monitor.alarms=[lpips_diversity < 0.5 x start]"])
    cfg = load_config(str(config), [])
    assert cfg.monitor.statistics == list(st.STATISTICS) and cfg.monitor.alarms == list(DEFAULT_ALARMS)
    assert parse_rules(cfg.monitor.alarms)  # the defaults parse

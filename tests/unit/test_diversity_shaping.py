"""GARDO's diversity-aware advantage shaping (grpo.diversity_features): the nearest-neighbour distances and the
multipliers by hand (glm_grpo_ds/advantages.py), the image features (glm_grpo_ds/rewards/image_features.py: pixels,
and a tiny random DINOv2 built offline against its own forward), the refusals, and the step's advantages with the
shaping (glm_grpo_ds/experience/step_advantages.py)."""

import math
from types import SimpleNamespace

import pytest
import torch

from glm_grpo_ds.advantages import combine_advantages, diversity_multipliers, nearest_distances
from glm_grpo_ds.experience.step_advantages import step_advantages
from glm_grpo_ds.rewards import RewardError, build_rewards, check_reward_specs
from glm_grpo_ds.rewards.image_features import PIXEL_SIDE, ImageFeatures


def test_nearest_distances_and_multipliers_by_hand():
    # a group of 4: (1, 0) and (1, 0.1) are near-copies (cos = 1 / sqrt(1.01)), (0, 1)'s nearest is (1, 1) (cos =
    # 1 / sqrt 2), and (1, 1)'s is (1, 0.1) (cos = 1.1 / sqrt(2.02))
    near, diagonal, middle = 1 - 1 / math.sqrt(1.01), 1 - 1 / math.sqrt(2), 1 - 1.1 / math.sqrt(2.02)
    features = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 0.1]], dtype=torch.float64)
    d = nearest_distances(features, 4)
    torch.testing.assert_close(d, torch.tensor([near, diagonal, middle, near], dtype=torch.float64))
    # the positive advantages scaled by d / mean(d) (the group's mean, the negative sample's distance included); the
    # negative one and the zero one keep 1
    mean = (2 * near + diagonal + middle) / 4
    m = diversity_multipliers(d, torch.tensor([1.0, -1.0, 0.5, 0.0], dtype=torch.float64), 4)
    torch.testing.assert_close(m, torch.tensor([near / mean, 1.0, middle / mean, 1.0], dtype=torch.float64))


def test_groups_are_shaped_apart_and_a_group_of_copies_keeps_its_advantages():
    copies = torch.ones(3, 5)
    other = torch.tensor([[1.0, 0, 0, 0, 0], [0, 1.0, 0, 0, 0], [0, 0, 1.0, 0, 0]])
    d = nearest_distances(torch.cat([copies, other]), 3)
    assert d[:3].abs().max() < 1e-6 and torch.allclose(d[3:], torch.ones(3))  # copies: rounding only
    m = diversity_multipliers(d, torch.tensor([1.0, -1, 1, 1, 1, -1]), 3)
    assert torch.equal(m, torch.ones(6))  # copies: mean distance ~0; the other group: every distance equal
    noisy = torch.tensor([1e-16, 3e-16, 2e-16])  # copies' rounding in float64: no multiplier of 0.5 or 1.5
    assert torch.equal(diversity_multipliers(noisy, torch.ones(3), 3), torch.ones(3))


def test_flat_images_are_copies_of_each_other_not_the_most_diverse():
    """A blank image's pixel features are the zero vector: two blank images are copies (distance 0), a blank one is
    at distance 1 from a textured one, so a group collapsing to blank images is not boosted as diverse."""
    g = torch.Generator().manual_seed(3)
    textured = torch.rand(2, 3, 64, 64, generator=g)
    images = torch.cat([textured, textured[:1] * 0.99, torch.zeros(1, 3, 64, 64), torch.full((1, 3, 64, 64), 0.5)])
    d = nearest_distances(ImageFeatures("pixels")(images), 5)
    assert d[3] == 0 and d[4] == 0 and d[2] < 1e-4 and d[0] < 1e-4 and d[1] > 0.5
    m = diversity_multipliers(d, torch.ones(5), 5)
    assert m[3] == 0 and m[4] == 0 and m[1] > 4  # the blank ones teach nothing more; the distinct one most


def test_pixel_features_compare_what_the_images_look_like():
    g = torch.Generator().manual_seed(0)
    images = torch.rand(3, 3, 64, 64, generator=g)
    images[1] = images[0] * 0.5 + 0.25  # the same picture, contrast halved: correlation 1
    f = ImageFeatures("pixels")(images)
    assert f.shape == (3, 3 * PIXEL_SIDE**2) and torch.allclose(f.mean(dim=1), torch.zeros(3), atol=1e-6)
    d = nearest_distances(f, 3)
    assert d[0] < 1e-6 and d[1] < 1e-6 and d[2] > 0.5


@pytest.fixture(scope="module")
def tiny_dino(tmp_path_factory):
    from transformers import BitImageProcessor, Dinov2Config, Dinov2Model

    out = tmp_path_factory.mktemp("dino")
    config = Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    config.image_size, config.patch_size = 28, 14
    torch.manual_seed(0)
    Dinov2Model(config).save_pretrained(out)
    BitImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}).save_pretrained(out)
    return out


def test_a_backbones_features_are_its_pooled_output(tiny_dino):
    """The model's own forward on its processor's pixels (DINOv2's pooler output: the normed CLS token)."""
    from transformers import AutoImageProcessor, Dinov2Model

    images = torch.rand(4, 3, 40, 48, generator=torch.Generator().manual_seed(1))
    got = ImageFeatures(str(tiny_dino))(images)
    model, processor = Dinov2Model.from_pretrained(tiny_dino).eval(), AutoImageProcessor.from_pretrained(tiny_dino)
    with torch.no_grad():
        want = model(**processor(images=list(images), return_tensors="pt", do_rescale=False)).pooler_output
    torch.testing.assert_close(got, want)
    assert got.shape == (4, 32) and len({tuple(row.tolist()) for row in got}) == 4


def test_a_missing_backbone_is_refused_in_one_line_naming_the_key(tmp_path):
    check_reward_specs([], "pixels")
    with pytest.raises(
        RewardError, match=r"^grpo\.diversity_features .*nowhere does not exist; get it with `hf.*\(or pixels"
    ):
        check_reward_specs([], str(tmp_path / "nowhere"))
    with pytest.raises(RewardError, match=r"^grpo\.diversity_features .* is not a transformers checkpoint"):
        check_reward_specs([], str(tmp_path))


def test_the_steps_advantages_are_the_combined_ones_shaped():
    """step_advantages at world size 1: the combined, gated advantages times the multipliers of the images'
    features; the record's fields; the features' seconds added to the reward phase's."""
    from glm_grpo_ds.config import GRPOConfig

    spec = SimpleNamespace(name="pixel_mse", weight=1.0, args={}, label=None)
    reward_fn = build_rewards([spec], "pixels")
    g = torch.Generator().manual_seed(2)
    images = torch.rand(8, 3, 32, 32, generator=g)
    rewards = torch.rand(8, generator=g)
    exp = SimpleNamespace(per_reward={"pixel_mse": rewards}, images=images, timings={"reward": 1.0})
    got = step_advantages(exp, reward_fn, GRPOConfig(group_size=4, diversity_features="pixels"))
    plain, _ = combine_advantages({"pixel_mse": rewards}, {"pixel_mse": 1.0}, 4, "sum_then_normalize", "group")
    m = diversity_multipliers(nearest_distances(ImageFeatures("pixels")(images), 4), plain, 4)
    torch.testing.assert_close(got.advantages, plain * m)
    assert not torch.allclose(m, torch.ones(8)) and torch.equal(m[plain <= 0], torch.ones(int((plain <= 0).sum())))
    assert got.fields["diversity/shaped"] == 1
    assert got.fields["diversity/multiplier_mean"] == pytest.approx(m[plain > 0].mean().item())
    assert got.fields["diversity/nearest_distance"] > 0 and exp.timings["reward"] > 1.0
    unshaped = step_advantages(exp, build_rewards([spec]), GRPOConfig(group_size=4))
    torch.testing.assert_close(unshaped.advantages, plain)
    assert unshaped.fields == {}


def test_features_that_raise_leave_the_step_unshaped_and_warn(caplog):
    """A backbone failing (out of memory, a processor error) must not stop the step nor leave other ranks in a
    gather: the step is not shaped, the record says so, a warning says why."""
    from glm_grpo_ds.config import GRPOConfig

    spec = SimpleNamespace(name="pixel_mse", weight=1.0, args={}, label=None)
    reward_fn = build_rewards([spec], "pixels")

    def broken(images):
        raise RuntimeError("CUDA out of memory")

    reward_fn.features = broken
    rewards = torch.rand(8, generator=torch.Generator().manual_seed(4))
    exp = SimpleNamespace(per_reward={"pixel_mse": rewards}, images=torch.rand(8, 3, 16, 16), timings={})
    got = step_advantages(exp, reward_fn, GRPOConfig(group_size=4, diversity_features="pixels"))
    plain, _ = combine_advantages({"pixel_mse": rewards}, {"pixel_mse": 1.0}, 4, "sum_then_normalize", "group")
    torch.testing.assert_close(got.advantages, plain)
    assert got.fields == {"diversity/shaped": 0}
    assert "grpo.diversity_features raised RuntimeError: CUDA out of memory" in caplog.text


def _two_rank_advantages(rank: int, port: int, images, rewards, broken_rank, out_dir: str) -> None:
    """One of two gloo ranks: its half of the samples (one group of 4 each) through step_advantages."""
    from glm_grpo_ds.config import GRPOConfig

    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        spec = SimpleNamespace(name="pixel_mse", weight=1.0, args={}, label=None)
        reward_fn = build_rewards([spec], "pixels")
        if rank == broken_rank:
            reward_fn.features = lambda images: 1 / 0  # this rank's features raise
        mine = slice(4 * rank, 4 * rank + 4)
        exp = SimpleNamespace(per_reward={"pixel_mse": rewards[mine]}, images=images[mine], timings={})
        got = step_advantages(exp, reward_fn, GRPOConfig(group_size=4, diversity_features="pixels"))
        torch.save((got.advantages, got.fields), f"{out_dir}/{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("broken_rank", [None, 1])
def test_two_ranks_shape_their_global_batch_as_one_process_does(tmp_path, broken_rank):
    """Every rank gets the one-process advantages of the whole batch; when one rank's features raise, both ranks
    leave the step unshaped (no rank waits alone in the features' gather)."""
    import torch.multiprocessing as mp

    from glm_grpo_ds.runtime.ports import free_port

    g = torch.Generator().manual_seed(5)
    images, rewards = torch.rand(8, 3, 32, 32, generator=g), torch.rand(8, generator=g)
    mp.spawn(_two_rank_advantages, args=(free_port(), images, rewards, broken_rank, str(tmp_path)), nprocs=2)
    (a0, f0), (a1, f1) = (torch.load(tmp_path / f"{r}.pt") for r in (0, 1))
    plain, _ = combine_advantages({"pixel_mse": rewards}, {"pixel_mse": 1.0}, 4, "sum_then_normalize", "group")
    shaped = plain * diversity_multipliers(nearest_distances(ImageFeatures("pixels")(images), 4), plain, 4)
    torch.testing.assert_close(a0, plain if broken_rank is not None else shaped)
    assert torch.equal(a0, a1) and f0 == f1 and f0["diversity/shaped"] == (0 if broken_rank is not None else 1)

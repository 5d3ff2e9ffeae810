"""Prompt files and the per-rank split."""

import json
from pathlib import Path

import pytest

from glm_grpo_ds.data import DataError, PromptOrder, load_prompts


def test_txt_and_jsonl(tmp_path):
    (tmp_path / "p.txt").write_text("a cat\n\n  a dog  \n")
    assert [r.prompt for r in load_prompts(tmp_path / "p.txt")] == ["a cat", "a dog"]
    from PIL import Image

    Image.new("RGB", (4, 4)).save(tmp_path / "img.png")
    lines = [{"prompt": "p0", "target_image": "img.png", "text": "HI", "style": "flat"}, {"prompt": "p1"}]
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    rows = load_prompts(tmp_path / "p.jsonl")
    assert rows[0].target_image == str((tmp_path / "img.png").resolve()) and rows[0].text == "HI"
    assert rows[0].extra == {"style": "flat"} and rows[1].index == 1 and rows[1].target_image is None


@pytest.mark.parametrize(
    "content,message",
    [
        ('{"prompt": "ok"}\n{"prompt": broken}\n', r"p.jsonl:2: not valid JSON"),
        (
            '{"text": "no prompt"}\n',
            r"p.jsonl:1: each line needs a non-empty string field \"prompt\" \(this line has text\)",
        ),
        (
            '{"caption": "a cat", "text": "HI"}\n',
            r"field \"prompt\" \(this line has caption, text: set data.prompt_key=caption if it holds the prompts\)$",
        ),
        # the field is there, its value is not text: said as it is (it read "(this line has prompt)")
        ('{"prompt": null}\n', r"p.jsonl:1: each line needs a non-empty string field \"prompt\" \(here it is null\)$"),
        ('{"prompt": 5}\n', r"field \"prompt\" \(here it is 5\)$"),
        ('{"prompt": "ok"}\n42\n', r"p.jsonl:2: each line needs a non-empty string field \"prompt\"$"),
        ('{"prompt": "x", "target_image": "missing.png"}\n', r"p.jsonl:1: target_image missing.png not found"),
        ('{"prompt": "x", "target_image": "bad.png"}\n', r"p.jsonl:1: target_image bad.png cannot be read as an image"),
        ("\n\n", "holds no prompts"),
    ],
)
def test_bad_jsonl_names_file_and_line(tmp_path, content, message):
    (tmp_path / "bad.png").write_bytes(b"not a png")
    (tmp_path / "p.jsonl").write_text(content)
    with pytest.raises(DataError, match=message):
        load_prompts(tmp_path / "p.jsonl")


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs Linux's /proc")
@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
def test_a_prompt_file_that_cannot_be_read_is_one_line(tmp_path, suffix):
    """A read error (here an I/O error: a link to this process's /proc/self/mem, which read() refuses at offset 0,
    as root too; permissions for another user) is a DataError naming the file, not an OSError traceback."""
    link = tmp_path / f"prompts{suffix}"
    link.symlink_to("/proc/self/mem")
    with pytest.raises(DataError, match=rf"prompts{suffix} cannot be read \(Input/output error\); check the file"):
        load_prompts(link)


def test_ranks_get_distinct_prompts_deterministically(tmp_path):
    (tmp_path / "p.txt").write_text("\n".join(f"prompt {i}" for i in range(10)))
    rows = load_prompts(tmp_path / "p.txt")
    samplers = [PromptOrder(rows, 2, r, 2, seed=3) for r in range(2)]
    seen = []
    for _ in range(5):  # 5 steps x 4 prompts = 2 epochs
        step = [s.next() for s in samplers]
        ids = [row.index for part in step for row in part]
        assert len(set(ids)) == 4  # no two ranks share a prompt in a step
        seen += ids
    assert sorted(seen) == sorted(list(range(10)) * 2)  # every prompt once per epoch
    again = PromptOrder(rows, 2, 0, 2, seed=3)
    assert [r.index for r in again.next()] == [r.index for r in PromptOrder(rows, 2, 0, 2, seed=3).next()]


def test_sampler_state_roundtrip(tmp_path):
    (tmp_path / "p.txt").write_text("\n".join(f"p{i}" for i in range(7)))
    rows = load_prompts(tmp_path / "p.txt")
    a = PromptOrder(rows, 1, 0, 3, seed=1)
    for _ in range(3):
        a.next()
    b = PromptOrder(rows, 1, 0, 3, seed=1)
    b.load_state(a.state())
    assert [r.index for r in a.next()] == [r.index for r in b.next()]


def test_output_dir_must_be_creatable_and_writable(tmp_path):
    from glm_grpo_ds.lifecycle.checkpoint import OutputDirError, check_output_dir

    assert check_output_dir(tmp_path / "a" / "b", rank=0).is_dir()
    assert not list((tmp_path / "a" / "b").iterdir())  # the probe file is gone
    (tmp_path / "file").write_text("x")
    with pytest.raises(
        OutputDirError, match=r"output_dir .*file/sub: .*file is a file, not a directory; pick another output_dir="
    ):
        check_output_dir(tmp_path / "file" / "sub", rank=0)


def test_a_step_across_an_epoch_end_never_repeats_a_prompt_and_resume_keeps_the_deferred(tmp_path):
    # 5 prompts, 3 per step: most steps cross an epoch end, where the new order may start with a prompt the
    # step already took; it then takes the next one and the met prompt leads the following step
    (tmp_path / "p.txt").write_text("\n".join(f"p{i}" for i in range(5)))
    rows = load_prompts(tmp_path / "p.txt")
    s = PromptOrder(rows, 1, 0, 3, seed=0)
    seen, deferred_states = [], 0
    for _ in range(200):
        step = [r.index for r in s.next()]
        assert len(set(step)) == 3, step
        seen += step
        if s.deferred:
            deferred_states += 1
            resumed = PromptOrder(rows, 1, 0, 3, seed=0)
            resumed.load_state(s.state())
            twin = PromptOrder(rows, 1, 0, 3, seed=0)
            twin.load_state(s.state())
            waiting = list(s.deferred)
            step_after = [r.index for r in resumed.next()]
            assert step_after == [r.index for r in twin.next()] and step_after[: len(waiting)] == waiting
    assert deferred_states > 0  # the case happened
    counts = [seen.count(i) for i in range(5)]
    assert max(counts) - min(counts) <= 1  # every prompt still once per epoch, a deferral at most one step late


@pytest.mark.parametrize("change", [{"seed": 2}, {"shuffle": False}])
def test_a_resume_with_another_seed_or_shuffle_finishes_the_epoch_in_its_order(tmp_path, change):
    """The checkpoint holds a position in its epoch's permutation; a resume that drew the permutation with a new seed
    (or in file order) repeated some prompts of that epoch and never drew others (79 of 100 seen)."""
    (tmp_path / "p.txt").write_text("\n".join(f"p{i}" for i in range(100)))
    rows = load_prompts(tmp_path / "p.txt")
    first = PromptOrder(rows, 1, 0, 10, seed=1)
    seen = [r.index for _ in range(5) for r in first.next()]
    resumed = PromptOrder(rows, 1, 0, 10, **{"seed": 1, "shuffle": True, **change})
    resumed.load_state(first.state())
    seen += [r.index for _ in range(5) for r in resumed.next()]
    assert sorted(seen) == list(range(100))  # epoch 0 whole
    epoch_1 = [r.index for r in resumed.next()]
    fresh = PromptOrder(rows, 1, 0, 10, **{"seed": 1, "shuffle": True, **change})
    fresh.load_state({"epoch": 1, "position": 0})  # the new settings from the next epoch on
    assert epoch_1 == [r.index for r in fresh.next()]


def test_a_resume_on_a_shorter_prompt_file_drops_the_rows_it_no_longer_has(tmp_path):
    (tmp_path / "p.txt").write_text("\n".join(f"p{i}" for i in range(6)))
    order = PromptOrder(load_prompts(tmp_path / "p.txt"), 1, 0, 2, seed=0)
    order.load_state({"epoch": 3, "position": 2, "deferred": [8, 1, 9]})  # written with 10 rows
    assert order.deferred == [1] and order.next()[0].index == 1


def test_with_mini_batches_the_kth_optimizer_steps_prompts_and_streams_do_not_depend_on_the_ranks(tmp_path):
    """batch.mini_batches 2: each rank's first half of its prompts is its share of the first half of the step's draw,
    so the first optimizer step trains the same 4 prompts on 1, 2 or 4 ranks (8 prompts a step), each with the same
    sampling stream; mini-batches that do not divide prompts_per_rank keep each rank's contiguous slice."""
    from glm_grpo_ds.runtime.seeding import rollout_seeds

    (tmp_path / "p.txt").write_text("\n".join(f"prompt {i}" for i in range(40)) + "\n")
    rows = load_prompts(tmp_path / "p.txt")

    def halves(world: int) -> list[set]:
        orders = [PromptOrder(rows, world, r, 8 // world, seed=7, mini_batches=2) for r in range(world)]
        mini = [[], []]
        for step in range(3):
            for order in orders:
                picked = [row.prompt for row in order.next()]
                seeds = rollout_seeds(7, step, order.places(order.rank))
                half = len(picked) // 2
                mini[0] += list(zip(picked[:half], seeds[:half]))
                mini[1] += list(zip(picked[half:], seeds[half:]))
        return [set(m) for m in mini]

    one = halves(1)
    assert halves(2) == one and halves(4) == one and not one[0] & one[1]
    order = PromptOrder(rows, 2, 1, 4, seed=7, mini_batches=2)
    assert order.places(1) == [2, 3, 6, 7] and PromptOrder(rows, 2, 1, 4, seed=7).places(1) == [4, 5, 6, 7]
    assert PromptOrder(rows, 2, 1, 3, seed=7, mini_batches=2).places(1) == [3, 4, 5]  # 3 prompts: one block
    # the gathered dead flags (rank after rank, each rank's in its order) land on their own rows
    ranks = [PromptOrder(rows, 2, r, 4, seed=7, mini_batches=2, dead_skip_prob=0.5) for r in range(2)]
    mine = [[row.index for row in order.next()] for order in ranks]
    ranks[0].observe([row in mine[1][:2] for part in mine for row in part])
    assert ranks[0].dead == set(mine[1][:2])

"""rollout.one_step_off's pieces without DeepSpeed (experience/off_policy.py, drawn.py): the pending rollout through a
checkpoint file and back (what a resume trains on first), and the background thread's order of calls. The runs
themselves: tests/integration/test_one_step_off.py."""

import pytest
import torch

from glm_grpo_ds.data import PromptOrder, PromptRow
from glm_grpo_ds.experience import Drawn, RolloutAhead, resumed
from glm_grpo_ds.lifecycle import checkpoint
from glm_grpo_ds.rollout import GridSpec, RolloutBatch
from glm_grpo_ds.rollout.backends import Sampled
from glm_grpo_ds.runtime.oom import marks


def _drawn(rows):
    n, length, tokens = 4, 3, 5
    g = torch.Generator().manual_seed(0)
    batch = RolloutBatch(
        prompt_ids=torch.randint(0, 50, (n, length), generator=g),
        prompt_mask=torch.ones(n, length, dtype=torch.long),
        completion_ids=torch.randint(0, 50, (n, tokens), generator=g),
        completion_mask=torch.ones(n, tokens),
        sampler_logps=-torch.rand(n, tokens, generator=g),
        position_ids=torch.arange(length + tokens).repeat(3, n, 1),
        prompt_index=torch.tensor([0, 0, 1, 1]),
        prompts=[rows[0].prompt] * 2 + [rows[1].prompt] * 2,
        grid=GridSpec((2, 2), (1, 1)),
    )
    return Drawn(rows, Sampled(batch, ref_logps=-torch.rand(n, tokens, generator=g)), {"rollout": 1.5}, {})


def test_the_pending_rollout_survives_a_checkpoint_file(tmp_path):
    rows = [PromptRow(i, f"prompt {i}") for i in range(5)]
    drawn = _drawn([rows[3], rows[1]])
    (tmp_path / checkpoint.AHEAD).mkdir()
    torch.save(drawn.state(), tmp_path / checkpoint.AHEAD / "rank_1.pt")
    back = Drawn.from_state(checkpoint.load_ahead(tmp_path, 1), rows, torch.device("cpu"))  # weights_only load
    assert [r.index for r in back.rows] == [3, 1] and back.timings == {"rollout": 1.5}
    for name in ("prompt_ids", "completion_ids", "sampler_logps", "position_ids", "prompt_index"):
        assert torch.equal(getattr(back.got.batch, name), getattr(drawn.got.batch, name)), name
    assert back.got.batch.prompts == ["prompt 3"] * 2 + ["prompt 1"] * 2 and back.got.batch.grid == GridSpec(
        (2, 2), (1, 1)
    )
    assert torch.equal(back.got.ref_logps, drawn.got.ref_logps) and back.got.old_logps is None
    assert checkpoint.load_ahead(tmp_path, 0) is None  # no file: nothing pending, the step samples anew
    other = [PromptRow(i + 100, f"prompt {i}") for i in range(5)]  # another prompt set at those positions
    with pytest.raises(ValueError, match="not this prompt set's"):
        Drawn.from_state(drawn.state(), other, torch.device("cpu"))


class _Maker:
    """Stands in for the ExperienceMaker (the thread's caller is what is tested here): records what it drew."""

    def __init__(self):
        self.calls = []

    def draw(self, rows, seeds, group_size=None, status=None, measured=True):
        assert not measured  # no device-wide synchronisation or peak reset from the thread
        self.calls.append((rows, seeds))
        if seeds == [13]:
            raise RuntimeError("sampler failed")
        if seeds == [14]:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB.")
        return _drawn(rows)


def test_the_thread_draws_what_start_asked_and_wait_hands_it_over_or_raises():
    maker = _Maker()
    ahead = RolloutAhead(maker, torch.device("cpu"))
    rows = [PromptRow(0, "a"), PromptRow(1, "b")]
    assert ahead.take() is None and ahead.wait() == 0.0  # nothing started: nothing to wait for
    ahead.start(rows, [7])
    with pytest.raises(RuntimeError, match="already ahead"):
        ahead.start(rows, [8])
    assert ahead.wait() >= 0 and maker.calls == [(rows, [7])]
    drawn = ahead.take()
    assert drawn.rows == rows and set(drawn.timings) == {"rollout"} and drawn.peaks == {} and ahead.take() is None
    ahead.start(rows, [13])
    with pytest.raises(RuntimeError, match="sampler failed"):
        ahead.wait()
    assert ahead.pending is None
    # out of memory on the thread: the run's line says where (glm_grpo_ds/memory/oom.py), as the plan counts it
    ahead.start(rows, [14])
    with pytest.raises(torch.OutOfMemoryError) as caught:
        ahead.wait()
    assert marks(caught.value) == ("decode", "the rollout drawn ahead, rollout.one_step_off")
    ahead.close()


def test_a_rollout_ahead_that_failed_when_the_step_ended_is_said_at_close(caplog):
    """An error ended the step while the rollout ahead ran; that rollout failed too (it may be the cause: an
    out-of-memory beside the decode): close() said nothing of it."""
    ahead = RolloutAhead(_Maker(), torch.device("cpu"))
    ahead.start([PromptRow(0, "a"), PromptRow(1, "b")], [13])
    with caplog.at_level("WARNING"):
        ahead.close()
    assert "the rollout drawn ahead (rollout.one_step_off) failed too: RuntimeError: sampler failed" in caplog.text
    ahead = RolloutAhead(_Maker(), torch.device("cpu"))
    ahead.start([PromptRow(0, "a"), PromptRow(1, "b")], [7])
    caplog.clear()
    ahead.close()
    assert "failed" not in caplog.text and ahead.pending is None


def _checkpoint_ahead(path, per_rank_rows):
    (path / checkpoint.AHEAD).mkdir(parents=True)
    rows = [PromptRow(i, f"prompt {i}") for i in range(8)]
    for rank, picked in enumerate(per_rank_rows):
        torch.save(_drawn([rows[i] for i in picked]).state(), path / checkpoint.AHEAD / f"rank_{rank}.pt")
    return rows


def test_a_pending_rollout_of_another_batch_is_not_taken_and_its_prompts_come_first(tmp_path):
    """Resumed on the same 2 ranks with batch.prompts_per_rank 2 -> 1, a one-step-off checkpoint's rollouts drawn
    ahead (2 prompts per rank) are not the next step's (that crashed the step: its dead-group report had the old
    batch's length): their prompts come first in the next steps, in rank order, sampled anew. The same batch takes
    this rank's rollout as is; a run now on-policy requeues them too (none skipped for the epoch)."""
    rows = _checkpoint_ahead(tmp_path, [[3, 1], [4, 0]])
    order = PromptOrder(rows, world_size=2, rank=1, prompts_per_rank=1, seed=0)
    ahead = RolloutAhead(_Maker(), torch.device("cpu"))
    resumed.take_pending(ahead, tmp_path, 1, 1, order, torch.device("cpu"))
    assert ahead.pending is None and order.deferred == [3, 1, 4, 0]
    assert [r.index for r in order.next()] == [1] and order.last_picked == [3, 1]
    order.observe([False, True])  # the step's groups, as the trainer reports them
    assert [r.index for r in order.next()] == [0] and order.last_picked == [4, 0]

    order = PromptOrder(rows, world_size=2, rank=1, prompts_per_rank=2, seed=0)
    resumed.take_pending(ahead, tmp_path, 1, 2, order, torch.device("cpu"))
    assert [r.index for r in ahead.pending.rows] == [4, 0] and order.deferred == []

    # the same batch drawn with another group size (or sampling, size, seed): not the next step's either
    for changed in ({"grpo.group_size": [4, 8]}, {"grpo.sampling.temperature": [1.0, 0.7]}):
        ahead.pending = None
        order = PromptOrder(rows, world_size=2, rank=1, prompts_per_rank=2, seed=0)
        resumed.take_pending(ahead, tmp_path, 1, 2, order, torch.device("cpu"), changes=changed)
        assert ahead.pending is None and order.deferred == [3, 1, 4, 0]
    resumed.take_pending(ahead, tmp_path, 1, 2, order, torch.device("cpu"), changes={"optimizer.lr": [1, 2]})
    assert ahead.pending is not None  # a change the draw did not depend on

    # the prompt file edited in place (same row numbers; rank 0's row 3 says something else now): the samples are
    # not of these prompts; every rank requeues (rank 1's own rows are unchanged)
    ahead.pending = None
    edited = [PromptRow(i, "a red cube" if i == 3 else f"prompt {i}") for i in range(8)]
    order = PromptOrder(edited, world_size=2, rank=1, prompts_per_rank=2, seed=0)
    resumed.take_pending(ahead, tmp_path, 1, 2, order, torch.device("cpu"))
    assert ahead.pending is None and order.deferred == [3, 1, 4, 0]

    order = PromptOrder(rows, world_size=1, rank=0, prompts_per_rank=2, seed=0)
    order.deferred = [6]
    resumed.requeue_unused(tmp_path, 2, order)
    assert order.deferred == [3, 1, 4, 0, 6]
    ahead.close()


def test_a_pending_rollouts_prompts_are_read_back_in_the_order_of_the_steps_draw():
    """Each rank's pending rollout keeps its places in the step's draw (batch.mini_batches 2 on 2 ranks: 0, 1, 4, 5
    and 2, 3, 6, 7), so a resume on other ranks splits the same draw; a checkpoint without them (written before)
    drew each rank's slice in rank order."""
    states = [{"rows": [10, 11, 14, 15], "places": [0, 1, 4, 5]}, {"rows": [12, 13, 16, 17], "places": [2, 3, 6, 7]}]
    assert resumed.drawn_rows(states) == [10, 11, 12, 13, 14, 15, 16, 17]
    old = [{"rows": state["rows"]} for state in states]
    assert resumed.drawn_rows(old) == [10, 11, 14, 15, 12, 13, 16, 17] and resumed.drawn_rows([]) is None

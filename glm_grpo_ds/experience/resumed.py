"""A one-step-off checkpoint's pending rollout on resume: the rollout it drew ahead for the step after it
(``checkpoint/ahead/rank_<r>.pt``, lifecycle/checkpoint.py) is that step's when the run resumes as it was, sampled
again when only the world size changed, and otherwise not used, its prompts then coming first in the steps that
follow: the sampler's position was saved after that draw, so dropped, they would be skipped for the rest of the epoch.

    take_pending(ahead, path, rank, per, order, device, changes)  # same world size and stage (before the weights sync)
    draw_again(ahead, path, step, rank, world, per, order, maker)   # another world size or stage (after it)
    requeue_unused(path, step, order)                       # the run samples on-policy now
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..lifecycle import checkpoint
from ..runtime import log
from .drawn import Drawn


def ahead_rows(path: Path) -> list[int] | None:
    """The dataset rows of the rollout drawn ahead in checkpoint ``path``, every rank's in the step's draw (the global
    batch of the step it was drawn for; None for none): what a resume on another world size samples again."""
    return drawn_rows(checkpoint.ahead_states(path))


def drawn_rows(states: list[dict]) -> list[int] | None:
    """The dataset rows of ``checkpoint.ahead_states``' rollouts in the order of the step's draw (each rank's at its
    ``places``; rank after rank in a checkpoint without them, which drew them so); None for none."""
    if not states:
        return None
    rows = [int(row) for state in states for row in state["rows"]]
    if not all("places" in state for state in states):
        return rows
    return [row for _, row in sorted(zip((int(p) for state in states for p in state["places"]), rows))]


def requeue(order, rows: list[int]) -> None:
    """``rows`` (dataset rows, every rank's, in the step's draw) first in the next steps' prompts, before anything
    the order already deferred: every rank computes the same list."""
    order.deferred = list(rows) + [row for row in order.deferred if row not in rows]


# the settings a rollout drawn ahead was drawn with (keys of a resume's config changes, or their prefixes): changed,
# it is not the next step's (an old group size regrouped by the new one, tokens of the old grid decoded at the new size)
DRAW_SETTINGS = ("grpo.group_size", "grpo.sampling.", "rollout.height", "rollout.width", "seed")


def take_pending(ahead, path, rank: int, per: int, order, device: torch.device, changes: dict | None = None) -> None:
    """Resumed on the same world size and stage: this rank's rollout drawn ahead is the next step's (it then trains on
    what the uninterrupted run trained on), unless the prompts per rank or a setting it was drawn with changed
    (``changes``: the resume's config changes, lifecycle/run.py ``Start.changes``): then its prompts are requeued."""
    state = checkpoint.load_ahead(path, rank)
    if state is None:
        return
    drawn_with = sorted(key for key in changes or {} if key.startswith(DRAW_SETTINGS))
    # every rank decides alike: a rank whose prompts differ requeues them all (every rank's rollout is read)
    states = checkpoint.ahead_states(path)
    edited = not all(Drawn.same_prompts(other, order.rows) for other in states)
    if len(state["rows"]) != per or drawn_with or edited:
        rows = drawn_rows(states)
        why = (
            f"was drawn with other {', '.join(drawn_with)}"
            if drawn_with
            else "was drawn for other prompts at these rows of the prompt file (edited since)"
            if edited
            else f"holds {len(state['rows'])} prompts per rank, this run takes {per}"
        )
        log.info(
            f"glm-grpo: the rollout {path.name} drew ahead {why}: its {len(rows)} prompts come first in the next "
            "steps, sampled anew"
        )
        requeue(order, rows)
        return
    try:
        ahead.pending = Drawn.from_state(state, order.rows, device)
    except (ValueError, IndexError, KeyError, TypeError) as err:
        raise checkpoint.CheckpointError(
            f"{path / checkpoint.AHEAD}: the rollout drawn ahead cannot be read ({err}); resume from an "
            "earlier checkpoint, or remove that folder to sample this step anew"
        ) from err


def draw_again(ahead, path, step: int, rank: int, world: int, per: int, order, maker) -> None:
    """Resumed on another world size or stage: the ranks' rollouts drawn ahead for step ``step + 1`` were cut for the
    old ranks. The same prompts are sampled again here, split over this run's ranks, with the weights the run starts
    from (one step newer than the ones the uninterrupted run sampled them with); when the prompts per step changed,
    they come first in the next steps instead."""
    rows = ahead_rows(path)
    if rows is None:
        return
    if len(rows) != world * per:
        log.info(
            f"glm-grpo: the rollout {path.name} drew ahead for step {step + 1} held {len(rows)} prompts, a step of "
            f"this run takes {world * per}: those {len(rows)} come first in the next steps, sampled anew"
        )
        requeue(order, rows)
        return
    log.info(
        f"glm-grpo: the rollout {path.name} drew ahead for step {step + 1} is sampled again on this run's ranks "
        f"(the same prompts and seeds, with the weights of step {step} where the uninterrupted run used those of "
        f"step {step - 1}: that one step is on-policy)"
    )
    mine = [order.rows[rows[p]] for p in order.places(rank)]
    ahead.pending = maker.draw(mine, ahead.seeds(step))  # the streams the run samples step with


def requeue_unused(path, step: int, order) -> None:
    """A one-step-off checkpoint resumed on-policy: its rollout drawn ahead is not used; its prompts come first."""
    rows = ahead_rows(path)
    if rows:
        log.info(
            f"glm-grpo: the rollout {path.name} drew ahead for step {step + 1} is not used (this run samples "
            f"on-policy): its {len(rows)} prompts come first in the next steps"
        )
        requeue(order, rows)

"""Every figure measured on a GPU that the planners rest on, each with its card and date: the one home of them (the
planners and their checks import them from here).

* The planned time's anchors (glm_grpo_ds/memory/step_time.py scales them to a config): the decode step per sampler,
  the DiT per guided image-step and its glyph encoder + VAE per image, the DiT options' speed-ups, the update. They
  sit in one marked block that ``python -m glm_grpo_ds.memory.step_time --write-docs OUT`` rewrites from a run of
  launch/gpu_timing.sh (glm_grpo_ds/memory/timing_docs.py): measured values only, each tagged ``[card date]``.
  Their setting: GLM-Image at full size, 1024x1024, G=16 rows, LoRA r=64, world size 1 (docs/memory-and-speed.md).
* The memory plan's per-phase peaks (:data:`MEASURED`), each with its card, date and exact run, which
  tests/unit/test_memory_plan_measured.py and ``python -m glm_grpo_ds.testing.gpu_measurements`` hold the planner
  against.

Plain values only, no torch: launch/gpu_timing.sh's budget (glm_grpo_ds/memory/timing_budget.py) reads the anchors
between its parts in a fraction of a second.
"""

from __future__ import annotations

from dataclasses import dataclass

# gpu-timing:BEGIN anchors: rewritten in place, measured values only, by `python -m glm_grpo_ds.memory.step_time
# --write-docs OUT` from a run of launch/gpu_timing.sh (glm_grpo_ds/memory/timing_docs.py), each tagged [card date];
# untagged: the first measurements (one H200, torch 2.11, 2026-11: issues #39, #51, #52)
CARD = "one H200"
CARD_BYTES_PER_S = 4.8e12  # the card's HBM bandwidth (peak)
# ms per decode step of the full-size AR at G=16, 1024x1024, LoRA r=64 (glm-grpo profile decode-timing, #51)
DECODE_STEP_MS = {
    ("eager", False): 75.7,  # the eager loop, LoRA unmerged
    ("eager", True): 41.2,  # the eager loop, LoRA merged
    ("graph", False): 19.3,  # rollout.cuda_graph, LoRA unmerged
    ("graph", True): 13.0,  # rollout.cuda_graph + rollout.merge_lora
    ("compiled", True): 9.4,  # + rollout.compile with compile_scope layers
    ("graph_fused", False): None,  # rollout.fuse_lora + cuda_graph, the exact fast sampler (None: until measured)
}
# the DiT, eager sdpa, batch 8, 1024x1024: per image and guided step (two forwards), the glyph encoder and the VAE
# once per image beside it (0.0: inside the step's figure, as in the first measurement: a whole training decode)
GUIDED_IMAGE_STEP_S = 0.289  # untagged: a training step's decode, 37.0 s / 16 images / 8 steps
DECODE_FIXED_S = 0.0  # per image: the glyph encoder and the VAE
DIT_SPEEDUP = {}  # decoder options against eager sdpa (glm-grpo profile dit-timing), keyed as dit_options() names them
UPDATE_S = {2: 4.85, 3: 20.2}  # LoRA update at 16 sequences of 1 280 tokens, world size 1 (ZeRO-1 runs ZeRO-2's)
# gpu-timing:END anchors
# glm-grpo profile decode-timing's variants whose measurement is an anchor of DECODE_STEP_MS (its key)
ANCHOR_VARIANTS = {
    "eager": ("eager", False),
    "merged": ("eager", True),
    "graph_lora": ("graph", False),
    "graph": ("graph", True),
    "graph_compiled": ("compiled", True),
    "graph_fused": ("graph_fused", False),
}


@dataclass(frozen=True)
class Measured:
    """One run's per-phase peak GPU memory (``memory/<phase>_peak_mb`` of its metrics.jsonl,
    ``torch.cuda.max_memory_allocated`` per phase), with the card, the date and the exact run."""

    name: str
    card: str
    date: str
    model: tuple[int, int]  # (AR layers, DiT layers) at GLM-Image's real widths; (40, 30) = full size
    config: str  # launch/configs/*.yaml
    deepspeed: str  # ds_configs/*.json
    overrides: tuple[str, ...]
    phases_mb: dict[str, float]  # memory/<phase>_peak_mb of the run's (only) step
    world_size: int = 1
    notes: str = ""
    first_step: bool = True


MEASURED = (
    Measured(
        name="full fine-tuning, real-width slice",
        card="one H200 (torch 2.11.0+cu130, sdpa)",
        date="2026-11 (issue #50)",
        model=(1, 1),  # AR 1 layer (vision tower at depth 1) + DiT 1 layer: 1.05 B AR parameters, 0.96 B trainable
        config="launch/configs/glm_image_full.yaml",
        deepspeed="ds_configs/zero3.json",
        overrides=("grpo.group_size=2", "decoder.dtype=bf16"),
        phases_mb={"rollout": 10.72 * 1024, "decode": 14.75 * 1024, "reward": 10.74 * 1024, "update": 25.67 * 1024},
        notes="issue #50: AdamW, a frozen reference engine (beta 0.04), 1024x1024",
    ),
    Measured(
        name="LoRA, GLM-Image at full size",
        card="one H200 (torch 2.11.0+cu130, sdpa)",
        date="2026-11 (issues #51, #52)",
        model=(40, 30),  # AR 40 layers (vision tower at depth 1) 9.01 B + DiT 30 layers 6.93 B
        config="launch/configs/gpu_check.yaml",
        deepspeed="ds_configs/zero2.json",
        overrides=(
            "grpo.group_size=16",
            "decoder.batch_size=8",
            "decoder.num_inference_steps=8",
            "decoder.guidance_scale=1.5",
            "rollout.fuse_lora=false",  # gpu_check.yaml samples fused since; this run sampled merged
            "rollout.merge_lora=true",
            "rollout.cuda_graph=true",
        ),
        phases_mb={"decode": 64633.0},
        notes="issues #51/#52: LoRA r=64, 8-bit AdamW, the merge copy on the GPU, 1024x1024; the decode peak",
    ),
)

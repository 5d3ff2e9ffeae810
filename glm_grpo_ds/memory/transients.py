"""The transient components of the memory plan (glm_grpo_ds/memory/plan.py): what one phase of a step allocates
and frees (the rollout's KV cache and gathers, the update's activations, the optimizer step's fp32 temporaries,
the decode's activations, an offloaded reward model's visit), one function each returning ``(bytes, note)``.
Activation-type estimates, labelled as such in the output; which of them a phase holds at once is
memory/phases.py.
"""

from __future__ import annotations

from ..decoder.fp8 import QUANTIZE_BYTES
from .basis import Basis


def fp32_grad_step(s: Basis) -> tuple[int, str]:
    # At optimizer.step DeepSpeed converts the gradient partition to fp32 for the fp32 master
    # (ZeRO-1/2: the whole partition at once; ZeRO-3: one sub-group at a time, Basis.sub_group).
    if s.stage == 0 or s.offload_opt:
        return 0, "stage 0: the optimizer steps on the gradients" if s.stage == 0 else "offloaded: on the host"
    if s.stage == 3:
        return 4 * s.sub_group, "fp32 gradients of one ZeRO-3 sub-group at optimizer.step"
    return 4 * s.shard(s.psi_t), "fp32 copy of the gradient partition at optimizer.step"


def optimizer_step_temporaries(s: Basis) -> tuple[int, str]:
    # What the step allocates beside the fp32 gradients. Measured on a CPU (docs/real-width.md): bitsandbytes
    # has no in-place CPU kernel for its 8-bit AdamW; the step dequantizes both moments and computes in fp32
    # temporaries, 5 x the fp32 elements it steps (bitsandbytes 0.50.2); torch's AdamW (one tensor at a time
    # on a CPU) 2 x. On a GPU torch's AdamW runs its foreach path (torch/optim/adam.py defaults to foreach for
    # CUDA tensors), which allocates one fp32 temporary of the stepped elements (``_foreach_sqrt`` of the second
    # moment): the full fine-tuning slice's step on an H200 (memory/gpu_figures.py) needs it. bitsandbytes' GPU
    # kernel and DeepSpeed's CPU Adam of an offloaded optimizer update in place. ZeRO-3 steps one sub-group
    # at a time.
    torch_adamw = s.cfg.optimizer.name == "adamw"
    if s.offload_opt or (s.on_gpu and not torch_adamw):
        return 0, "the optimizer updates in place"
    if s.on_gpu:
        return 4 * s.stepped, "GPU: torch AdamW's foreach step, one fp32 temporary"
    name = "torch AdamW" if torch_adamw else "bitsandbytes 8-bit AdamW"
    return (2 if torch_adamw else 5) * 4 * s.stepped, f"CPU: {name}'s fp32 temporaries"


def grad_flatten(s: Basis) -> tuple[int, str]:
    # DeepSpeed makes the fp32 gradient by flattening the model-dtype gradient partition into a new tensor and
    # converting that (stage3.py _prepare_fp32_grad_for_sub_group, stage_1_and_2.py step: ``flatten(...).to(fp32)``):
    # for a moment the flat model-dtype copy and the fp32 result exist together, before the optimizer runs.
    if not (s.stage >= 1 and not s.offload_opt and s.grad_b < 4):
        return 0, "no flat copy"
    note = "the flat model-dtype gradient DeepSpeed converts to fp32 (beside it, before the optimizer step)"
    return s.grad_b * s.stepped, note


def rollout_kv_cache(s: Basis) -> tuple[int, str]:
    t, rows = s.sizes.text, s.cfg.sequences_per_rank
    nbytes = rows * s.seq * t["layers"] * 2 * t["kv_heads"] * t["head_dim"] * s.b
    return nbytes, f"{rows} sequences x {s.seq} tokens ({s.est.prompt_tokens} prompt + {s.n_gen} generated)"


def rollout_gather(s: Basis) -> tuple[int, str]:
    if s.stage == 3 and s.copies and s.cfg.rollout.gather_parameters:
        full_ar = sum(s.sizes.ar_base) * s.b + sum(s.sizes.lora) * s.lora_b
        return full_ar, "ZeRO-3: whole AR gathered once per rollout"
    return 0, "no full gather"


def rollout_merge(s: Basis) -> tuple[int, str]:
    # The merge (merged_lora.py) writes W + s·B·A one linear at a time, before the KV cache exists: the fp32
    # delta, W in fp32 and their fp32 sum (12 bytes per element of the largest adapted linear; a fp32 W is
    # its own .float(): 8)
    if s.merging:
        nbytes = (12 if s.b < 4 else 8) * max(s.sizes.adapted_base)
        return nbytes, "rollout.merge_lora: fp32 temporaries of merging the largest adapted linear"
    return 0, "no merge"


def rollout_fused_lora(s: Basis) -> tuple[int, str]:
    # rollout.fuse_lora (fused_lora.py): per layer, the q/k/v adapters' A's concatenated and their s*B as a
    # block-diagonal matrix, made for the rollout (alongside the KV cache), in the adapters' dtype
    lora, t = s.cfg.lora, s.sizes.text
    shared = [m for m in ("q_proj", "k_proj", "v_proj") if lora is not None and m in lora.target_modules]
    if not (s.cfg.rollout.fuse_lora and len(shared) > 1):
        return 0, "no fused LoRA copies"
    qkv_out = {"q_proj": t["heads"] * t["head_dim"], "k_proj": t["kv_heads"] * t["head_dim"]}
    qkv_out["v_proj"] = qkv_out["k_proj"]
    per_layer = len(shared) * lora.r * (t["hidden"] + sum(qkv_out[m] for m in shared))
    note = f"rollout.fuse_lora: {'/'.join(m[0] for m in shared)} A's concatenated and block-diagonal s*B, per layer"
    return t["layers"] * per_layer * s.lora_b, note


def logits(s: Basis) -> tuple[int, str]:
    vocab, mb = s.sizes.text["vision_vocab"], s.cfg.batch.micro_batch_size
    nbytes = mb * s.n_gen * vocab * s.b + 3 * mb * min(s.cfg.grpo.logprob_chunk_size, s.n_gen) * vocab * 4
    return nbytes, f"micro-batch {mb}: {s.dtype_name} logits kept for backward + one fp32 chunk"


def rollout_logprobs(s: Basis) -> tuple[int, str]:
    # The reference (LoRA) and old log-probs run in the rollout's gather, after sampling (the KV cache is
    # gone): no-grad forwards of a micro-batch, one layer's tensors at a time and one fp32 logits chunk.
    if not s.cfg.logprobs_in_rollout:
        return 0, "none (no reference / old pass)"
    mb, chunk = s.cfg.batch.micro_batch_size, min(s.cfg.grpo.logprob_chunk_size, s.n_gen)
    nbytes = mb * s.seq * s.per_layer * s.b + 3 * mb * chunk * s.sizes.text["vision_vocab"] * 4
    return nbytes, f"reference / old log-probs in the rollout's gather, micro-batch {mb}, no grad"


def activations(s: Basis) -> tuple[int, str]:
    mb, layers = s.cfg.batch.micro_batch_size, s.sizes.text["layers"]
    if s.cfg.model.gradient_checkpointing:
        nbytes = mb * s.seq * (layers * s.sizes.text["hidden"] + s.per_layer) * s.b
        return nbytes, f"micro-batch {mb} x {s.seq} tokens, checkpointed (layer inputs + one layer)"
    return mb * s.seq * layers * s.per_layer * s.b, f"micro-batch {mb} x {s.seq} tokens, every layer's saved tensors"


def zero3_update_gather(s: Basis) -> tuple[int, str]:
    # ZeRO-3 keeps up to stage3_max_live_parameters gathered (checkpointing reuses each layer
    # soon, so they are not released early) plus one prefetch bucket.
    if s.stage != 3:
        return 0, "-"
    live = min(s.max_live, sum(s.sizes.ar_base) + sum(s.sizes.lora))
    # one rank, nothing offloaded: the gathered parameters are the weights
    gathered = (live + s.prefetch) * s.b if s.copies else 0
    # Plus the whole gradient of the largest trainable tensor, which exists before its reduce-scatter.
    nbytes = gathered + s.sizes.largest_trainable * max(s.grad_b, s.trainable_b)
    return nbytes, "ZeRO-3 live parameters + prefetch bucket + the largest tensor's full gradient"


def gather_staging(s: Basis) -> tuple[int, str]:
    # Measured on the real-width slice (docs/real-width.md): torch's gloo backend (CPU ranks) all-gathers
    # into a temporary of the output's full size and then copies it out, so a ZeRO-3 gather holds its
    # largest tensor (the 168 064 x 4096 embedding) twice for a moment; NCCL writes the output in place.
    if s.stage == 3 and s.world > 1 and not s.on_gpu:
        return max(s.sizes.ar_base) * s.b, "CPU ranks (gloo): the largest gathered tensor staged once more"
    return 0, "NCCL gathers in place"


def decode_activations(s: Basis) -> tuple[int, str]:
    # One DiT batch holds the rows of one prompt (decoder/image_decoder.py); GlmImagePipeline runs the CFG pass as a
    # second forward, not a doubled batch. The DiT's and the VAE's activations are never alive together.
    # VAE: its last up block holds its input, the norm and the activation of it: 3 full-resolution maps
    # of vae_full_res_channels on a CPU (measured on the real-width slice at 1024x1024: 3.0 GiB for 2 bf16
    # images), 4 on a GPU (measured on an H200, memory/gpu_figures.py: 4.03 GiB for the same 2 images;
    # GLM-Image at full size, 8 images: the decode peak 3.9 GiB above the 3-map plan), the convolution's extra
    # output map.
    cfg = s.cfg
    # the in-training evaluation decodes its eval.group_size rows of a prompt through the same decoder
    group = max(cfg.grpo.group_size, cfg.eval.group_size if cfg.eval.file else 0)
    images = min(cfg.decoder.batch_size, group)
    latent_tokens = (cfg.rollout.height // 16) * (cfg.rollout.width // 16)
    dit = images * latent_tokens * s.sizes.dit_hidden * s.dec_b * 12
    if cfg.decoder.fp8:  # the feed-forward's 4 x hidden input quantized (decoder/fp8.py): fp32 copy + e4m3
        dit += images * latent_tokens * 4 * s.sizes.dit_hidden * QUANTIZE_BYTES
    if cfg.decoder.attention == "sdpa_math":  # the reference kernel materialises heads x L x L scores and their
        # softmax (computed, not yet measured; the glyph tokens beside the latent ones left out): 1024^2, 32 heads,
        # bf16: 2 GiB an image, where the fused kernels hold none
        dit += images * s.sizes.dit_heads * latent_tokens**2 * s.dec_b * 2
    vae_maps = 4 if s.on_gpu else 3
    vae = images * s.sizes.vae_full_res_channels * cfg.rollout.height * cfg.rollout.width * s.dec_b * vae_maps
    nbytes = max(dit, vae) + (s.decoder_bytes if cfg.decoder.offload else 0)  # an offloaded decoder visits
    return nbytes, f"{images} images per DiT forward and VAE decode, the larger of the two"


def decoder_fp8_load(s: Basis) -> tuple[int, str]:
    # decoder.fp8: the DiT loads in its dtype and its block linears are converted after (decoder/fp8.py, one layer
    # at a time), so at load the decoder briefly holds its full-precision bytes; offloaded, that happens on the host
    if not s.cfg.decoder.fp8 or s.cfg.decoder.offload:
        return 0, "no FP8 conversion on the GPU"
    return s.decoder_converting_bytes, "decoder.fp8: the DiT in its dtype at load, until converted"


def reward_offloaded(s: Basis) -> tuple[int, str]:
    # an offloaded reward model visits the GPU for its own call only (FrozenModel.on), one at a time
    offloaded = [r for r in s.rewards if r.where == "offload"]
    if offloaded:
        return max(r.bytes for r in offloaded), "largest offloaded reward model, on the GPU while it scores"
    return 0, "no offloaded reward"


def reward_scoring(s: Basis) -> tuple[int, str]:
    # the rewards, then the diversity features, score one after another: the largest forward's activations (the
    # vqa judge's and the features backbone's, memory/reward_models.py vlm_scoring / features_scoring; a 224-px
    # CLIP batch's are small beside its weights and not counted)
    scoring = [r for r in s.rewards if r.scoring]
    if scoring:
        top = max(scoring, key=lambda r: r.scoring)
        return top.scoring, f"{top.name}'s forward (computed from its config, no gradient)"
    return 0, "no judge forward counted"

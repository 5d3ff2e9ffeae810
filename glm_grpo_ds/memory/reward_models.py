"""Memory of a run's reward models, for the memory plan (glm_grpo_ds/memory/plan.py): which rewards hold a
model, where it lives (GPU, CPU, a remote server) and how many bytes, from parameter counts on the ``meta``
device (no weights are read). Used by ``glm-grpo estimate-memory`` and the trainer's startup plan.

    from glm_grpo_ds.memory.reward_models import reward_models
    for r in reward_models(cfg.rewards): print(r.name, r.where, r.bytes, r.note)

Where each built-in reward runs (glm_grpo_ds/rewards/):

* ``clip``, ``preference``, ``aesthetic``, ``lpips``, ``vqa``: torch modules in a
  :class:`~glm_grpo_ds.rewards.base.FrozenModel`, built on the host by ``build_rewards`` (before the AR loads) and
  moved to the images' device at the first score; with ``offload: true`` they go back to the host after every
  call (GPU only while scoring).
  CLIP sizes come from the checkpoint's ``config.json`` when the directory is here (dtype: the config's, which
  transformers' ``from_pretrained`` default ``dtype="auto"`` loads), else from :data:`CLIP_ARCHS`, the
  published configs of the CLIP checkpoints the reward docs name; an unknown directory without a config is
  planned as ViT-L/14 and says so. The aesthetic head is the LAION MLP (fp32, its ``load_state_dict`` copies
  into fp32 parameters); LPIPS is torchvision's backbone + lpips' linear heads (fp32); the vqa judge is sized from
  its config.json (here or in the Hugging Face cache), else planned as Qwen2.5-VL-7B-Instruct and says so.
* ``ocr``, ``ocr_word_accuracy``, ``ocr_region_ned``: RapidOCR's onnxruntime sessions, on the CPU (its ~16 MB of
  ONNX models are in the host allowance).
* ``remote``: scored by a reward server: 0 bytes on this GPU.
* ``pixel_mse``, ``ssim``, ``colour_layout``: arithmetic on the images, no model.
* ``python:`` / ``file.py:`` plugins: unknown to the planner, listed as not counted.
"""

from __future__ import annotations

import inspect
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config.fields import is_repo_id

# Published transformers CLIPConfig values (config.json of each Hub checkpoint) of the CLIP models the
# reward docs name, used when the checkpoint directory is not on this machine; keyed by the directory's
# name, lowercased. Their parameter counts on the meta device equal the published ones (tests/unit/
# test_memory_plan.py): ViT-B/32 151,277,313 and ViT-L/14 427,616,513 (openai/CLIP's notebook prints
# "Model parameters: ..."), ViT-H/14 986.11 M (open_clip's docs/model_profile.csv, mparams).
_B32 = dict(
    text=dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=8),
    vision=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12, patch_size=32),
    projection_dim=512,
)
_L14 = dict(
    text=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12),
    vision=dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16, patch_size=14),
    projection_dim=768,
)
_H14 = dict(  # laion/CLIP-ViT-H-14-laion2B-s32B-b79K; PickScore_v1 is a fine-tune of it
    text=dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16),
    vision=dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=16, patch_size=14),
    projection_dim=1024,
)
CLIP_ARCHS = {
    "clip-vit-base-patch32": ("openai/clip-vit-base-patch32", _B32),
    "clip-vit-large-patch14": ("openai/clip-vit-large-patch14", _L14),
    "clip-vit-h-14-laion2b-s32b-b79k": ("laion/CLIP-ViT-H-14-laion2B-s32B-b79K", _H14),
    "pickscore_v1": ("yuvalkirstain/PickScore_v1", _H14),
}
# Qwen/Qwen2.5-VL-7B-Instruct's published config.json (bf16), the vqa judge the reward docs name: 8,292,166,656
# parameters on the meta device, the "8.29B" of its model card (tests/unit/test_vqa_reward.py)
QWEN25_VL_7B = dict(
    text_config=dict(
        hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_hidden_layers=28, num_key_value_heads=4,
        vocab_size=152064, tie_word_embeddings=False,
    ),
    vision_config=dict(
        depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584, patch_size=14,
        spatial_merge_size=2, window_size=112, fullatt_block_indexes=[7, 15, 23, 31], temporal_patch_size=2,
    ),
    tie_word_embeddings=False,
)  # fmt: skip
FROZEN_MODEL_REWARDS = ("clip", "preference", "aesthetic", "lpips", "vqa")
NO_MODEL_REWARDS = ("pixel_mse", "ssim", "colour_layout")


@dataclass
class RewardModel:
    """One entry of ``rewards`` as the memory plan sees it."""

    name: str
    where: str  # "gpu" (whole, after the first score), "offload" (host; GPU while scoring), "cpu", "remote", "none"
    params: int
    bytes: int
    note: str
    # of ``bytes``, what loads memory-mapped: ``from_pretrained`` at the checkpoint's own dtype leaves the
    # tensors on the safetensors file (measured on a tiny CLIPModel: every parameter points into the file's
    # mapping), page cache shared by the node's ranks until the first score moves them to the GPU
    mapped: int = 0
    # the activations of one scoring forward on the GPU, where they matter (the vqa judge's: :func:`vlm_scoring`,
    # the diversity backbone's: :func:`features_scoring`; a 224-px CLIP batch's are small beside its weights and not
    # counted)
    scoring: int = 0


def _count(build) -> int:
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchvision / lpips deprecation notes
        return sum(p.numel() for p in build().parameters())


def _dtype_bytes(dtype) -> int:
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, torch.float32)
    return torch.empty(0, dtype=dtype or torch.float32).element_size()


def clip_size(path) -> tuple[int, int, int, str]:
    """``(parameters, bytes per parameter, projection_dim, where the size came from)`` of a CLIPModel checkpoint."""
    from transformers import CLIPConfig, CLIPModel

    p = Path(str(path)) if path else None
    if p is not None and (p / "config.json").is_file():
        conf = CLIPConfig.from_pretrained(p)
        source = f"{p.name}'s config.json"
    else:
        hub_id, arch = CLIP_ARCHS.get(p.name.lower() if p else "", (None, None))
        source = f"{hub_id}'s published config" if hub_id else f"assumed ViT-L/14: no config.json at {path}"
        arch = arch or _L14
        conf = CLIPConfig(text_config=arch["text"], vision_config=arch["vision"], projection_dim=arch["projection_dim"])
        conf.dtype = torch.float32  # the openai / laion checkpoints are stored in fp32
    return _count(lambda: CLIPModel(conf)), _dtype_bytes(conf.dtype), conf.projection_dim, source


def vlm_size(model) -> tuple[int, int, str]:
    """``(parameters, bytes per parameter, where the size came from)`` of an image-text-to-text checkpoint (the vqa
    reward's): from its ``config.json`` (a local directory, or a Hub id in the Hugging Face cache), else
    Qwen2.5-VL-7B-Instruct's published config, said in the note."""
    from transformers import AutoModelForImageTextToText

    conf, source = vlm_config(model)
    return _count(lambda: AutoModelForImageTextToText.from_config(conf)), _dtype_bytes(conf.dtype), source


def local_config(model):
    """The transformers config of ``model``'s ``config.json``, a local directory's or a Hub id's in the Hugging Face
    cache, or None when neither is here."""
    from transformers import AutoConfig

    value, found = str(model or ""), None
    if value and (Path(value).expanduser() / "config.json").is_file():
        found = Path(value).expanduser() / "config.json"
    elif is_repo_id(value):  # else not a Hub id at all: the model's own check says so in one line
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(value, "config.json")
        found = Path(cached) if isinstance(cached, str) else None
    return None if found is None else AutoConfig.from_pretrained(found.parent)


def vlm_config(model):
    """``(config, where it came from)`` of the vqa reward's judge, as :func:`vlm_size` finds it."""
    from transformers import Qwen2_5_VLConfig

    conf = local_config(model)
    if conf is not None:
        return conf, f"{model}'s config.json"
    conf = Qwen2_5_VLConfig(**QWEN25_VL_7B)
    conf.dtype = torch.bfloat16
    return conf, f"assumed Qwen2.5-VL-7B-Instruct: no config.json of {model or 'the model'} here"


# facebook/dinov2-large's published config.json (fp32), the diversity features' backbone the docs name
DINOV2_LARGE = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, image_size=518, patch_size=14)


def features_model(source: str | None, images: int = 16) -> RewardModel | None:
    """What ``grpo.diversity_features`` holds (rewards/image_features.py): nothing for ``pixels``, else the
    backbone whole on every GPU, sized from its config.json, or as DINOv2-L when it is not here, and its forward over
    a rank's ``images`` (:func:`features_scoring`); None when off."""
    if source is None:
        return None
    if source == "pixels":
        return RewardModel("diversity_features", "none", 0, 0, "pixels: no model")
    from transformers import AutoModel, Dinov2Config

    conf, said = local_config(source), f"{source}'s config.json"
    if conf is None:
        conf, said = Dinov2Config(**DINOV2_LARGE), f"assumed DINOv2-L: no config.json of {source} here"
        conf.dtype = torch.float32
    n, b = _count(lambda: AutoModel.from_config(conf)), _dtype_bytes(conf.dtype)
    note = f"backbone {n / 1e6:.0f}M, {b} bytes/param ({said})"
    scoring = features_scoring(conf, images)
    if scoring is None:
        note += f"; its forward not estimated (model_type {conf.model_type}; the plan counts {', '.join(VIT_FEATURES)})"
    else:
        note += f"; forward over {images} images at {FEATURES_SIDE} px: {scoring / 2**30:.2f} GiB"
    return RewardModel("diversity_features", "gpu", n, n * b, note, n * b, scoring or 0)


# the diversity backbones whose forward the plan counts (model_type): plain ViTs with a class token (and registers)
VIT_FEATURES = ("dinov2", "dinov2_with_registers", "dinov3_vit")
FEATURES_SIDE = 224  # DINOv2's and DINOv3's image processors resize and crop to 224 x 224


def features_scoring(conf, images: int) -> int | None:
    """Bytes of one ``grpo.diversity_features`` forward's activations, computed from the backbone's config (not
    measured on a GPU), or None outside :data:`VIT_FEATURES`: a rank's ``images`` at once (rewards/
    image_features.py), no gradient, fused attention, each at the processor's :data:`FEATURES_SIDE`: the pixels,
    plus one layer's working set per token (no_grad frees each layer before the next): its hidden state, residual
    and normed input, and the MLP's hidden (gated: gate, up and product; else its input and its activation)."""
    if conf.model_type not in VIT_FEATURES:
        return None
    b, hidden = _dtype_bytes(conf.dtype), conf.hidden_size
    gated = getattr(conf, "use_gated_mlp", False) or getattr(conf, "use_swiglu_ffn", False)
    if hasattr(conf, "mlp_ratio"):  # DINOv2's width; its SwiGLU keeps 2/3 of it, rounded up to 8
        mlp = int(hidden * conf.mlp_ratio)
        mlp = (int(mlp * 2 / 3) + 7) // 8 * 8 if gated else mlp
    else:
        mlp = conf.intermediate_size
    tokens = (FEATURES_SIDE // conf.patch_size) ** 2 + 1 + getattr(conf, "num_register_tokens", 0)
    return images * (3 * FEATURES_SIDE**2 + tokens * (3 * hidden + (3 if gated else 2) * mlp)) * b


# the question's template and chat turns around the image, in tokens: VQAScore's question with a ~20-token prompt
# in Qwen2.5-VL's template is ~45; rows with long prompts or their own questions have more
QUESTION_TOKENS = 64


# the judges whose image tokens the plan counts (model_type): towers that take the image at its own size, and single
# fixed-size towers that neither tile nor split an image; another judge's forward is listed as not estimated
DYNAMIC_TOWERS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")
FIXED_TOWERS = ("gemma3", "paligemma")


def vlm_scoring(conf, batch: int, side: int) -> tuple[int, int] | None:
    """``(bytes, image tokens)`` of one vqa forward's activations, computed from the judge's config (not measured on
    a GPU), or None for a judge outside :data:`DYNAMIC_TOWERS` and :data:`FIXED_TOWERS`: ``batch`` images of
    ``side`` x ``side`` pixels, no gradient, no KV cache (rewards/vqa.py), fused attention (no scores
    materialised). The pixels in the model's dtype, plus the larger of the vision tower's and the language model's
    working set: no_grad frees each layer's tensors before the next, so one layer's hidden state, its residual and
    the MLP's gate, up and product are alive per patch / token (the dense MLP's width). Image tokens: Qwen2/2.5/3-VL's
    ``ceil(side / (patch x merge))^2`` (the processor rounds, and its own max_pixels may lower it: this is the
    larger), a fixed-size tower's (Gemma 3, PaliGemma) ``mm_tokens_per_image`` or else its ``(image_size /
    patch)^2`` patches."""
    if conf.model_type not in DYNAMIC_TOWERS + FIXED_TOWERS:
        return None
    vision, text, b = conf.vision_config, conf.get_text_config(), _dtype_bytes(conf.dtype)
    patch = vision.patch_size
    if conf.model_type in DYNAMIC_TOWERS:
        merge = vision.spatial_merge_size
        tokens = math.ceil(side / (patch * merge)) ** 2
        patches, pixel_elements = tokens * merge**2, tokens * merge**2 * 3 * patch**2 * vision.temporal_patch_size
    else:  # a fixed-size tower: the processor resizes to its image_size
        patches = (vision.image_size // patch) ** 2
        tokens, pixel_elements = getattr(conf, "mm_tokens_per_image", patches), 3 * vision.image_size**2
    # Qwen2-VL's tower width is its embed_dim (its hidden_size is the merger's output) and its MLP embed_dim x mlp_ratio
    v_hidden = getattr(vision, "embed_dim", None) or vision.hidden_size
    v_mlp = getattr(vision, "intermediate_size", None) or int(v_hidden * vision.mlp_ratio)
    tower = patches * (2 * v_hidden + 3 * v_mlp) * b
    language = (tokens + QUESTION_TOKENS) * (2 * text.hidden_size + 3 * text.intermediate_size) * b
    embedded = tokens * text.hidden_size * b  # the tower's output, alive while the language model runs
    return batch * (pixel_elements * b + max(tower, language + embedded)), tokens


def _size(name: str, args: dict) -> tuple[int, int, int, str]:
    """(parameters, bytes, bytes loaded memory-mapped, note) of a FrozenModel reward."""
    if name == "vqa":
        n, b, source = vlm_size(args.get("model"))
        return n, n * b, n * b, f"VLM {n / 1e9:.2f}B, {b} bytes/param ({source})"
    if name == "lpips":
        import lpips

        net = args.get("net", "alex")
        n = _count(lambda: lpips.LPIPS(net=net, pretrained=True, pnet_rand=True, verbose=False))
        return n, 4 * n, 0, f"{net} backbone + linear heads, fp32"  # built, then load_state_dict: copies
    clip_path = args.get("clip_model" if name == "aesthetic" else "model", "")
    n, b, dim, source = clip_size(clip_path)
    dtype = {4: "fp32", 2: "16-bit"}.get(b, f"{b} bytes")
    if name != "aesthetic":
        return n, n * b, n * b, f"CLIP {n / 1e6:.1f}M {dtype} ({source})"
    from ..rewards.clip import AestheticHead

    head = _count(lambda: AestheticHead(dim))
    note = f"CLIP {n / 1e6:.1f}M {dtype} ({source}) + MLP head {head / 1e6:.2f}M fp32"
    return n + head, n * b + head * 4, n * b, note


def _vqa_scoring(args: dict, side: int) -> tuple[int, str]:
    """(bytes, note) of one vqa forward's activations: ``batch_size`` images (the reward's default 8) at its
    ``image_size`` or else the rendered ``side``."""
    from ..rewards.vqa import VQAReward

    defaults = {key: p.default for key, p in inspect.signature(VQAReward).parameters.items()}  # the reward's own
    batch = int(args.get("batch_size", defaults["batch_size"]))
    side = int(args.get("image_size", defaults["image_size"])) or side
    conf = vlm_config(args.get("model"))[0]
    scoring = vlm_scoring(conf, batch, side)
    if scoring is None:  # a judge that tiles, splits or pools its images in its own way
        known = ", ".join(DYNAMIC_TOWERS + FIXED_TOWERS)
        return 0, f"; its scoring forward not estimated (model_type {conf.model_type}; the plan counts {known})"
    nbytes, tokens = scoring
    return nbytes, f"; scoring {batch} images of {side} px ({tokens} image tokens each): {nbytes / 2**30:.2f} GiB"


def reward_models(
    rewards, image_side: int = 1024, diversity_features: str | None = None, images_per_rank: int = 16
) -> list[RewardModel]:
    """What each entry of ``rewards`` (a list of RewardSpec: ``.name``, ``.args``) holds, in order, then
    ``grpo.diversity_features``' backbone (:func:`features_model`); ``image_side``: the longer side of the rendered
    images (``rollout.height`` / ``width``), what the vqa judge reads; ``images_per_rank``: a rank's images of a step,
    what the features backbone reads at once."""
    out = []
    for spec in rewards:
        name, args = spec.name, dict(spec.args or {})
        if name in FROZEN_MODEL_REWARDS:
            n, nbytes, mapped, note = _size(name, args)
            where = "offload" if args.get("offload") else "gpu"
            if where == "offload":
                note += "; offload: on the host, on the GPU only while scoring"
            scoring, said = _vqa_scoring(args, image_side) if name == "vqa" else (0, "")
            out.append(RewardModel(name, where, n, nbytes, note + said, mapped, scoring))
        elif name in ("ocr", "ocr_word_accuracy", "ocr_region_ned"):
            out.append(
                RewardModel(name, "cpu", 0, 0, "RapidOCR onnxruntime on the CPU (in the host allowance), 0 on the GPU")
            )
        elif name == "remote":
            out.append(
                RewardModel(name, "remote", 0, 0, f"0 on this GPU (scored by the server at {args.get('url', '?')})")
            )
        elif name in NO_MODEL_REWARDS:
            out.append(RewardModel(name, "none", 0, 0, "no model"))
        else:
            out.append(RewardModel(name, "none", 0, 0, "plugin: not counted (its memory is unknown to the planner)"))
    features = features_model(diversity_features, images_per_rank)
    return out if features is None else [*out, features]

"""CLIP-family rewards from transformers checkpoints: ``model`` is a local directory holding ``config.json`` +
weights, a tokenizer and an image-processor config, or a Hub id (downloaded once into the Hugging Face cache unless
``HF_HUB_OFFLINE=1``); each is checked before any model loads (``check_args``, rewards/model_files.py):

* ``clip``: cosine similarity between the image and the prompt (CLIP score / 100), in [-1, 1].
  Weights: e.g. ``openai/clip-vit-large-patch14`` saved with ``save_pretrained``.
* ``preference``: a CLIP-style preference model, reward = logit_scale.exp() * cosine, i.e. the
  logit the model was trained to rank with. PickScore (``yuvalkirstain/PickScore_v1``, a CLIPModel
  fine-tune; processor from ``laion/CLIP-ViT-H-14-laion2B-s32B-b79K``) loads directly; HPS v2 ships
  as an open_clip checkpoint and must be converted to transformers' CLIPModel format first.
* ``aesthetic``: the LAION "improved aesthetic predictor" MLP on L2-normalised CLIP image
  embeddings. ``clip_model``: the CLIP checkpoint it was trained on (ViT-L/14 for
  ``sac+logos+ava1-l14-linearMSE.pth``); ``head``: that ``.pth`` (state dict with ``layers.0`` ..
  ``layers.7``) or a ``.safetensors`` with the same keys.

All take ``offload`` (keep on CPU between calls). Images are resized (shortest edge, bicubic,
antialiased), center-cropped and normalised on their own device, batched - no PIL round trip.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from .base import FrozenModel, frozen_pretrained
from .model_files import AESTHETIC_HEAD_URL, CLIP_L14, check_file, check_transformers_model
from .registry import RewardError

PICKSCORE = "yuvalkirstain/PickScore_v1"


class CLIPScorer:
    """Image and text embeddings of a local CLIPModel checkpoint."""

    def __init__(self, model: str, offload: bool = False):
        from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

        self.model, path = frozen_pretrained(CLIPModel, model, "CLIP model", offload)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        proc = AutoImageProcessor.from_pretrained(path)
        size = proc.size.get("shortest_edge") or min(proc.size.get("height", 224), proc.size.get("width", 224))
        crop = (
            proc.crop_size
            if getattr(proc, "do_center_crop", True) and proc.crop_size
            else {"height": size, "width": size}
        )
        self.size, self.crop = int(size), (int(crop["height"]), int(crop["width"]))
        self.mean = torch.tensor(proc.image_mean).view(1, 3, 1, 1)
        self.std = torch.tensor(proc.image_std).view(1, 3, 1, 1)

    def pixel_values(self, images: torch.Tensor) -> torch.Tensor:
        n, _, h, w = images.shape
        scale = self.size / min(h, w)
        resized = F.interpolate(
            images.float(),
            size=(max(1, round(h * scale)), max(1, round(w * scale))),
            mode="bicubic",
            antialias=True,
            align_corners=False,
        ).clamp(0, 1)
        top, left = (resized.shape[2] - self.crop[0]) // 2, (resized.shape[3] - self.crop[1]) // 2
        cropped = resized[:, :, top : top + self.crop[0], left : left + self.crop[1]]
        return (cropped - self.mean.to(images.device)) / self.std.to(images.device)

    def image_embeds(self, images: torch.Tensor) -> torch.Tensor:
        """``[N, D]`` L2-normalised image embeddings."""
        with self.model.on(images.device) as m:
            emb = m.get_image_features(pixel_values=self.pixel_values(images)).pooler_output
        return F.normalize(emb.float(), dim=-1)

    def text_embeds(self, prompts: list[str], device) -> torch.Tensor:
        with self.model.on(device) as m:
            max_len = m.config.text_config.max_position_embeddings
            tok = self.tokenizer(prompts, padding=True, truncation=True, max_length=max_len, return_tensors="pt").to(
                device
            )
            emb = m.get_text_features(input_ids=tok["input_ids"], attention_mask=tok["attention_mask"]).pooler_output
        return F.normalize(emb.float(), dim=-1)

    def logit_scale(self) -> float:
        return float(self.model.module.logit_scale.exp())


class CLIPReward:
    @staticmethod
    def check_args(args: dict) -> None:
        check_transformers_model("model", args.get("model"), "clip", CLIP_L14)

    def __init__(self, model: str = "", offload: bool = False):
        self.scorer = CLIPScorer(model, offload)

    def __call__(self, images, prompts, samples):
        return (self.scorer.image_embeds(images) * self.scorer.text_embeds(prompts, images.device)).sum(-1)


class PreferenceReward(CLIPReward):
    @staticmethod
    def check_args(args: dict) -> None:
        check_transformers_model("model", args.get("model"), "preference", PICKSCORE)

    def __call__(self, images, prompts, samples):
        return self.scorer.logit_scale() * super().__call__(images, prompts, samples)


class AestheticHead(torch.nn.Module):
    """LAION improved-aesthetic-predictor MLP (indices match its state-dict keys)."""

    def __init__(self, dim: int):
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(dim, 1024),
            torch.nn.Dropout(0.2),
            torch.nn.Linear(1024, 128),
            torch.nn.Dropout(0.2),
            torch.nn.Linear(128, 64),
            torch.nn.Dropout(0.1),
            torch.nn.Linear(64, 16),
            torch.nn.Linear(16, 1),
        )

    def forward(self, x):
        return self.layers(x)


def load_aesthetic_head(path) -> AestheticHead:
    p = Path(path) if path else None
    if p is None or not p.is_file():
        raise ValueError(f"aesthetic head {path!r} not found (a .pth or .safetensors state dict)")
    if p.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(p)
    else:
        state = torch.load(p, map_location="cpu", weights_only=True)
    head = AestheticHead(state["layers.0.weight"].shape[1])
    head.load_state_dict(state)
    return head


class AestheticReward:
    @staticmethod
    def check_args(args: dict) -> None:
        problems = []  # both files at once: a first day misses both
        for check in (
            lambda: check_transformers_model("clip_model", args.get("clip_model"), "aesthetic", CLIP_L14),
            lambda: check_file("head", args.get("head"), "aesthetic", AESTHETIC_HEAD_URL),
        ):
            try:
                check()
            except RewardError as err:
                problems.append(str(err))
        if problems:
            raise RewardError("; ".join(problems[:1] + [p.removeprefix("reward aesthetic: ") for p in problems[1:]]))

    def __init__(self, clip_model: str = "", head: str = "", offload: bool = False):
        self.scorer = CLIPScorer(clip_model, offload)
        mlp = load_aesthetic_head(head)
        width, dim = mlp.layers[0].in_features, self.scorer.model.module.config.projection_dim
        if width != dim:  # else a matmul error at the first step, taken for a failing reward and the run going on
            raise RewardError(
                f"reward aesthetic: head {head} takes {width}-wide embeddings but clip_model {clip_model} gives {dim}: "
                "give the head made for this CLIP model (LAION's for ViT-L/14: 768)"
            )
        self.head = FrozenModel(mlp, offload)

    def __call__(self, images, prompts, samples):
        emb = self.scorer.image_embeds(images)
        with self.head.on(images.device) as h:
            return h(emb).reshape(-1)

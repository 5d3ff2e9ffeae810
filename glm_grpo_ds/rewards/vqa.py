"""``vqa``: VQAScore (Lin et al., "Evaluating Text-to-Visual Generation with Image-to-Text Generation", 2024), the
probability that a vision-language model answers "Yes" when asked whether the image shows the prompt:

    P("Yes" | image, 'Does this figure show "{prompt}"? Please answer yes or no.')

read from the model's next-token distribution after the chat template's assistant turn (a softmax over the whole
vocabulary of the answer's first token), in [0, 1]. It judges what CLIP cannot: counts, positions, attributes bound
to the right object, the text an image should carry.

``model``: any checkpoint transformers loads with ``AutoModelForImageTextToText`` and ``AutoProcessor`` whose
processor has a chat template (Qwen2-VL / Qwen2.5-VL / Qwen3-VL, LLaVA-OneVision, Gemma 3, InternVL, ...), a local
directory or a Hub id, loaded in the checkpoint's own dtype. ``question``: the template (``{prompt}`` is the prompt),
``answer``: the word whose first token is scored, ``batch_size``: images per forward, ``image_size``: the longer
side the images are resized to first (0: as rendered), ``offload``: keep the model on the CPU between calls. The
images reach the processor as tensors in [0, 1] on their own device (no PIL round trip), one list per prompt; the
prompts are padded on the left, so every row's last position is its own assistant turn.
Tested on tiny random Qwen2-VL and Gemma 3 models (glm_grpo_ds/testing/tiny_vlm.py).

A prompt row may carry its own yes/no questions (a JSONL field ``questions``: a list, e.g. TIFA's or Davidsonian
Scene Graph's questions for that prompt): its image's reward is then the mean probability of "Yes" over them, each
asked as it is written; rows without one are asked the template.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from .base import frozen_pretrained
from .model_files import check_transformers_model
from .registry import RewardError

QWEN25_VL_7B = "Qwen/Qwen2.5-VL-7B-Instruct"  # the judge the docs name
QUESTION = 'Does this figure show "{prompt}"? Please answer yes or no.'  # VQAScore's own question


def has_chat_template(directory: Path) -> bool:
    """Whether checkpoint ``directory`` holds a chat template where transformers looks for one: a file of its own
    (``chat_template.jinja``, ``chat_template.json``) or a ``chat_template`` in the tokenizer's or processor's
    config."""
    if any((directory / name).is_file() for name in ("chat_template.jinja", "chat_template.json")):
        return True
    for name in ("tokenizer_config.json", "processor_config.json"):
        try:
            if json.loads((directory / name).read_text(encoding="utf-8")).get("chat_template"):
                return True
        except (OSError, ValueError, AttributeError):  # absent, or not a JSON object: no template there
            continue
    return False


class VQAReward:
    @staticmethod
    def check_args(args: dict) -> None:
        check_transformers_model("model", args.get("model"), "vqa", QWEN25_VL_7B)
        local = Path(str(args["model"])).expanduser()
        if local.is_dir() and not has_chat_template(local):  # before the job queues (train --check), not at startup
            raise RewardError(
                f"reward vqa: model {args['model']} has no chat template (no chat_template.jinja / .json, none in "
                "its tokenizer or processor config); use an instruction-tuned vision-language model"
            )
        question = args.get("question", QUESTION)
        if "{prompt}" not in str(question):
            raise RewardError(f"reward vqa: question {question!r} has no {{prompt}}: the prompt would not be asked")
        if int(args.get("batch_size", 1)) < 1:
            raise RewardError(f"reward vqa: batch_size {args.get('batch_size')} must be >= 1")
        if int(args.get("image_size", 0)) < 0:
            raise RewardError(f"reward vqa: image_size {args.get('image_size')} must be >= 0 (0: as rendered)")

    def __init__(
        self,
        model: str = "",
        question: str = QUESTION,
        answer: str = "Yes",
        batch_size: int = 8,
        image_size: int = 0,
        offload: bool = False,
    ):
        from transformers import AutoModelForImageTextToText, AutoProcessor

        self.model, path = frozen_pretrained(AutoModelForImageTextToText, model, "vqa model", offload)
        self.processor = AutoProcessor.from_pretrained(path)
        if not getattr(self.processor, "chat_template", None):  # a base checkpoint: refused now, not at its first score
            raise RewardError(f"reward vqa: {model}'s processor has no chat template; use an instruction-tuned model")
        self.processor.tokenizer.padding_side = "left"  # the last position of every row is its assistant turn
        ids = self.processor.tokenizer.encode(answer, add_special_tokens=False)
        if not ids:
            raise RewardError(f"reward vqa: answer {answer!r} is no token of {model}'s tokenizer")
        self.answer_id, self.question, self.batch_size = ids[0], question, int(batch_size)
        self.image_size = int(image_size)

    def texts(self, prompts: list[str], asked: list[str] | None = None) -> list[str]:
        """Each question in the model's chat template, up to the assistant's first token: the ``question`` template
        filled with each prompt, or the questions ``asked`` as they are."""
        questions = asked if asked is not None else self.asked(prompts, None)[1]
        return [
            self.processor.apply_chat_template(
                [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]}],
                add_generation_prompt=True,
                tokenize=False,
            )
            for q in questions
        ]

    def asked(self, prompts: list[str], samples) -> tuple[list[int], list[str]]:
        """``(image index, question)`` of every question to ask: a row's own ``questions`` (a JSONL field: a list of
        yes/no questions, TIFA's or Davidsonian Scene Graph's), each asked of its image, else the filled template."""
        which, questions = [], []
        for i, prompt in enumerate(prompts):
            own = (samples[i] or {}).get("questions") if samples else None
            if own is None:
                own = [self.question.format(prompt=prompt)]
            elif not (isinstance(own, list) and own and all(isinstance(q, str) and q.strip() for q in own)):
                row = (samples[i] or {}).get("index", i)
                raise RewardError(
                    f"reward vqa: row {row}'s questions must be a non-empty list of questions, got {own!r}"
                )
            which += [i] * len(own)
            questions += own
        return which, questions

    def resized(self, images: torch.Tensor) -> torch.Tensor:
        """``images`` with their longer side ``image_size`` (bicubic, antialiased; the aspect kept), or as they are
        (0): a judge's cost grows with its image tokens, over 1,200 for a 1024² image in Qwen2.5-VL, 256 at 448."""
        h, w = images.shape[-2:]
        if not self.image_size or max(h, w) == self.image_size:
            return images
        scale = self.image_size / max(h, w)
        size = (max(1, round(h * scale)), max(1, round(w * scale)))
        return F.interpolate(images.float(), size=size, mode="bicubic", antialias=True, align_corners=False)

    def inputs(self, images: torch.Tensor, texts: list[str]):
        """The processor's batch of ``texts``, one image each (a list per prompt: Gemma 3's and others' processors
        read a flat list as one prompt's images), tokenized as transformers' own ``apply_chat_template`` tokenizes a
        template's text: without a second BOS when the template wrote one."""
        bos = self.processor.tokenizer.bos_token
        return self.processor(
            text=texts,
            images=[[image] for image in images.float().clamp(0, 1)],
            padding=True,
            return_tensors="pt",
            do_rescale=False,  # already in [0, 1]
            add_special_tokens=not (bos and texts[0].startswith(bos)),
        )

    def __call__(self, images: torch.Tensor, prompts: list[str], samples=None) -> torch.Tensor:
        which, questions = self.asked(prompts, samples)
        texts, out = self.texts(prompts, questions), []
        images = self.resized(images)
        with self.model.on(images.device) as vlm:
            for i in range(0, len(texts), self.batch_size):
                chunk = slice(i, i + self.batch_size)
                inputs = self.inputs(images[which[chunk]], texts[chunk])
                inputs = inputs.to(device=images.device, dtype=vlm.dtype)  # floating tensors only: the pixels
                # no KV cache: one forward reads one position; a cache would hold every layer's keys and values
                logits = vlm(**inputs, logits_to_keep=1, use_cache=False).logits[:, -1]
                out.append(logits.float().softmax(-1)[:, self.answer_id])
        index = torch.tensor(which, device=images.device)  # each image's mean over its questions
        total = torch.zeros(len(prompts), device=images.device).index_add_(0, index, torch.cat(out))
        return total / torch.bincount(index, minlength=len(prompts)).float()

"""``glm-grpo score``: score your own images with a reward before training on it.

    glm-grpo score --reward ocr --prompt "a sign that says 'OPEN'" --image a.png b.png
    glm-grpo score --reward lpips --reward-arg net=vgg --prompt "a cat" --image out.png --target ref.png
    glm-grpo score --reward clip --reward-arg model=/models/clip-vit-large-patch14 --prompt "a cat" --image *.png

Prints one number per image, one per line, in the order given (``nan`` = undefined for that image). Images of one
size are scored as one batch, as training scores them; a reward that does not return one value per image of a batch
is a one-line error.
``--text`` sets the text to render (else the prompt's quoted spans). Each image's sample holds ``target_image``
(``--target`` or None), ``text`` (``--text`` or None) and ``index`` 0, none of a prompt file's other keys. A reward
that needs what the command line does not give (``--target`` for pixel_mse / ssim / lpips; ``--text`` or a quoted
span in the prompt for ocr) is a one-line error, exit 2, and so is a remote reward whose server did not score.
"""

from __future__ import annotations

import os
import sys

from .cli import parser_for

# a sample field a reward needs (rewards/base.py SampleNeed) -> how to give it on this command line
SUPPLY = {
    "target_image": "pass --target IMAGE",
    "text": "pass --text TEXT, or quote the text in --prompt",
}


def parse_reward_arg(item: str):
    """``key=value`` of ``--reward-arg`` -> (key, value parsed like a config scalar)."""
    from ..config import parse_scalar
    from ..config.yaml_file import plain

    if "=" not in item:
        raise ValueError(f"--reward-arg {item!r} must look like key=value")
    key, value = item.split("=", 1)
    return key, plain(parse_scalar(value))  # `k=` null, as a reward's args in a file


def read_image(path: str):
    """``[3, H, W]`` float in [0, 1]: upright, transparency over white, as targets are read."""
    from PIL import Image

    from ..rewards.targets import as_rgb, rgb_tensor

    try:
        img = as_rgb(Image.open(path))
    except OSError as err:
        raise ValueError(f"cannot read image {path}: {err}") from None
    return rgb_tensor(img).float().div(255)


def main(argv: list[str] | None = None) -> int:
    p = parser_for("score")
    p.add_argument("--reward", required=True, help="built-in name or python:module:function / file.py:function")
    p.add_argument("--reward-arg", action="append", default=[], help="key=value argument of the reward (repeatable)")
    p.add_argument("--prompt", required=True, help="the prompt the images were made for")
    p.add_argument("--image", nargs="+", required=True, help="image files to score (one number each, in order)")
    p.add_argument("--target", help="target image for likeness rewards (lpips, ssim, pixel_mse)")
    p.add_argument("--text", help="text to render (ocr); default: the prompt's quoted spans")
    a = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import torch

        from ..rewards import build_reward, reward_needs
        from ..rewards.base import reward_values
        from ..rewards.remote.client import RemoteRewardError

        # the keys training gives every sample (data/rows.py PromptRow.reward_sample); the one prompt is row 0
        sample = {"target_image": a.target, "text": a.text, "index": 0}
        if a.target and not os.path.isfile(a.target):
            raise ValueError(f"--target {a.target} does not exist")
        # Checked before the reward is built (it may load a model): every image would score nan.
        args = dict(parse_reward_arg(x) for x in a.reward_arg)
        need = reward_needs(a.reward, args)
        if need is not None and not need.present(a.prompt, sample):
            how = SUPPLY.get(need.field, "glm-grpo score cannot supply it; score it in a training run's data")
            raise ValueError(f"reward {a.reward} needs {need.field}: {how}")
        fn = build_reward(a.reward, args)
        images = [read_image(path) for path in a.image]
        by_size: dict[tuple, list[int]] = {}  # a batch per image size, as training scores a batch of N images
        for i, x in enumerate(images):
            by_size.setdefault(tuple(x.shape), []).append(i)
        values = [0.0] * len(images)
        for rows in by_size.values():
            batch = torch.stack([images[i] for i in rows])
            samples = [dict(sample) for _ in rows]  # a dict each, as in training
            scored = reward_values(a.reward, fn(batch, [a.prompt] * len(rows), samples), len(rows))
            for i, value in zip(rows, scored.tolist()):  # None / inf: nan (undefined)
                values[i] = value
        if max(len(rows) for rows in by_size.values()) == 1:  # a reward that scores one image, never a batch
            reward_values(
                a.reward, fn(torch.stack([images[0]] * 2), [a.prompt] * 2, [dict(sample) for _ in range(2)]), 2
            )
        for value in values:
            print(f"{value:.6g}")
    except (ValueError, RemoteRewardError) as err:  # RemoteRewardError: the server did not score the images
        print(f"glm-grpo score: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

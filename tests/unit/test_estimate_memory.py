"""`glm-grpo estimate-memory` as a user runs it (in-process, the real GLM-Image sizes from the built-in
configs): every default in --help, the reward models in the printed plan, exit 3 when the plan does not
fit unless --allow-over-budget, exit 2 on a bad config."""

import argparse
import json
from pathlib import Path

from glm_grpo_ds.commands import estimate_memory

ROOT = Path(__file__).resolve().parents[2]
RUN = [
    "--config",
    str(ROOT / "launch/configs/glm_image_lora_zero3.yaml"),
    "--deepspeed",
    str(ROOT / "ds_configs/zero3.json"),
]


def test_help_shows_every_default():
    """Every option with a default says it in --help (store_true flags: "off")."""
    ap = estimate_memory.build_parser()
    text = " ".join(ap.format_help().split())
    with_defaults = [
        a for a in ap._actions if a.option_strings and a.default not in (None, argparse.SUPPRESS) and a.dest != "help"
    ]
    assert {a.dest for a in with_defaults} == {
        "num_gpus",
        "num_nodes",
        "gpu_memory_gb",
        "prompt_tokens",
        "device",
        "json",
        "allow_over_budget",
    }
    for action in with_defaults:
        shown = "off" if action.default is False else str(action.default)
        assert f"{action.option_strings[0]}" in text and f"(default: {shown}" in " ".join(
            (action.help % {"default": action.default} if "%(default)" in action.help else action.help).split()
        ), action.dest
    assert "(default: 8)" in text and "(default: 80.0)" in text and "(default: 128)" in text


def test_fits_exit_0_and_names_the_reward_models(capsys):
    assert estimate_memory.main(RUN + ["--num-gpus", "8"]) == 0
    out, err = capsys.readouterr()
    assert "WARNING" not in err
    # the LoRA config's rewards: ocr on the CPU, aesthetic's CLIP ViT-L/14 + head on every GPU
    assert "reward models (the config's rewards" in out and "cpu: RapidOCR" in out
    assert "aesthetic" in out and "CLIP 427.6M fp32" in out and "whole on every GPU: aesthetic" in out


def test_over_budget_exits_3_unless_allowed(capsys):
    assert estimate_memory.main(RUN + ["--gpu-memory-gb", "10", "--json"]) == estimate_memory.OVER_BUDGET == 3
    out, err = capsys.readouterr()
    obj = json.loads(out)
    assert (
        obj["fits"] is False
        and obj["headroom_bytes"] < 0
        and [r["name"] for r in obj["rewards"]]
        == [
            "ocr",
            "aesthetic",
        ]
    )
    assert "WARNING: the plan needs" in err and "exit 3" in err
    assert estimate_memory.main(RUN + ["--gpu-memory-gb", "10", "--allow-over-budget"]) == 0
    assert "WARNING: the plan needs" in capsys.readouterr().err


def test_bad_config_exits_2(capsys):
    assert estimate_memory.main(RUN + ["lora.alfa=4"]) == 2
    err = capsys.readouterr().err
    assert "did you mean" in err and "Traceback" not in err

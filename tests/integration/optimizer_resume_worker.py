"""One CPU process: real DeepSpeed engines (ZeRO-2 and ZeRO-3; torch AdamW and bitsandbytes AdamW8bit as the client
optimizer, which ZeRO wraps) around a small linear model, trained 2 steps with one ``optimizer`` section,
checkpointed, then loaded into an engine built with another. Prints one JSON line: per case, what the loaded engine
steps with when DeepSpeed's ``load_checkpoint`` alone ran (``restored``) and after glm_grpo_ds/ds/io.py's
``load_ds_checkpoint`` (``applied``). Run by tests/integration/test_checkpoint_resume.py::
test_zero_engines_step_with_the_resumed_launchs_optimizer_settings.

    python tests/integration/optimizer_resume_worker.py OUT_DIR
"""

import json
import sys
from pathlib import Path

import torch

from glm_grpo_ds.config import OptimizerConfig
from glm_grpo_ds.ds import engine as ds_engine
from glm_grpo_ds.ds import io as ds_io

OLD = dict(lr=3e-3, warmup_steps=4, max_grad_norm=1.0)
NEW = dict(lr=1e-3, betas=[0.8, 0.99], eps=1e-6, weight_decay=0.1, warmup_steps=4, max_grad_norm=0.5)


def _engine(stage: int, opt_cfg):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64))  # 4096 weights: bitsandbytes keeps 8-bit states
    ds_config = {
        "train_micro_batch_size_per_gpu": 1,
        "train_batch_size": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": opt_cfg.max_grad_norm,  # what ds/ds_config.fill_ds_config writes
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    return ds_engine.initialize(model, ds_config, opt_cfg, total_optimizer_steps=10)


def _train(engine, steps: int) -> None:
    for _ in range(steps):
        loss = engine(torch.randn(1, 64)).pow(2).mean()
        engine.backward(loss)
        engine.step()


def _seen(engine) -> dict:
    group = engine.optimizer.param_groups[0]
    return {
        "lr": ds_engine.current_lr(engine),
        "betas": list(group["betas"]),
        "eps": group["eps"],
        "weight_decay": group["weight_decay"],
        "base_lrs": engine.lr_scheduler.base_lrs,
        "last_epoch": engine.lr_scheduler.last_epoch,
        "clip_grad": getattr(engine.optimizer, "clip_grad", None),
    }


def main(out: Path) -> None:
    ds_engine.init_distributed()
    report = {}
    for stage in (2, 3):
        for name in ("adamw", "adamw_8bit"):
            old, new = OptimizerConfig(name=name, **OLD), OptimizerConfig(name=name, **NEW)
            ckpt = out / f"zero{stage}_{name}"
            trained = _engine(stage, old)
            _train(trained, 2)
            ds_io.save_ds_checkpoint(trained, ckpt)
            restored = _engine(stage, new)
            restored.load_checkpoint(str(ckpt), tag=ds_io.DS_TAG, custom_load_fn=ds_io._load_module)
            applied = _engine(stage, new)
            ds_io.load_ds_checkpoint(applied, ckpt, new)
            report[f"zero{stage}_{name}"] = {"restored": _seen(restored), "applied": _seen(applied)}
    print(json.dumps(report))


if __name__ == "__main__":
    main(Path(sys.argv[1]))

"""Runs inside DeepSpeed CPU ranks (launched by tests/integration/test_model_source.py): resolve a
model.path through the trainer's collective resolution and write what this rank got.

    deepspeed --num_gpus 2 tests/integration/hub_worker.py OUT_DIR NAME [--rank1-cache DIR]

``--rank1-cache``: rank 1 uses this Hugging Face cache instead of HF_HUB_CACHE (two nodes whose caches
are not shared). Writes OUT_DIR/rank<R>.json: the ModelSource record, or {"error": message}.
"""

import argparse
import json
import os
import sys
from pathlib import Path

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("name")
p.add_argument("--rank1-cache")
p.add_argument("--local_rank", type=int)  # added by the deepspeed launcher
args = p.parse_args()
if args.rank1_cache and os.environ.get("RANK") == "1":
    os.environ["HF_HUB_CACHE"] = args.rank1_cache  # before huggingface_hub reads it (at import)

from glm_grpo_ds.ds import dist  # noqa: E402
from glm_grpo_ds.ds import engine as ds_engine  # noqa: E402
from glm_grpo_ds.model.source import ModelSourceError, resolve_for_training  # noqa: E402

rank = ds_engine.init_distributed()[0]
out = Path(args.out) / f"rank{rank}.json"
try:
    source = resolve_for_training(args.name, None, rank)
except ModelSourceError as err:
    out.write_text(json.dumps({"error": str(err)}))
    dist.shutdown(agreed=False)
    sys.exit(2)
out.write_text(json.dumps(source.record()))
dist.shutdown()

"""The one list of ``glm-grpo`` subcommands (:data:`SUBCOMMANDS`): what each runs, its one-line help, its
synopsis, its description and example. ``glm-grpo --help``, each ``glm-grpo NAME --help`` and the table of
docs/commands.md are all made from it (commands/cli.py); a new command is one entry here.
"""

from __future__ import annotations

from ..profiling.tools import PROFILE_TOOLS
from ..runtime.cli_help import Command as Subcommand

SUBCOMMANDS: dict[str, Subcommand] = {
    "train": Subcommand(
        "glm_grpo_ds.train",
        "GRPO training (one process; use the deepspeed launcher for more)",
        usage=(
            "glm-grpo train --config CFG --deepspeed DS.json [--check [--num-gpus N] [--num-nodes N] [--hostfile F] "
            "[--gpu-memory-gb G] [--device cuda\\|cpu]] [--debug] [--log-level info] [key=value ...]"
        ),
        doc=(
            "one-process training (same as `python -m glm_grpo_ds.train`; several processes: `deepspeed "
            "--module glm_grpo_ds.train`, see [training.md](training.md))"
        ),
        example=(
            "glm-grpo train --config launch/configs/tiny_cpu.yaml --deepspeed ds_configs/zero2.json "
            "model.path=outputs/tiny"
        ),
    ),
    "estimate-memory": Subcommand(
        "glm_grpo_ds.commands.estimate_memory",
        "per-GPU memory plan of a run before launch (no weights needed)",
        usage=(
            "glm-grpo estimate-memory --config CFG --deepspeed DS.json [--num-gpus 8] [--num-nodes 1] "
            "[--gpu-memory-gb 80] [--prompt-tokens 128] [--device cuda\\|cpu] [--json] [--allow-over-budget] "
            "[key=value ...]"
        ),
        doc=(
            "per-GPU memory plan before launch, from parameter counts (no weights), with the config's reward "
            "models (which are on the GPU, on the CPU, remote) and the host RAM per node; `--help` shows every "
            "default. Its last line names the fastest `ds_configs/*.json` that fits the same run (ZeRO-1/2 before "
            "ZeRO-3, no offload before offload; `fastest_that_fits` in `--json`). Exit 0 when it fits, **3 when it "
            "does not fit in `--gpu-memory-gb`** (plan printed, what to change on stderr; `--allow-over-budget` "
            "exits 0), 2 on a bad config ([memory-and-speed.md](memory-and-speed.md), "
            "[configuration.md](configuration.md#deepspeed-configs-and-auto))"
        ),
        example=(
            "glm-grpo estimate-memory --config launch/configs/glm_image_lora.yaml --deepspeed "
            "ds_configs/zero2.json --num-gpus 8"
        ),
        code="(math: `memory/plan.py`, `memory/reward_models.py`, `memory/host.py`)",
    ),
    "merge": Subcommand(
        "glm_grpo_ds.commands.merge",
        "merge a LoRA adapter into GLM-Image and write a pipeline directory",
        usage="glm-grpo merge --base DIR\\|ID [--revision R] --adapter PATH --out DIR [--dtype bf16\\|fp32\\|fp16]",
        doc=(
            "merge an adapter (or a checkpoint, or a full fine-tuning's `final_model/`) into a complete "
            "GlmImagePipeline directory with a model card; the AR is written in bf16 unless `--dtype` says otherwise, "
            "and a cast that keeps under 90 % of the adapter's change says so "
            "([checkpoints.md](checkpoints.md#merging-and-shipping)); a checkpoint without `adapter/` is read by "
            "DeepSpeed with pickle: merge only checkpoints you trust ([checkpoints.md](checkpoints.md#security))"
        ),
        example="glm-grpo merge --base zai-org/GLM-Image --adapter outputs/run/final_adapter --out outputs/run/merged",
    ),
    "push": Subcommand(
        "glm_grpo_ds.commands.push",
        "upload a run's final weights (+ checkpoint adapters) with their model cards to the Hugging Face Hub",
        usage=(
            "glm-grpo push OUTPUT_DIR [--repo-id NS/NAME] [--private\\|--no-private] [--revision BRANCH] "
            "[--checkpoints\\|--no-checkpoints]"
        ),
        doc=(
            "upload a finished run's final adapter / model (and checkpoint adapters) with their model cards to "
            "the Hugging Face Hub; defaults from the run's `hub` section, so it retries a run that exited 4 "
            "([sharing.md](sharing.md#glm-grpo-push))"
        ),
        example="glm-grpo push outputs/run --repo-id my-org/glm-image-grpo --private",
        code="(cards: `sharing/model_card.py`, uploads: `sharing/hub.py`)",
    ),
    "render": Subcommand(
        "glm_grpo_ds.commands.render",
        "render prompts to PNG files with a GLM-Image pipeline",
        usage=(
            "glm-grpo render --model DIR\\|ID [--revision R] [--adapter DIR] --prompt TEXT [--prompt ...] "
            "[--height H --width W --steps S --guidance G --seed N --dtype auto\\|bf16\\|fp32\\|fp16 --device "
            "D --out DIR] [--overwrite]"
        ),
        doc=(
            "render prompts to PNG with a GLM-Image pipeline; `--adapter`: a LoRA adapter (a run's "
            "`final_adapter/`) loaded onto the AR unmerged, giving the images of the merged pipeline; size, "
            "steps and guidance not given are the model's own (its DiT's `sample_size` x the VAE's scale and "
            "the pipeline's defaults: 1024x1024, 50 steps, guidance 1.5 for GLM-Image; named on stderr); "
            "writes `OUT/000.png`, ... and `OUT/index.jsonl` (file, prompt, seed, settings per image); an OUT "
            "holding an earlier render is refused unless `--overwrite` (which replaces it); dtype auto = bf16 on a GPU"
        ),
        example=(
            'glm-grpo render --model outputs/tiny --adapter outputs/run/final_adapter --prompt "a red cube" '
            "--seed 0 --out outputs/render"
        ),
    ),
    "score": Subcommand(
        "glm_grpo_ds.commands.score",
        "score images with a reward (one number per image)",
        usage=(
            "glm-grpo score --reward NAME [--reward-arg k=v ...] --prompt TEXT --image IMG [IMG ...] [--target "
            "IMG] [--text T]"
        ),
        doc=(
            "score images with a reward, one number per line "
            "([rewards.md](rewards.md#checking-a-reward-before-training))"
        ),
        example="glm-grpo score --reward ocr --prompt \"a sign that says 'OPEN'\" --image a.png b.png",
    ),
    "reward-server": Subcommand(
        "glm_grpo_ds.commands.reward_server",
        "serve a reward over HTTP for the `remote` reward (reward models on other GPUs / nodes)",
        usage=(
            "glm-grpo reward-server --reward NAME [--reward-arg k=v ...] [--host 127.0.0.1] [--port 8000] "
            "[--token-file F] [--max-batch 32] [--max-wait-ms 5] [--max-request-mb 1024] [--target-cache-mb 4096] "
            "[--device auto] [--log-level info]"
        ),
        doc=(
            "serve a built-in or plugin reward over HTTP for the `remote` reward of runs on other GPUs / "
            "nodes; concurrent requests batched up to `--max-batch` images; loopback only unless `--host`; "
            "with `--token-file` requests need `Authorization: Bearer <token>`; a request past `--max-request-mb` "
            "(its body, or its images decoded) is answered 413; first stdout line `glm-grpo "
            "reward-server: serving NAME on http://HOST:PORT (...)`; exit 2 on a bad reward, argument, token file "
            "or port; needs `pip install 'glm-grpo-ds[server]'` ([rewards.md](rewards.md#remote-rewards))"
        ),
        example="glm-grpo reward-server --reward clip --reward-arg model=/models/clip-vit-large-patch14 --port 8123",
        code="(app: `rewards/remote/serving.py`, batcher: `rewards/remote/batcher.py`)",
    ),
    "verify-logprobs": Subcommand(
        "glm_grpo_ds.commands.verify_logprobs",
        "check sampler vs teacher-forced log-prob parity",
        usage=(
            "glm-grpo verify-logprobs --model DIR\\|ID [--revision R] [--height H] [--width W] [--group-size "
            "G] [--num-prompts P] [--dtype fp32\\|bf16\\|fp16] [--attn sdpa\\|eager\\|flash_attention_2] "
            "[--tolerance X] [--temperature T] [--top-k K] [--top-p P] [--seed N] [--device D]"
        ),
        doc=(
            "sample a rollout, recompute its log-probs teacher-forced, print `max_abs_diff=… mean_abs_diff=…`; "
            "exit 1 above the tolerance (default fp32 1e-4, bf16 5e-2, fp16 1e-2) or on a sampled token whose "
            "teacher-forced log-prob is not finite; sampling defaults to the model's own "
            "([training.md](training.md#teacher-forced-log-probs))"
        ),
        example="glm-grpo verify-logprobs --model zai-org/GLM-Image --dtype bf16 --height 1024 --width 1024",
    ),
    "decode-agreement": Subcommand(
        "glm_grpo_ds.commands.decode_agreement",
        "does a cheap training decode rank each group's samples like the full decode? (rank agreement, time)",
        usage=(
            "glm-grpo decode-agreement --config CFG [--candidate STEPS:GUIDANCE[:N][+fp8] ...] "
            "[--reference STEPS:GUIDANCE] [--num-prompts 8] [--adapter DIR] [--device D] [--out FILE.json] "
            "[key=value ...]"
        ),
        doc=(
            "samples the config's groups, decodes the same token grids with each candidate decode (default: the "
            "config's `decoder.*`; `:N` guides the first N steps only, `+fp8` runs the DiT's block linears in FP8) and "
            "the reference (default: `eval.*`, null = "
            "the pipeline's own 50 steps, "
            "guidance 1.5), scores both with the config's rewards and prints per reward the within-group Spearman "
            "correlation, the fraction of groups with the same best sample and the time ratio; run it before a "
            "long job to choose the training decode ([training.md](training.md#the-training-decode))"
        ),
        example=(
            "glm-grpo decode-agreement --config my_job.yaml --candidate 8:1.0 --candidate 8:1.5:3 "
            "--candidate 8:1.5+fp8 --num-prompts 16 --out agreement.json"
        ),
    ),
    "evaluate": Subcommand(
        "glm_grpo_ds.commands.evaluate",
        "did the run help? base vs adapters with paired seeds: differences with 95 % intervals, win rates",
        usage=(
            "glm-grpo evaluate [--config CFG] [--model DIR\\|ID] [--adapter DIR ...] [--prompts FILE] [--rewards NAME "
            "...] [--num-prompts N] [--samples-per-prompt K] [--seed N] [--category-key category] [--batch-prompts 4] "
            "[--gallery-prompts 16] [--thumbnail PX] [--device auto] [--out outputs/evaluate] [--export LAYOUT DIR "
            "...] [--fresh] [key=value ...]"
        ),
        doc=(
            "samples the base and every adapter on the same prompts with the same rollout noise and decode seeds, "
            "scores them with the rewards and prints per reward the means, the paired difference with a 95 % "
            "Student-t interval over prompts (none below 3 prompts), the win rate and whether the adapter's run "
            "trained on that reward; writes evaluate.json, gallery.png, evaluate.png and report.html; the prompt "
            "count, K and seed default to the config's "
            "eval.*, so with a run's config the adapter's samples are its final evaluation's; without --config the "
            "adapter's own run (its config.json) gives the model, size, sampling, eval decode, seed, K and rewards, "
            "in one line naming them ([evaluate.md](evaluate.md))"
        ),
        example=(
            "glm-grpo evaluate --config launch/configs/tiny_world.yaml model.path=outputs/world/model "
            "--adapter outputs/world_run/final_adapter --prompts outputs/world/heldout.jsonl"
        ),
    ),
    "profile": Subcommand(
        "glm_grpo_ds.commands.profile",
        f"the profilers: {', '.join(PROFILE_TOOLS)} (glm-grpo profile TOOL --help)",
        usage="glm-grpo profile TOOL [args ...]",
        doc=(
            "runs one profiler (`glm_grpo_ds/profiling/`, which the training path never imports) with its own "
            "arguments: `glm-grpo profile --help` lists the tools, `glm-grpo profile TOOL --help` shows one's "
            "options"
        ),
        example="glm-grpo profile decode-timing --tiny --steps 8 --group-size 4",
        code="(the tools: `profiling/tools.py`)",
    ),
    "plot": Subcommand(
        "glm_grpo_ds.commands.plot",
        "plot reward, KL and clip fractions of a run (OUTPUT_DIR/reward_curve.png)",
        usage="glm-grpo plot OUTPUT_DIR [--out PNG]",
        doc="reward / KL / clip-fraction curves (+ eval reward) of a run, default `OUTPUT_DIR/reward_curve.png`",
        example="glm-grpo plot outputs/run --out curves.png",
        code="(drawing: `observability/plot.py`)",
    ),
    "progress": Subcommand(
        "glm_grpo_ds.commands.progress",
        "fraction of the way from a run's start reward to the best (eval and train)",
        usage="glm-grpo progress OUTPUT_DIR --best BEST.json [--window 10] [--min-fraction F]",
        doc=(
            "fraction of the way from the start reward to the best: fixed-seed eval (first vs last) and "
            "training reward (first vs last `--window` steps); exit 1 below `--min-fraction`"
        ),
        example="glm-grpo progress outputs/world_run --best outputs/world/best.json --min-fraction 0.6",
    ),
    "config-docs": Subcommand(
        "glm_grpo_ds.commands.config_docs",
        "print the config key reference (docs/config_reference.md) or --check it",
        usage="glm-grpo config-docs [--check FILE] [--commands FILE] [--check-commands FILE]",
        doc=(
            "print the config reference (every key, default, help) as Markdown; `--check FILE` exits 1 when FILE "
            "is stale ([configuration.md](configuration.md)); `--commands FILE` writes this table of subcommands "
            "(from `commands/subcommands.py`) into FILE, `--check-commands FILE` exits 1 when it is stale"
        ),
        example="glm-grpo config-docs --check docs/config_reference.md",
    ),
    "check-run": Subcommand(
        "glm_grpo_ds.commands.check_run",
        "PASS/FAIL: finite steps, first-iteration ratio 1, log-prob parity, peak vs plan",
        usage="glm-grpo check-run OUTPUT_DIR [--verify FILE] [--parity-tolerance TOL]",
        doc=(
            "PASS/FAIL: no non-finite step, every step of max_steps run, first-iteration ratio exactly 1 (INFO at "
            "grpo.num_iterations=1 and batch.mini_batches=1, where it is 1 by construction), verify-logprobs parity "
            "(`--verify`: a file holding `glm-grpo verify-logprobs` output; the tolerance is verify-logprobs' own "
            "for the dtype it names, 1e-4 in fp32, 5e-2 in bf16), measured peak vs `memory_plan.json`, per phase and "
            "whole run since the last change of cluster shape (GPU; on a CPU all of it in one INFO line, reported, "
            "not judged), a WARN per image-statistics "
            "alarm that fired (with its step, value and bound) and per reward that raised on some samples (how many, "
            "which steps); exit 1 on a FAIL (WARN and INFO: 0) "
            "([memory-and-speed.md](memory-and-speed.md#one-gpu-check-of-the-multi-gpu--bf16-paths))"
        ),
        example="glm-grpo check-run outputs/gpu_check --verify outputs/gpu_check/verify.txt",
    ),
    "env": Subcommand(
        "glm_grpo_ds.commands.env",
        "versions and hardware for a bug report, and each dependency against its supported range",
        usage="glm-grpo env",
        doc=(
            "versions and hardware for a bug report, one block to paste: Python, platform, glm-grpo-ds, torch "
            "(+ its CUDA build, next to the NVIDIA driver's version and the CUDA it supports, or `none`), "
            "torchvision, deepspeed, transformers, diffusers, peft, accelerate, bitsandbytes, flash-attn, "
            "huggingface_hub (`not installed` when absent), CUDA available, GPU count / names / memory, NCCL "
            "version; reads package metadata and imports only torch (~2 s, no model). Then every dependency "
            "against its supported range (setup.py's floor .. constraints.txt's tested top): one missing or outside "
            "gets its `pip install` line, **exit 1** ([install.md](install.md#check-the-install))"
        ),
        example="glm-grpo env",
    ),
    "wheelhouse": Subcommand(
        "glm_grpo_ds.commands.wheelhouse",
        "every wheel a node without a package index needs, in one folder, checked complete",
        usage=(
            "glm-grpo wheelhouse OUT [--python 3.12] [--platform manylinux_2_28_x86_64] [--skip-installed FREEZE] "
            "[--extras ocr,tracking,server,dev] [--constraints FILE] [--find-links DIR] [--project DIR] [--check]"
        ),
        doc=(
            "the offline bundle for a GPU node without a package index: glm-grpo-ds's wheel and every dependency's "
            "for the target's Python and platform (DeepSpeed built from its source archive), without what the "
            "target already has (`--skip-installed` its `pip list --format=freeze`), resolved by pip with no "
            "index before it is kept; prints its size and the one install command; `--check OUT` names a missing "
            "wheel, exit 2 ([install.md](install.md))"
        ),
        example=(
            "glm-grpo wheelhouse wheels/ --python 3.12 --platform manylinux_2_28_x86_64 --skip-installed "
            "node-freeze.txt"
        ),
        code="(`install/bundle.py`, `install/pip_runs.py`)",
    ),
    "tiny-model": Subcommand(
        "glm_grpo_ds.commands.tiny:tiny_model",
        "write a random-weight tiny GLM-Image pipeline directory",
        usage=(
            "glm-grpo tiny-model OUT_DIR [--seed N] [--full-size-ar \\| --real-width --ar-layers N "
            "--dit-layers M [--device cpu\\|cuda] [--configs-from DIR\\|ID [--revision R]]] [--overwrite]"
        ),
        doc=(
            "write a complete random-weight tiny `GlmImagePipeline` directory (~1.1 MB, offline, "
            "byte-identical per seed); `--full-size-ar`: the AR at GLM-Image's real size (10 B params, ~20 GB "
            "bf16) for GPU benchmarks ([tiny-models.md](tiny-models.md)); `--real-width`: every component at "
            "real widths with N AR / M DiT layers, bf16, from the built-in GLM-Image configs or "
            "`--configs-from DIR\\|ID` ([real-width.md](real-width.md)); `--device cuda` creates the weights on the "
            "GPU (GLM-Image at full size, 40 + 30 layers, in seconds: `launch/gpu_timing.sh`); a directory holding "
            "files it did not write (a real pipeline) is refused unless `--overwrite`"
        ),
        example="glm-grpo tiny-model outputs/tiny --seed 0",
        code="(builder: `testing/tiny.py`)",
    ),
    "tiny-data": Subcommand(
        "glm_grpo_ds.commands.tiny:tiny_data",
        "write a learnable prompt set with target images for the tiny model",
        usage="glm-grpo tiny-data --config CFG [--num-prompts N] [--overwrite] [key=value ...]",
        doc="write the learnable prompt set + target images to the config's `data.train_file`",
        example="glm-grpo tiny-data --config launch/configs/tiny_cpu.yaml",
        code="(builder: `testing/tiny_data.py`)",
    ),
    "text-prompts": Subcommand(
        "glm_grpo_ds.commands.text_prompts",
        "write a small generated set of text-rendering prompts with their target strings (jsonl)",
        usage="glm-grpo text-prompts OUT.jsonl [--num 32] [--seed 0]",
        doc=(
            "prompts with quoted texts, a `text` list of the regions and a `category`, for "
            "`glm-grpo evaluate --rewards ocr_word_accuracy ocr_region_ned` ([evaluate.md](evaluate.md#text-rendering))"
        ),
        example="glm-grpo text-prompts outputs/text_prompts.jsonl --num 64",
        code="(the prompts: `data/text_prompts.py`)",
    ),
    "tiny-world": Subcommand(
        "glm_grpo_ds.commands.tiny:tiny_world",
        "write the learnable tiny world: colour-block decoder, colour prompts",
        usage="glm-grpo tiny-world OUT_DIR [--seed N] [--seed-layout]",
        doc=(
            "write the learnable tiny world: colour-block decoder pipeline (`OUT/model`), `train.jsonl`, "
            "`heldout.jsonl`, `layouts.jsonl`, `best.json`"
        ),
        example="glm-grpo tiny-world outputs/world",
        code="(builder: `testing/world.py`)",
    ),
}

"""Memory planner arithmetic by hand (ZeRO paper formulas with LoRA / 8-bit adjustments) and the CLI."""

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from in_process import glm_grpo  # noqa: E402  (tests/in_process.py)

from glm_grpo_ds.config import load_config
from glm_grpo_ds.memory.plan import GIB, EstimateConfig, grid_tokens, plan
from glm_grpo_ds.memory.sizes import Sizes

ROOT = Path(__file__).resolve().parents[2]
ZERO = {s: json.loads((ROOT / "ds_configs" / f"zero{s}.json").read_text()) for s in (1, 2, 3)}
TEXT = dict(layers=4, hidden=64, intermediate=160, heads=4, kv_heads=2, head_dim=16, vision_vocab=100)


def sizes(trainable, lora=()):
    return Sizes(
        ar_base=[1000, 10, 4000],
        lora=list(lora),
        trainable=trainable,
        largest_trainable=max(lora, default=4000),
        decoder=500,
        dit_hidden=32,
        text=TEXT,
        source="test",
    )


def cfg(*overrides):
    return load_config(
        None, ["model.path=x", "data.train_file=x", "rewards=[{name: pixel_mse}]", "model.dtype=bf16", *overrides]
    )


def test_grid_tokens_match_glm_image():
    assert grid_tokens(1024, 1024) == 1024 + 256  # DESIGN: 1024^2 -> 1024 + 256
    assert grid_tokens(64, 96) == 2 * 3 + 19 * 13  # preview 16*sqrt(2/3) x 16*sqrt(3/2)


def test_full_finetuning_adamw_is_the_zero_paper_formula():
    # full fine-tuning, AdamW: (2 + 2 + 12) * psi / N model states at ZeRO-3 (bf16 weights + grads,
    # fp32 master + two moments); tensors of 10 elements are below no threshold here
    c = cfg("lora=null", "optimizer.name=adamw", "grpo.beta=0")
    ds = json.loads(json.dumps(ZERO[3]))
    ds["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    p = plan(c, ds, EstimateConfig(num_gpus=4), sizes(trainable=5010))
    comp = p["components"]
    assert comp["ar_weights"] == 2 * (250 + 3 + 1000)  # ceil(psi_i / 4) per tensor, bf16
    assert comp["gradients"] == 2 * math.ceil(5010 / 4)
    assert comp["master_weights"] == 4 * math.ceil(5010 / 4)
    assert comp["optimizer_states"] == 8 * math.ceil(5010 / 4) + 4
    assert comp["reference"] == 0 and comp["lora_weights"] == 0


def test_stages_lora_8bit_reference_and_offload():
    lora = [640, 640]
    c = cfg("optimizer.name=adamw_8bit", "lora.r=8")
    p1 = plan(c, ZERO[1], EstimateConfig(num_gpus=2), sizes(trainable=1280, lora=lora))["components"]
    assert p1["ar_weights"] == 2 * 5010 and p1["lora_weights"] == 2 * 1280  # whole on every GPU
    assert p1["gradients"] == 2 * 1280  # ZeRO-1 does not partition gradients
    assert p1["optimizer_states"] == 2 * 640 + 8 * math.ceil(640 / 256) + 2048  # 8-bit codes + block scales + maps
    p2 = plan(c, ZERO[2], EstimateConfig(num_gpus=2), sizes(trainable=1280, lora=lora))["components"]
    assert p2["gradients"] == 2 * 640 + 2 * 640  # partition + one whole tensor at a partition edge
    # ZeRO-3 keeps tensors below the persistence threshold (10 x hidden = 640) whole
    p3 = plan(c, ZERO[3], EstimateConfig(num_gpus=2), sizes(trainable=1280, lora=lora))["components"]
    assert p3["ar_weights"] == 2 * (500 + 5 + 2000) + 2 * 10
    # full fine-tuning with beta > 0 keeps a sharded frozen reference
    full = plan(
        cfg("lora=null", "grpo.beta=0.04", "optimizer.name=adamw"), ZERO[3], EstimateConfig(num_gpus=2), sizes(5010)
    )
    assert full["components"]["reference"] == full["components"]["ar_weights"]
    off = json.loads((ROOT / "ds_configs" / "zero3_offload.json").read_text())
    po = plan(cfg("lora=null", "grpo.beta=0", "optimizer.name=adamw"), off, EstimateConfig(num_gpus=2), sizes(5010))
    assert po["components"]["optimizer_states"] == 0 and po["components"]["master_weights"] == 0
    # offload_param: the partitions of the 1000- and 4000-element tensors (500 + 2000, bf16) on the host; the
    # 10-element tensor below the threshold stays on the GPU, its partition (5) and its whole (10); with the
    # optimizer offloaded the gradient partition (2505, bf16) is on the host too
    assert po["components"]["ar_weights"] == 2 * (5 + 10) and po["components"]["gradients"] == 0
    assert po["host_bytes"] == {
        "parameters": 2 * (500 + 2000),
        "gradients": 2 * 2505,
        "master_weights": 4 * 2505,
        "optimizer_states": 8 * 2505 + 4,
        "fp32_gradients": 4 * 2505,
    }
    # a frozen reference (beta > 0) is partitioned like the policy: on the host too
    ref = plan(cfg("lora=null", "grpo.beta=0.04", "optimizer.name=adamw"), off, EstimateConfig(num_gpus=2), sizes(5010))
    assert ref["components"]["reference"] == 2 * (5 + 10) and ref["host_bytes"]["reference"] == 2 * (500 + 2000)


def test_offloaded_parameters_are_gathered_into_device_copies_even_on_one_rank():
    """At world size 1 a ZeRO-3 gather points at the stored partition and costs nothing; with offload_param it
    copies the host partition to the GPU (DeepSpeed's NoGatherHandle: ``ds_tensor.to(device)``), so the rollout's
    full gather and the update's live parameters count again, while the weights leave the GPU."""
    off = json.loads((ROOT / "ds_configs" / "zero3_offload.json").read_text())
    c = cfg("optimizer.name=adamw", "lora.r=8")
    s = sizes(1280, [640, 640])
    plain = plan(c, ZERO[3], EstimateConfig(num_gpus=1), s)
    offloaded = plan(c, off, EstimateConfig(num_gpus=1), s)
    p, o = plain["components"], offloaded["components"]
    full_ar = 5010 * 2 + 1280 * 4  # bf16 base, peft's fp32 adapters (ZeRO-3 keeps them)
    largest_gradient = 640 * 4
    assert p["rollout_gather"] == 0 and p["zero3_update_gather"] == largest_gradient
    assert o["rollout_gather"] == full_ar
    # live parameters: all 6290 (under stage3_max_live_parameters) + the prefetch bucket, 0.9 x 64^2, in bf16
    assert o["zero3_update_gather"] == (6290 + int(0.9 * 64 * 64)) * 2 + largest_gradient
    # on the GPU only the 10-element tensor (below 10 x 64) as partition and whole; the rest on the host
    assert p["ar_weights"] == 2 * (5010 + 10) and o["ar_weights"] == 2 * (10 + 10)
    assert o["lora_weights"] == 0 and offloaded["host_bytes"]["parameters"] == 2 * 5000 + 4 * 1280
    assert offloaded["setup"]["offload_param"] and not plain["setup"]["offload_param"]


def test_activations_checkpointing_and_total():
    c = cfg("batch.micro_batch_size=2", "rollout.height=64", "rollout.width=64")
    on = plan(c, ZERO[3], EstimateConfig(num_gpus=1, prompt_tokens=10), sizes(1280, [640, 640]))
    off = plan(
        cfg("batch.micro_batch_size=2", "rollout.height=64", "rollout.width=64", "model.gradient_checkpointing=false"),
        ZERO[3],
        EstimateConfig(num_gpus=1, prompt_tokens=10),
        sizes(1280, [640, 640]),
    )
    seq = 10 + grid_tokens(64, 64)
    per_layer = 8 * 64 + 2 * 32 + 4 * 160
    assert on["components"]["activations"] == 2 * seq * (4 * 64 + per_layer) * 2
    assert off["components"]["activations"] == 2 * seq * 4 * per_layer * 2
    comp = on["components"]
    assert on["total_bytes"] == sum(comp[k] for k in on["persistent"]) + max(on["phases"].values())
    rollout = max(comp["rollout_kv_cache"], comp["rollout_logprobs"]) + comp["rollout_gather"] + comp["gather_staging"]
    assert on["phases"]["rollout"] == rollout
    off = plan(cfg("grpo.beta=0", "grpo.num_iterations=1"), ZERO[3], EstimateConfig(num_gpus=1), sizes(1280, [640]))
    assert off["components"]["rollout_logprobs"] == 0  # beta 0, one iteration: no pass in the rollout's gather


@pytest.mark.parametrize("extra", [["grpo.beta=0.1"], ["grpo.num_iterations=2"]])
def test_reference_and_old_logprobs_in_the_rollout_phase(extra):
    """LoRA with beta > 0 (the reference) or num_iterations > 1 (old log-probs): a no-grad pass of one
    micro-batch in the rollout's gather, one layer's tensors and one fp32 logits chunk at a time, after
    the KV cache is gone."""
    c = cfg("batch.micro_batch_size=8", "grpo.group_size=8", "rollout.height=64", "rollout.width=64", *extra)
    p = plan(c, ZERO[3], EstimateConfig(num_gpus=2, prompt_tokens=10), sizes(1280, [640, 640]))
    comp, n_gen = p["components"], grid_tokens(64, 64)
    seq, per_layer, chunk = 10 + n_gen, 8 * 64 + 2 * 32 + 4 * 160, min(c.grpo.logprob_chunk_size, n_gen)
    assert comp["rollout_logprobs"] == 8 * seq * per_layer * 2 + 3 * 8 * chunk * 100 * 4
    assert comp["rollout_logprobs"] > comp["rollout_kv_cache"]  # here the larger of the two
    assert p["phases"]["rollout"] == comp["rollout_logprobs"] + comp["rollout_gather"] + comp["gather_staging"]


@pytest.mark.slow
def test_cli_json_and_over_budget_exit_3(tiny_model_dir, capfd):
    argv = ["estimate-memory", "--config", ROOT / "launch/configs/tiny_cpu.yaml", "--deepspeed"]
    argv += [ROOT / "ds_configs/zero3.json", "--num-gpus", "2", "--json", f"model.path={tiny_model_dir}"]
    code, out, err = glm_grpo(argv, capfd)
    obj = json.loads(out)
    assert code == 0 and obj["total_bytes"] > 0 and obj["ar_weights"] > 0 and "WARNING" not in err
    code, out, err = glm_grpo(argv + ["--gpu-memory-gb", "0.5"], capfd)
    assert code == 3 and "WARNING: the plan needs" in err and json.loads(out)["fits"] is False
    code, _, err = glm_grpo(argv + ["--gpu-memory-gb", "0.5", "--allow-over-budget"], capfd)
    assert code == 0 and "WARNING: the plan needs" in err
    code, _, err = glm_grpo(argv[:-1] + ["lora.alfa=4"], capfd)
    assert code == 2 and "did you mean" in err and "Traceback" not in err


@pytest.mark.parametrize("name", ["glm_image_lora.yaml", "glm_image_full.yaml"])
def test_real_glm_image_plan_fits_8x80(name):
    """The example configs fit 8 x 80 GB by the plan (real GLM-Image sizes from the built-in configs)."""
    c = load_config(ROOT / "launch" / "configs" / name, [])
    p = plan(c, ZERO[3], EstimateConfig(num_gpus=8, gpu_memory_gb=80))
    assert 9e9 < sum(p["components"].values()) and p["total_bytes"] < 80 * GIB


def test_host_ram_per_node_by_hand():
    import dataclasses

    import torch

    offload = json.loads((ROOT / "ds_configs" / "zero3_offload.json").read_text())
    c = cfg("optimizer.name=adamw", "decoder.offload=true", "decoder.dtype=bf16")
    s = dataclasses.replace(sizes(2000, lora=[1000, 1000]), largest_decoder_tensor=300)
    p = plan(c, offload, EstimateConfig(num_gpus=4), s)
    h = p["host_node"]
    # offload_param: the partitions of the 1000- and 4000-element AR tensors (250 + 1000, bf16) and of the two
    # 1000-element adapters (250 each, fp32); offload_optimizer: the gradient partition (2000 / 4, bf16)
    assert p["host_bytes"]["parameters"] == 2 * 1250 + 4 * 500 and p["host_bytes"]["gradients"] == 2 * 500
    assert p["host_bytes"]["fp32_gradients"] == 4 * 500  # the fp32 partition CPU Adam steps on
    rank = 3 * GIB + 1 * GIB + sum(p["host_bytes"].values()) + 500 * 2
    assert h["ranks"] == 4 and h["per_rank"]["decoder_offloaded"] == 500 * 2 and sum(h["per_rank"].values()) == rank
    # loading, ZeRO-3: one tensor per rank (the larger of the decoder's 300 and the adapters' 1000, fp32),
    # and rank 0's largest AR tensor (4000, fp32) on its way to the gathered parameter; no reward model
    loading = {"reward_models": 0, "ar_whole": 0, "largest_tensor": 1000 * 4, "decoder_fp8_conversion": 0}
    assert h["loading_per_rank"] == loading
    assert h["steady_bytes"] == 4 * rank and h["loading_peak_bytes"] == 4 * rank + 4 * 1000 * 4 + 4000 * 4
    assert h["request_bytes"] == 32 * GIB  # 16 GiB x 1.25 rounded up to 16 GiB steps
    assert h["page_cache_bytes"] == (5010 + 500) * 2
    # a random: model is built in memory from no file: no page cache of weight files (said as 34 GiB before)
    random = cfg("optimizer.name=adamw", "decoder.offload=true", "decoder.dtype=bf16", "model.path=random:tiny")
    assert plan(random, offload, EstimateConfig(num_gpus=4), s)["host_node"]["page_cache_bytes"] == 0
    from glm_grpo_ds.commands.estimate_memory import format_plan

    assert "host RAM per node (4 ranks): steady 16.0 GiB" in format_plan(p) and "--mem=32G" in format_plan(p)
    on_cpu = plan(c, offload, EstimateConfig(num_gpus=4, device="cpu"), s)
    assert on_cpu["host_node"]["per_rank"]["process"] == 0
    # ZeRO-2: every rank loads the whole AR on the host; a cast copy (5010 x 2 bytes) unless the checkpoint
    # is stored in the model dtype (then the tensors stay on the memory-mapped file); no rank-0 term
    h2 = plan(c, ZERO[2], EstimateConfig(num_gpus=4), s)["host_node"]
    assert h2["loading_per_rank"]["ar_whole"] == 5010 * 2 and h2["loading_rank0_bytes"] == 0
    same = dataclasses.replace(s, checkpoint_dtype=torch.bfloat16)
    assert plan(c, ZERO[2], EstimateConfig(num_gpus=4), same)["host_node"]["loading_per_rank"]["ar_whole"] == 0


def test_full_finetunings_end_counts_rank_0s_file_of_final_model(monkeypatch):
    """Full fine-tuning ends with rank 0 holding one file of final_model/ (ds/io.py write_model): the AR's 5010
    bf16 elements when they fit one file, the largest tensor (4000) alone when files are smaller; LoRA: nothing."""
    from glm_grpo_ds.memory import host

    def host_node(*overrides):
        return plan(cfg(*overrides), ZERO[3], EstimateConfig(num_gpus=4), sizes(5010))["host_node"]

    full = host_node("lora=null", "optimizer.name=adamw")
    assert full["writing_rank0_bytes"] == 5010 * 2 and host_node()["writing_rank0_bytes"] == 0
    monkeypatch.setattr(host, "SHARD_BYTES", 3000)
    assert host_node("lora=null", "optimizer.name=adamw")["writing_rank0_bytes"] == 4000 * 2
    # the request covers the end when it is the larger peak: ZeRO-2 loading an AR stored in the model dtype (memory-
    # mapped, not added), then rank 0 writing a 12 GiB file of its eight 2 GiB tensors over a 4 x 4 GiB steady state
    monkeypatch.setattr(host, "SHARD_BYTES", 12 * GIB)
    big = dataclasses.replace(sizes(5010), ar_base=[GIB] * 8, checkpoint_dtype=torch.bfloat16)
    h = plan(cfg("lora=null", "optimizer.name=adamw"), ZERO[2], EstimateConfig(num_gpus=4), big)["host_node"]
    assert h["writing_rank0_bytes"] == 12 * GIB and h["steady_bytes"] == 16 * GIB <= h["loading_peak_bytes"] < 17 * GIB
    assert h["request_bytes"] == 48 * GIB  # (16 + 12) x 1.25 = 35 GiB, in 16 GiB steps; the loading peak asks 32


def test_slurm_asks_for_the_planned_host_memory():
    """launch/slurm.sbatch's --mem is the planner's request for its default run: the LoRA config, ZeRO-2 (the
    scripts' default stage), 8 GPUs per node (real GLM-Image sizes from the built-in configs)."""
    import re

    c = load_config(ROOT / "launch" / "configs" / "glm_image_lora.yaml", [])
    want = plan(c, ZERO[2], EstimateConfig(num_gpus=8))["host_node"]["request_bytes"] // GIB
    found = re.findall(r"^#SBATCH --mem=(\d+)G\b", (ROOT / "launch" / "slurm.sbatch").read_text(), re.M)
    assert found == [str(want)], (found, want)


def test_lora_adapters_fp32_under_zero3_on_the_real_ar():
    """LoRA r=64 on the real AR: 190,382,080 parameters (726 MiB in fp32). Per layer, r x (in + out) for
    q 4096->4096, k and v 4096->256, o 4096->4096, gate_up 4096->27392, down 13696->4096."""
    from glm_grpo_ds.memory.sizes import model_sizes

    c = load_config(ROOT / "launch" / "configs" / "glm_image_lora.yaml", [])
    s = model_sizes(c)
    per_layer = 64 * (2 * (4096 + 4096) + 2 * (4096 + 256) + (4096 + 27392) + (13696 + 4096))
    assert sum(s.lora) == 40 * per_layer == 190_382_080 and round(sum(s.lora) * 4 / 2**20) == 726
    # ZeRO-3 on 8 GPUs, fp32: ceil(n/8) x 4 bytes per tensor; k/v's B (256 x 64 = 16384 < 10 x 4096, the
    # persistence threshold) are also kept whole. Eight 262,144-element tensors, k/v B, gate_up B 27392 x 64,
    # down A 64 x 13696:
    layer = 8 * 32768 * 4 + 2 * (2048 + 16384) * 4 + 219136 * 4 + 109568 * 4
    p3 = plan(c, ZERO[3], EstimateConfig(num_gpus=8), s)
    assert p3["components"]["lora_weights"] == 40 * layer == 100_433_920
    assert "fp32" in p3["notes"]["lora_weights"]
    # the bf16 gradient partition and the fp32 master are as before (the engine's dtype; its own copy)
    assert p3["components"]["gradients"] == 2 * math.ceil(190_382_080 / 8)
    assert p3["components"]["master_weights"] == 4 * math.ceil(190_382_080 / 8)
    # ZeRO-2: DeepSpeed casts every parameter to bf16 (no zero.Init model): 2 bytes, whole on every GPU
    p2 = plan(c, ZERO[2], EstimateConfig(num_gpus=8), s)
    assert p2["components"]["lora_weights"] == 2 * 190_382_080 and "DeepSpeed casts" in p2["notes"]["lora_weights"]


def test_peft_keeps_the_adapters_fp32_after_make_trainable(tiny_model_dir):
    """What lora_bytes assumes before DeepSpeed: the trainer's own make_trainable on a bf16 base leaves the
    adapters in fp32 (peft's autocast_adapter_dtype) and the base in bf16."""
    import torch

    from glm_grpo_ds.memory.plan import lora_bytes
    from glm_grpo_ds.model.policy import load_ar, make_trainable

    model = make_trainable(load_ar(tiny_model_dir, "bf16"), cfg("lora.r=4").lora, gradient_checkpointing=False)
    named = list(model.named_parameters())
    assert {p.dtype for n, p in named if "lora_" in n} == {torch.float32}
    assert {p.dtype for n, p in named if "lora_" not in n} == {torch.bfloat16}
    assert lora_bytes(3, 2) == 4 and lora_bytes(2, 2) == 2


def test_reward_models_counted_where_they_run(tmp_path):
    """CLIP sizes: published configs for known names (the published counts), the checkpoint's own config
    and dtype when the directory is here; LPIPS and the aesthetic head from their modules; OCR on the CPU,
    remote on its server, pixel rewards without a model."""
    import torch
    from transformers import CLIPConfig

    from glm_grpo_ds.memory.reward_models import _B32, clip_size

    assert clip_size("/models/clip-vit-large-patch14")[:3] == (427_616_513, 4, 768)  # openai/CLIP: 427,616,513
    assert clip_size("/m/PickScore_v1")[0] == pytest.approx(986.11e6, abs=0.005e6)  # open_clip: 986.11 M
    here = tmp_path / "clip-b32-bf16"
    conf = CLIPConfig(text_config=_B32["text"], vision_config=_B32["vision"], projection_dim=512)
    conf.dtype = torch.bfloat16
    conf.save_pretrained(here)
    n, b, dim, source = clip_size(here)
    assert (n, b, dim) == (151_277_313, 2, 512) and "config.json" in source  # openai/CLIP: 151,277,313
    head = 768 * 1024 + 1024 + 1024 * 128 + 128 + 128 * 64 + 64 + 64 * 16 + 16 + 16 + 1  # LAION MLP
    alexnet = 2_469_696 + (64 + 192 + 384 + 256 + 256)  # torchvision features + lpips' 1x1 heads
    rewards = [
        "{name: aesthetic, args: {clip_model: /models/clip-vit-large-patch14, head: h.pth}}",
        f"{{name: clip, args: {{model: {here}, offload: true}}}}",
        "{name: lpips}",
        "{name: ocr}",
        "{name: remote, args: {url: 'http://10.0.0.7:8123'}}",
        "{name: pixel_mse}",
    ]
    c = load_config(None, ["model.path=x", "data.train_file=x", f"rewards=[{', '.join(rewards)}]"])
    p = plan(c, ZERO[3], EstimateConfig(num_gpus=2), sizes(1280, [640, 640]))
    got = {r["name"]: (r["where"], r["bytes"]) for r in p["rewards"]}
    assert got["aesthetic"] == ("gpu", 4 * (427_616_513 + head))
    assert got["clip"] == ("offload", 2 * 151_277_313)
    assert got["lpips"] == ("gpu", 4 * alexnet)
    assert got["ocr"] == ("cpu", 0) and got["remote"] == ("remote", 0) and got["pixel_mse"] == ("none", 0)
    comp = p["components"]
    assert comp["reward_models"] == 4 * (427_616_513 + head) + 4 * alexnet  # whole on every GPU
    assert comp["reward_offloaded"] == p["phases"]["reward"] == 2 * 151_277_313  # on the GPU while scoring
    host = p["host_node"]
    assert host["per_rank"]["reward_models_offloaded"] == 2 * 151_277_313
    # built on the host first: the CLIP checkpoints load memory-mapped (page cache shared by the ranks),
    # the aesthetic head and LPIPS are copies in every rank
    assert host["loading_per_rank"]["reward_models"] == 4 * head + 4 * alexnet
    assert host["page_cache_bytes"] == (5010 + 500) * 2 + 4 * 427_616_513 + 2 * 151_277_313  # AR, decoder: bf16
    from glm_grpo_ds.commands.estimate_memory import format_plan

    text = format_plan(p)
    assert "reward models (the config's rewards" in text and "cpu: RapidOCR" in text and "remote: 0 on this GPU" in text


def test_zero3_on_one_rank_gathers_nothing_and_gloo_stages_the_largest_tensor():
    # one rank: DeepSpeed's ZeRO-3 gather only points at the whole tensors it already holds
    c = cfg("lora.r=8")
    one = plan(c, ZERO[3], EstimateConfig(num_gpus=1), sizes(1280, [640, 640]))["components"]
    assert one["rollout_gather"] == 0 and one["gather_staging"] == 0
    assert one["zero3_update_gather"] == 640 * 4  # only the largest (fp32 LoRA) gradient before its reduce
    two = plan(c, ZERO[3], EstimateConfig(num_gpus=2), sizes(1280, [640, 640]))
    assert two["components"]["rollout_gather"] == (1000 + 10 + 4000) * 2 + (640 + 640) * 4
    assert two["components"]["gather_staging"] == 0  # NCCL gathers in place
    # CPU ranks (gloo) stage the largest gathered tensor (4000 bf16 elements) once more, in both gathers
    cpu = plan(c, ZERO[3], EstimateConfig(num_gpus=2, device="cpu"), sizes(1280, [640, 640]))
    comp = cpu["components"]
    assert comp["gather_staging"] == 4000 * 2
    transient = max(comp["rollout_kv_cache"], comp["rollout_logprobs"])
    assert cpu["phases"]["rollout"] == transient + comp["rollout_gather"] + 4000 * 2
    assert cpu["phases"]["update"] == comp["logits"] + comp["activations"] + comp["zero3_update_gather"] + 4000 * 2


def test_decode_activations_are_the_larger_of_dit_and_vae_and_cfg_does_not_double_them():
    # 2 images (G=2 < decoder.batch_size 4) per DiT forward and VAE decode, bf16, 64x64: the DiT's
    # 2 x 16 latent tokens x hidden 32 x 2 bytes x 12 = 24 576 bytes, the VAE's full-resolution maps of
    # 256 channels 2 x 256 x 64 x 64 x 2 bytes = 4 194 304 bytes each: 4 on a GPU, 3 on a CPU (both measured);
    # guidance runs a second DiT forward
    common = (
        "grpo.group_size=2",
        "batch.micro_batch_size=2",
        "decoder.batch_size=4",
        "decoder.dtype=bf16",
        "rollout.height=64",
        "rollout.width=64",
    )
    for guidance in ("1.0", "1.5"):
        p = plan(cfg(*common, f"decoder.guidance_scale={guidance}"), ZERO[3], EstimateConfig(num_gpus=1), sizes(1280))
        assert p["components"]["decode_activations"] == max(2 * 16 * 32 * 2 * 12, 2 * 256 * 64 * 64 * 2 * 4)
    on_cpu = plan(cfg(*common), ZERO[3], EstimateConfig(num_gpus=1, device="cpu"), sizes(1280))
    assert on_cpu["components"]["decode_activations"] == 2 * 256 * 64 * 64 * 2 * 3
    narrow = dataclasses.replace(sizes(1280), vae_full_res_channels=1, dit_hidden=4096)
    p = plan(cfg(*common), ZERO[3], EstimateConfig(num_gpus=1), narrow)
    assert p["components"]["decode_activations"] == 2 * 16 * 4096 * 2 * 12  # the DiT's, now the larger
    # the reference math attention holds each head's 16 x 16 scores and their softmax (the fused kernels none)
    math = dataclasses.replace(narrow, dit_heads=3)
    p = plan(cfg(*common, "decoder.attention=sdpa_math"), ZERO[3], EstimateConfig(num_gpus=1), math)
    assert p["components"]["decode_activations"] == 2 * 16 * 4096 * 2 * 12 + 2 * 3 * 16 * 16 * 2 * 2
    # the evaluation decodes its 8 samples of a prompt 4 at a time (decoder.batch_size) through the same decoder
    evaluating = cfg(*common, "eval.file=x", "eval.group_size=8")
    p = plan(evaluating, ZERO[3], EstimateConfig(num_gpus=1), sizes(1280))
    assert p["components"]["decode_activations"] == 4 * 256 * 64 * 64 * 2 * 4


def test_optimizer_steps_count_their_fp32_temporaries_per_zero3_sub_group():
    # measured: bitsandbytes 8-bit AdamW on a CPU peaks at 5 x the fp32 bytes it steps, torch AdamW at 2 x;
    # on a GPU torch AdamW's foreach step holds one fp32 temporary, bitsandbytes' kernel none; ZeRO-3 steps
    # sub_group_size elements at a time. Before the optimizer runs, DeepSpeed's flat bf16 copy of the
    # sub-group's gradients sits beside their fp32 conversion (2 bytes per element, the model dtype).
    ds = json.loads(json.dumps(ZERO[3]))
    ds["zero_optimization"]["sub_group_size"] = 2200
    for name, cpu_factor, gpu_factor in (("adamw_8bit", 5, 0), ("adamw", 2, 1)):
        c = cfg("lora=null", f"optimizer.name={name}")
        cpu = plan(c, ds, EstimateConfig(num_gpus=2, device="cpu"), sizes(trainable=5010))
        # the flat copy is smaller than the CPU optimizers' temporaries: the CPU step is as measured
        assert cpu["components"]["grad_flatten"] == 2 * 2200
        assert cpu["components"]["optimizer_step_temporaries"] == cpu_factor * 4 * 2200  # min(ceil(5010 / 2), 2200)
        assert cpu["phases"]["step"] == 4 * 2200 + cpu_factor * 4 * 2200  # + the sub-group's fp32 gradients
        gpu = plan(c, ds, EstimateConfig(num_gpus=2), sizes(trainable=5010))
        assert gpu["components"]["optimizer_step_temporaries"] == gpu_factor * 4 * 2200
        assert gpu["components"]["grad_flatten"] == 2 * 2200
        assert gpu["phases"]["step"] == 4 * 2200 + max(2 * 2200, gpu_factor * 4 * 2200)


def test_a_zero3_sub_group_never_splits_a_tensor():
    # sub_group_size 1000, but the largest trainable tensor's partition is ceil(4000 / 2) = 2000 elements:
    # DeepSpeed's sub-groups hold whole partitions, so that one is stepped (and its fp32 gradient made) whole
    ds = json.loads(json.dumps(ZERO[3]))
    ds["zero_optimization"]["sub_group_size"] = 1000
    c = cfg("lora=null", "optimizer.name=adamw_8bit")
    p = plan(c, ds, EstimateConfig(num_gpus=2, device="cpu"), sizes(trainable=5010))["components"]
    assert p["fp32_grad_step"] == 4 * 2000
    assert p["optimizer_step_temporaries"] == 5 * 4 * 2000


# GLM-Image's decoder layer, per the built-in config (hidden 4096, 32 x 128 query heads, 2 x 128 kv heads,
# intermediate 13 696): the base weights of q, k, v, o, gate_up (both halves) and down, times 40 layers
GLM_ADAPTED = 40 * (4096 * 4096 + 2 * 4096 * 256 + 4096 * 4096 + 4096 * 2 * 13696 + 13696 * 4096)


def test_merge_copy_counted_where_it_lives():
    """rollout.merge_lora: the adapted linears' base weights once (model dtype), on the GPU (persistent), in
    pinned host RAM (per rank, not on the GPU) or nowhere (ZeRO-3 on several ranks); merging holds the fp32
    temporaries of the largest adapted linear during the rollout; auto = the GPU when the plan with it fits."""
    s = dataclasses.replace(sizes(1280, [640, 640]), adapted_base=[1000, 4000])
    base = plan(cfg(), ZERO[2], EstimateConfig(num_gpus=1), s)
    on = plan(cfg("rollout.merge_lora=true", "rollout.merge_copy=device"), ZERO[2], EstimateConfig(num_gpus=1), s)
    comp = on["components"]
    assert comp["lora_merge_copy"] == 2 * 5000 and "lora_merge_copy" in on["persistent"]
    assert comp["rollout_merge"] == 12 * 4000  # fp32 delta, fp32 W, fp32 sum
    assert (on["merge_copy"]["placement"], on["merge_copy"]["bytes"], on["merge_copy"]["why"]) == (
        "device",
        10_000,
        "rollout.merge_copy=device",
    )
    assert on["total_bytes"] == base["total_bytes"] + 2 * 5000  # the rollout phase is not the peak here
    host = plan(cfg("rollout.merge_lora=true", "rollout.merge_copy=host"), ZERO[2], EstimateConfig(num_gpus=1), s)
    assert host["components"]["lora_merge_copy"] == 0 and host["total_bytes"] == base["total_bytes"]
    # pinned: each weight in its own block of the next power of two bytes (torch's CachingHostAllocator)
    assert host["host_node"]["per_rank"]["lora_merge_copy"] == 2048 + 8192 == host["merge_copy"]["bytes"]
    assert host["host_node"]["steady_bytes"] == base["host_node"]["steady_bytes"] + 2048 + 8192
    # ZeRO-3 on 2 ranks: the rollout's gathered weights are discarded, no copy (the merge still runs);
    # on one rank the gathered parameter is the stored one: restored from a copy
    z3 = plan(cfg("rollout.merge_lora=true"), ZERO[3], EstimateConfig(num_gpus=2), s)
    assert z3["merge_copy"]["placement"] is None and z3["components"]["lora_merge_copy"] == 0
    assert z3["components"]["rollout_merge"] == 12 * 4000
    assert plan(cfg("rollout.merge_lora=true"), ZERO[3], EstimateConfig(num_gpus=1), s)["merge_copy"]["placement"] == (
        "device"
    )
    # auto: the GPU exactly when the plan with the copy fits (headroom >= 0, the plan's own test)
    auto = cfg("rollout.merge_lora=true")
    need = base["total_bytes"] + 10_000
    assert (
        plan(auto, ZERO[2], EstimateConfig(num_gpus=1, gpu_memory_gb=need / GIB), s)["merge_copy"]["placement"]
        == "device"
    )
    tight = EstimateConfig(num_gpus=1, gpu_memory_gb=(need - 1) / GIB)
    assert plan(auto, ZERO[2], tight, s)["merge_copy"]["placement"] == "host"
    # a CPU rank: one memory, so auto is the device, counted in fp32 (the CPU's model dtype), W its own .float()
    cpu = plan(cfg("rollout.merge_lora=true", "model.dtype=auto"), ZERO[2], EstimateConfig(num_gpus=1, device="cpu"), s)
    assert cpu["merge_copy"]["placement"] == "device" and cpu["components"]["lora_merge_copy"] == 4 * 5000
    assert cpu["components"]["rollout_merge"] == 8 * 4000
    assert plan(cfg(), ZERO[2], EstimateConfig(num_gpus=1), s)["merge_copy"]["placement"] is None  # merge_lora off


def test_merge_copy_of_the_real_glm_image_lora():
    """The default LoRA config (r=64 on all six projections of the 40 layers): 8.16 G base elements, 15.2 GiB in
    bf16 (measured on an H200: 41.4 GB peak with the copy on the GPU, 25.8 GB without); at world size 1 under
    ZeRO-2, auto keeps it on an 80 GiB GPU and puts it in host memory on a 48 GiB one (the plan without it:
    43.7 GiB)."""
    from glm_grpo_ds.memory.sizes import model_sizes

    c = load_config(
        ROOT / "launch" / "configs" / "glm_image_lora.yaml",
        ["rollout.fuse_lora=false", "rollout.merge_lora=true"],
    )
    s = model_sizes(c)
    assert sum(s.adapted_base) == GLM_ADAPTED == 8_157_921_280 and len(s.adapted_base) == 40 * 6
    p = plan(c, ZERO[2], EstimateConfig(num_gpus=1, gpu_memory_gb=80), s)
    assert p["components"]["lora_merge_copy"] == 2 * GLM_ADAPTED == 16_315_842_560  # 15.20 GiB
    assert p["components"]["rollout_merge"] == 12 * 4096 * 2 * 13696  # gate_up, the largest
    assert "LoRA merge copy (rollout.merge_lora)" in p["notes"]["lora_merge_copy"]
    assert p["merge_copy"]["placement"] == "device"
    small = plan(c, ZERO[2], EstimateConfig(num_gpus=1, gpu_memory_gb=48), s)
    assert small["merge_copy"]["placement"] == "host" and small["components"]["lora_merge_copy"] == 0
    assert small["total_bytes"] == p["total_bytes"] - 2 * GLM_ADAPTED < 48 * GIB


def test_planned_merge_copy_is_what_the_merge_copies(tiny_model_dir):
    """The planner's adapted base weights are the ones merged_lora's BaseCopy holds (the tiny model, fp32)."""
    from glm_grpo_ds.memory.sizes import model_sizes
    from glm_grpo_ds.rollout.merged_lora import adapted_linear_bytes
    from glm_grpo_ds.testing.tiny import lora_policy

    planned = model_sizes(cfg(f"model.path={tiny_model_dir}", "lora.r=4")).adapted_base
    assert planned and 4 * sum(planned) == adapted_linear_bytes(lora_policy(tiny_model_dir, b_std=0))


def test_the_trainer_places_the_merge_copy_from_the_plan_and_leaves_the_config_as_loaded():
    """memory/startup.py: the plan places the copy (auto: where it fits; an explicit choice as set; ZeRO-3 on several
    ranks: none), the config is not changed (the trainer makes its one BaseCopy there), config.json records the
    placement taken, and the startup summary (observability/summary.py) says where the copy is in one line."""
    from glm_grpo_ds.config import to_dict
    from glm_grpo_ds.memory.startup import base_copy_placement, recorded_config
    from glm_grpo_ds.observability.summary import merge_copy_line

    s = dataclasses.replace(sizes(1280, [640, 640]), adapted_base=[1000, 4000])
    for gib, where in ((80, "device"), (1, "host")):
        c = cfg("rollout.merge_lora=true")
        planned = plan(c, ZERO[2], EstimateConfig(num_gpus=1, gpu_memory_gb=gib), s)
        assert base_copy_placement(planned) == where and c.rollout.merge_copy == "auto"
        assert recorded_config(c, where)["rollout"]["merge_copy"] == where
        assert recorded_config(c, where) == {**to_dict(c), "rollout": {**to_dict(c)["rollout"], "merge_copy": where}}
    line = merge_copy_line(c, planned, on_gpu=True)
    assert line.startswith("rollout: LoRA merged for sampling, base copy in pinned host memory (0.0 MiB; ")
    assert "merge_copy=auto: the plan with it on the GPU" in line and "exceeds 1 GiB" in line
    kept = cfg("rollout.merge_lora=true", "rollout.merge_copy=device")
    assert base_copy_placement(plan(kept, ZERO[2], EstimateConfig(num_gpus=1, gpu_memory_gb=1), s)) == "device"
    explicit_z3 = plan(kept, ZERO[3], EstimateConfig(num_gpus=2), s)  # nothing to restore: no copy, even when asked
    assert base_copy_placement(explicit_z3) is None
    assert recorded_config(kept, "device") == to_dict(kept)
    z3 = cfg("rollout.merge_lora=true")
    planned = plan(z3, ZERO[3], EstimateConfig(num_gpus=2), s)
    assert base_copy_placement(planned) is None and recorded_config(z3, None) == to_dict(z3)
    assert z3.rollout.merge_copy == "auto" and "no base copy (ZeRO-3 on 2 ranks" in merge_copy_line(z3, planned, True)
    assert base_copy_placement(None) is None  # merge_lora off: no plan made on ranks > 0, no copy
    assert merge_copy_line(cfg(), planned, True) is None


def test_fused_lora_copies_counted_in_the_rollout():
    """rollout.fuse_lora: per layer the q/k/v adapters' A's concatenated (3 r x hidden) and their block-diagonal
    s*B ((q + k + v outputs) x 3 r), in the adapters' dtype, held beside the KV cache for the rollout."""
    s = sizes(1280, [640, 640])
    base = plan(cfg("lora.r=8"), ZERO[2], EstimateConfig(num_gpus=1), s)
    fused = plan(cfg("lora.r=8", "rollout.fuse_lora=true"), ZERO[2], EstimateConfig(num_gpus=1), s)
    r, hidden, q, kv = 8, 64, 4 * 16, 2 * 16  # TEXT: hidden 64, 4 query heads and 2 kv heads of 16
    lora_bytes = fused["components"]["lora_weights"] // sum(s.lora)
    per_layer = 3 * r * hidden + (q + 2 * kv) * 3 * r
    assert fused["components"]["rollout_fused_lora"] == 4 * per_layer * lora_bytes  # TEXT: 4 layers
    assert fused["phases"]["rollout"] == base["phases"]["rollout"] + 4 * per_layer * lora_bytes
    assert base["components"]["rollout_fused_lora"] == 0
    # only the grouped projections are copied: without q/k/v among the targets, nothing
    mlp = plan(
        cfg("lora.r=8", "rollout.fuse_lora=true", "lora.target_modules=[gate_up_proj, down_proj]"),
        ZERO[2],
        EstimateConfig(num_gpus=1),
        s,
    )
    assert mlp["components"]["rollout_fused_lora"] == 0


def test_fp8_dit_counts_one_byte_per_converted_weight_and_its_quantized_input():
    # decoder 500 params in bf16 = 1000 bytes; with decoder.fp8, 300 of them (40 output rows) as e4m3 + fp32 scales:
    # 200 x 2 + 300 x 1 + 40 x 4 = 860 bytes. The DiT's activations gain the feed-forward's 4 x hidden input
    # quantized: 2 images x 16 tokens x 4 x 4096 x 5 bytes (fp32 copy + e4m3)
    common = ("grpo.group_size=2", "batch.micro_batch_size=2", "decoder.dtype=bf16", "rollout.height=64")
    common += ("rollout.width=64",)
    dit = dataclasses.replace(sizes(1280), vae_full_res_channels=1, dit_hidden=4096, dit_fp8_weights=300)
    dit = dataclasses.replace(dit, dit_fp8_rows=40)
    full, fp8 = (
        plan(cfg(*common, f"decoder.fp8={f}"), ZERO[3], EstimateConfig(num_gpus=1), dit) for f in (False, True)
    )
    assert (full["components"]["decoder"], fp8["components"]["decoder"]) == (1000, 860)
    dit_acts = 2 * 16 * 4096 * 2 * 12
    assert full["components"]["decode_activations"] == dit_acts
    assert fp8["components"]["decode_activations"] == dit_acts + 2 * 16 * 4 * 4096 * 5
    # at load the DiT is in its dtype until converted: 1000 - 860 bytes more + the largest weight's scratch (5 bytes
    # per element of 100), a phase of its own: none without FP8; on the host when the decoder is offloaded
    dit = dataclasses.replace(dit, dit_fp8_largest=100)
    full, fp8 = (
        plan(cfg(*common, f"decoder.fp8={f}"), ZERO[3], EstimateConfig(num_gpus=1), dit) for f in (False, True)
    )
    assert (full["phases"]["load"], fp8["phases"]["load"], fp8["components"]["decoder_fp8_load"]) == (0, 640, 640)
    offloaded = plan(cfg(*common, "decoder.fp8=true", "decoder.offload=true"), ZERO[3], EstimateConfig(num_gpus=1), dit)
    assert (
        offloaded["phases"]["load"] == 0 and offloaded["host_node"]["loading_per_rank"]["decoder_fp8_conversion"] == 640
    )
    # the load comes before the optimizer's first step and the merge copy: its peak leaves them out
    resident = sum(fp8["components"][k] for k in fp8["persistent"] if k != "lora_merge_copy")
    at_load = resident - fp8["components"]["optimizer_states"] + 640
    steps = resident + max(v for k, v in fp8["phases"].items() if k != "load") + fp8["components"]["lora_merge_copy"]
    assert at_load < steps and fp8["total_bytes"] == steps and fp8["peak_phase"] == "decode"
    big = dataclasses.replace(dit, dit_fp8_largest=10**7)  # a conversion scratch larger than any step's transients
    p = plan(cfg(*common, "decoder.fp8=true"), ZERO[3], EstimateConfig(num_gpus=1), big)
    assert p["peak_phase"] == "load" and p["total_bytes"] == at_load - 640 + 140 + 5 * 10**7


def test_fp8_covers_most_of_the_real_dit():
    from glm_grpo_ds.memory.sizes import model_sizes

    s = model_sizes(cfg())  # model.path=x is no pipeline directory: the built-in GLM-Image configs
    # 30 blocks x (4 attention projections 4096^2 + the feed-forward 2 x 4096 x 16384): 6.04 B of the DiT's weights
    assert s.dit_fp8_weights == 30 * (4 * 4096 * 4096 + 2 * 4096 * 16384)
    assert s.dit_fp8_rows == 30 * (4 * 4096 + 16384 + 4096)


def test_one_step_off_holds_the_rollout_and_the_decode_at_once():
    """rollout.one_step_off: the next step's rollout runs beside this step's decode and rewards, so a phase holds
    the rollout's transients plus the larger of the decode's and the reward's; on-policy plans lack it. The
    measured decode peak (the device's, with the rollout beside it) is planned from it."""
    from glm_grpo_ds.memory.phases import phase_totals

    common = ("grpo.group_size=2", "batch.micro_batch_size=2", "rollout.height=64", "rollout.width=64")
    on = plan(cfg(*common, "grpo.sampler_correction=token_truncate"), ZERO[2], EstimateConfig(num_gpus=1))
    off = plan(
        cfg(*common, "grpo.sampler_correction=token_truncate", "rollout.one_step_off=true"),
        ZERO[2],
        EstimateConfig(num_gpus=1),
    )
    p = off["phases"]
    assert (
        "rollout_beside_decode" not in on["phases"]
        and {k: v for k, v in p.items() if k in on["phases"]} == on["phases"]
    )
    assert p["rollout_beside_decode"] == p["rollout"] + max(p["decode"], p["reward"]) > max(p["rollout"], p["decode"])
    resident = sum(off["components"][k] for k in off["persistent"])
    assert off["total_bytes"] == resident + max(v for k, v in p.items() if k != "load")
    assert phase_totals(off)["decode"] == resident + p["rollout_beside_decode"]
    assert phase_totals(on)["decode"] == resident + on["phases"]["decode"]


def test_the_world_is_the_ranks_and_a_nodes_host_ram_its_own_ranks(monkeypatch):
    """A hostfile of 2 + 1 GPUs (train --check: ranks=3) shards ZeRO-3 over 3 and plans the host RAM of the
    2-GPU node; a started run of 16 ranks, 8 a node (the launcher's LOCAL_SIZE), plans a node's 8, not 16."""
    from glm_grpo_ds.memory.startup import launched_shape

    c = cfg("lora=null", "optimizer.name=adamw", "grpo.beta=0")
    uneven = plan(c, ZERO[3], EstimateConfig(num_gpus=2, num_nodes=2, ranks=3), sizes(trainable=5010))
    assert uneven["components"]["master_weights"] == 4 * math.ceil(5010 / 3)
    assert uneven["host_node"]["ranks"] == 2
    monkeypatch.setenv("LOCAL_SIZE", "8")
    shape = launched_shape(16, "cuda")
    assert (shape.world, shape.num_gpus, shape.num_nodes) == (16, 8, 2)
    assert plan(c, ZERO[3], shape, sizes(trainable=5010))["host_node"]["ranks"] == 8
    monkeypatch.delenv("LOCAL_SIZE")
    assert launched_shape(2, "cpu").num_gpus == 2  # no launcher: one node of them all


def test_the_judges_forward_is_planned_in_the_reward_phase_beside_its_visit():
    """A vqa judge's scoring forward (memory/reward_models.vlm_scoring, at the reward's batch_size and image_size,
    else its default 8 and the rendered side) is the reward phase's transient, beside the offloaded judge's visit."""
    import torch
    from transformers import Qwen2_5_VLConfig

    from glm_grpo_ds.memory.reward_models import QWEN25_VL_7B, vlm_scoring

    judge = Qwen2_5_VLConfig(**QWEN25_VL_7B)
    judge.dtype = torch.bfloat16
    base = ["model.path=x", "data.train_file=x", "rollout.height=512", "rollout.width=768"]
    offloaded = "rewards=[{name: vqa, args: {model: /nowhere/judge, offload: true, image_size: 448, batch_size: 4}}]"
    p = plan(load_config(None, [*base, offloaded]), ZERO[3], EstimateConfig(num_gpus=2), sizes(1280, [640, 640]))
    comp = p["components"]
    assert comp["reward_scoring"] == vlm_scoring(judge, 4, 448)[0] and comp["reward_offloaded"] == 2 * 8_292_166_656
    assert p["phases"]["reward"] == comp["reward_offloaded"] + comp["reward_scoring"]
    resident = load_config(None, [*base, "rewards=[{name: vqa, args: {model: /nowhere/judge}}]"])
    p = plan(resident, ZERO[3], EstimateConfig(num_gpus=2), sizes(1280, [640, 640]))
    assert p["phases"]["reward"] == p["components"]["reward_scoring"] == vlm_scoring(judge, 8, 768)[0]
    clip = load_config(None, [*base, "rewards=[{name: clip, args: {model: /m/clip-vit-base-patch32}}]"])
    assert plan(clip, ZERO[3], EstimateConfig(num_gpus=2), sizes(1280, [640, 640]))["phases"]["reward"] == 0


def test_a_judge_the_plan_cannot_count_is_said_not_estimated(tmp_path):
    """A judge that tiles its images in its own way (LLaVA here) gets no scoring figure, and the plan says so."""
    from transformers import LlavaConfig

    LlavaConfig().save_pretrained(tmp_path / "llava")
    c = load_config(
        None, ["model.path=x", "data.train_file=x", f"rewards=[{{name: vqa, args: {{model: {tmp_path}/llava}}}}]"]
    )
    p = plan(c, ZERO[3], EstimateConfig(num_gpus=2), sizes(1280, [640, 640]))
    (judge,) = p["rewards"]
    assert p["components"]["reward_scoring"] == 0 and judge["scoring"] == 0
    assert "its scoring forward not estimated (model_type llava; the plan counts qwen2_vl" in judge["note"]


def test_the_diversity_features_backbone_is_planned_on_every_gpu(tmp_path):
    """grpo.diversity_features: pixels hold no model; a backbone is whole on every GPU (after its first call), sized
    from its config.json, or as DINOv2-L (ViT-L/14, ~300 M parameters in its paper) when it is not here."""
    import torch
    from transformers import Dinov2Config

    base = ["model.path=x", "data.train_file=x", "rewards=[{name: pixel_mse}]"]

    def planned(features):
        c = load_config(None, [*base, f"grpo.diversity_features={features}"])
        p = plan(c, ZERO[3], EstimateConfig(num_gpus=2), sizes(1280, [640, 640]))
        return p, {r["name"]: r for r in p["rewards"]}["diversity_features"]

    p, entry = planned("pixels")
    assert entry["where"] == "none" and entry["bytes"] == 0 and p["components"]["reward_models"] == 0
    p, entry = planned("/nowhere/dinov2-large")
    assert (
        300e6 < entry["params"] < 310e6
        and entry["bytes"] == 4 * entry["params"]
        and "assumed DINOv2-L" in entry["note"]
    )
    assert p["components"]["reward_models"] == entry["bytes"]
    small = Dinov2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128)
    small.dtype = torch.bfloat16
    small.save_pretrained(tmp_path / "dino")
    p, entry = planned(tmp_path / "dino")
    from transformers import Dinov2Model

    assert entry["params"] == sum(t.numel() for t in Dinov2Model(small).parameters())  # its own config, not DINOv2-L's
    assert entry["bytes"] == 2 * entry["params"] and "dino's config.json" in entry["note"]  # in its dtype


def test_the_diversity_features_forward_is_planned_in_the_reward_phase(tmp_path):
    """The backbone's forward over a rank's images at 224 px, by hand: pixels plus one layer's working set per token
    (257 = 16^2 patches + the class token; hidden x 3, the MLP x 2), in the model's dtype; the larger of it and a
    judge's forward is the reward phase's transient; a backbone outside the counted ViTs is said not estimated."""
    import torch
    from transformers import CLIPVisionConfig, Dinov2Config

    base = ["model.path=x", "data.train_file=x", "grpo.group_size=8", "batch.prompts_per_rank=3"]

    def planned(features, rewards="[{name: pixel_mse}]"):
        c = load_config(None, [*base, f"rewards={rewards}", f"grpo.diversity_features={features}"])
        p = plan(c, ZERO[3], EstimateConfig(num_gpus=2), sizes(1280, [640, 640]))
        return p, {r["name"]: r for r in p["rewards"]}["diversity_features"]

    p, entry = planned("/nowhere/dinov2-large")  # DINOv2-L: 1024 wide, MLP 4096, fp32
    assert entry["scoring"] == 24 * (3 * 224**2 + 257 * (3 * 1024 + 2 * 4096)) * 4 == 292_356_096
    assert p["components"]["reward_scoring"] == entry["scoring"] and "forward over 24 images" in entry["note"]
    small = Dinov2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, patch_size=16)
    small.dtype = torch.bfloat16
    small.save_pretrained(tmp_path / "dino")
    assert planned(tmp_path / "dino")[1]["scoring"] == 24 * (3 * 224**2 + 197 * (3 * 64 + 2 * 256)) * 2
    CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_attention_heads=2).save_pretrained(tmp_path / "clip")
    p, entry = planned(tmp_path / "clip")
    assert entry["scoring"] == 0 and p["components"]["reward_scoring"] == 0
    assert "its forward not estimated (model_type clip_vision_model; the plan counts dinov2" in entry["note"]
    p, entry = planned(tmp_path / "dino", "[{name: vqa, args: {model: /nowhere/judge}}]")
    assert p["components"]["reward_scoring"] > entry["scoring"] > 0  # the judge's 7B forward is the larger

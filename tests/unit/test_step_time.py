"""The planned time of a step (glm_grpo_ds/memory/step_time.py) by hand from its H200 anchors: the image decode
counted at the config's size, steps and guidance, the rollout at the config's decode-step variant and rows (the
computed roofline model: the KV reads grow with rows, the weight read does not, until compute binds), the update at
its ZeRO stage; the measured full-size step it must reproduce; and the memory plan's KV cache of every row."""

import json
from pathlib import Path

import pytest

from glm_grpo_ds.config import load_config
from glm_grpo_ds.memory import step_time as st
from glm_grpo_ds.memory.plan import EstimateConfig, grid_tokens, plan
from glm_grpo_ds.memory.sizes import Sizes
from glm_grpo_ds.memory.step_time import decode_step_ms, describe, step_time

ROOT = Path(__file__).resolve().parents[2]


def cfg(config="launch/configs/glm_image_lora.yaml", *overrides):
    return load_config(ROOT / config, list(overrides))


def test_decode_is_images_x_steps_x_the_guided_image_step_scaled_by_latent_tokens():
    t = step_time(cfg(), 2, grid_tokens(1024, 1024))  # G=16, 30 steps, guidance 1.5, 1024x1024
    # 60 forwards of 0.289 / 2 s an image, less 15: the first unconditional pass runs once for the group of 16
    assert t.decode_s == pytest.approx((16 * 60 - 15) * 0.289 / 2)
    assert "16 images x 60 DiT forwards (30 steps, 30 guided) - 15 (the first unconditional pass" in t.parts["decode"]
    unguided = step_time(cfg("launch/configs/glm_image_lora.yaml", "decoder.guidance_scale=1.0"), 2, 1280)
    assert unguided.decode_s == pytest.approx(16 * 30 * 0.289 / 2)  # one DiT forward a step, nothing shared
    small = step_time(cfg("launch/configs/glm_image_lora.yaml", "rollout.height=512", "rollout.width=512"), 2, 320)
    assert small.decode_s == pytest.approx(t.decode_s / 4)  # a quarter of the latent tokens
    # guidance on the first 10 of 30 steps: 30 conditional + 10 unconditional forwards of 0.289 / 2 s; 2 prompts
    # per rank: 2 groups, each 15 forwards fewer
    early = step_time(
        cfg("launch/configs/glm_image_lora.yaml", "decoder.guidance_steps=10", "batch.prompts_per_rank=2"), 2, 1280
    )
    assert (
        early.decode_s == pytest.approx((32 * 40 - 2 * 15) * 0.289 / 2)
        and "40 DiT forwards (30 steps, 10 guided) - 30" in (early.parts["decode"])
    )
    assert "not yet measured" not in t.parts["decode"]
    fast = step_time(cfg("launch/configs/glm_image_lora.yaml", "decoder.compile=true", "decoder.fp8=true"), 2, 1280)
    assert fast.decode_s == t.decode_s  # the DiT's options no GPU has timed: the eager figure, and the line says so
    assert fast.parts["decode"].endswith(
        ", decoder.compile + decoder.fp8: not yet measured, counted as the eager sdpa decode"
    )
    # 16 rows over 128 + 320 cache slots instead of the measured 1 408: 16 x 960 slots x 40 960 B less KV to read
    assert small.rollout_s == pytest.approx(320 * (19.3 - 16 * 960 * 40960 / 4.8e9) / 1000)


def test_rollout_follows_the_variant_and_update_the_stage():
    plain = step_time(cfg("launch/configs/glm_image_lora.yaml", "rollout.cuda_graph=false"), 3, 1280)
    assert plain.rollout_s == pytest.approx(1280 * 75.7 / 1000)  # the eager loop, LoRA unmerged
    fast = step_time(
        cfg(
            "launch/configs/glm_image_lora.yaml",
            "rollout.fuse_lora=false",
            "rollout.merge_lora=true",
            "rollout.compile=true",
        ),
        3,
        1280,
    )
    assert fast.rollout_s == pytest.approx(1280 * 9.4 / 1000)
    assert plain.update_s == pytest.approx(20.2) and step_time(cfg(), 2, 1280).update_s == pytest.approx(4.85)
    full = step_time(cfg("launch/configs/glm_image_full.yaml"), 3, 1280)
    assert full.update_s is None and "full fine-tuning: not measured" in describe(full)
    # its total leaves the update out, and says so where the total is read (issue #61)
    assert describe(full).startswith(
        f"planned time per step on one H200: ~{full.total_s:.0f} s + the update (not measured) ="
    )
    assert "+ the update" not in describe(plain)


def test_the_measured_full_size_step_is_reproduced():
    # H200, GLM-Image at full size, ZeRO-2, G=16, 1024x1024, 8 guided DiT steps, merged + graph + compiled layers:
    # 58.2 s = rollout 15.4 (a first compile of ~3-4 s in it) + decode 37.0 + update 5.6
    t = step_time(
        cfg(
            "launch/configs/gpu_check.yaml",
            "grpo.group_size=16",
            "decoder.num_inference_steps=8",
            "decoder.guidance_scale=1.5",
            "rollout.fuse_lora=false",
            "rollout.merge_lora=true",
            "rollout.compile=true",
        ),
        2,
        grid_tokens(1024, 1024),
    )
    # the measured 37.0 s (16 x 16 forwards), less the 15 forwards the first unconditional pass now shares
    assert t.decode_s == pytest.approx((16 * 16 - 15) * 0.1445, abs=0.01) == pytest.approx(34.8, abs=0.1)
    assert 0.75 * 58.2 <= t.total_s <= 58.2
    assert "image decode 34.8 s" in describe(t) and "not counted: rewards" in describe(t)


def test_the_full_size_ar_constants_are_glm_images():
    """What a decode step reads and computes, from transformers' GlmImageConfig sizes by hand: per layer q, k, v
    (2 KV heads x 128) with biases, o, the fused gate/up and down projections, 4 norms; the embedding, final norm
    and lm_head (16 512 x 4096)."""
    h, kv, inter = 4096, 2 * 128, 13696
    layer = (h * h + h) + 2 * (kv * h + kv) + h * h + 2 * inter * h + h * inter + 4 * h
    embedding = 168064 * h
    assert st.AR_WEIGHT_BYTES == 2 * (40 * layer + embedding + h + 16512 * h)  # 17.83 GB in bf16
    assert st.AR_MATMUL_PARAMS == 40 * layer + h + 16512 * h
    # 18.75 GB a step at 16 rows: the roofline, 3.91 ms at 4.8 TB/s
    assert st.roofline_ms(16, 1408) == pytest.approx((st.AR_WEIGHT_BYTES + 16 * 1408 * 40960) / 4.8e9)
    assert st.roofline_ms(16, 1408) == pytest.approx(3.9067, abs=1e-4)
    # the layers, heads and head dim step_time reads: memory/sizes.py's statement of them, transformers' config's
    from transformers import GlmImageConfig

    from glm_grpo_ds.memory.sizes import FULL_AR_TEXT, text_sizes

    assert text_sizes(GlmImageConfig().text_config) == FULL_AR_TEXT
    t = FULL_AR_TEXT
    assert (t["layers"], t["kv_heads"], t["head_dim"], t["heads"], t["hidden"], t["vision_vocab"]) == (
        40, 2, 128, 32, 4096, 16512
    )  # fmt: skip
    assert st.KV_BYTES_PER_SLOT == 2 * 40 * 2 * 128 * 2 == 40960 and st.ATTENTION_FLOPS_PER_SLOT == 4 * 32 * 128 * 40


def test_more_rows_cost_their_kv_reads_until_compute_binds():
    merged = ("compiled", True)  # graph + compiled layers, LoRA merged: 9.4 ms measured at 16 rows
    assert decode_step_ms(merged, 16) == pytest.approx(9.4)  # the anchor itself
    # 16 -> 64 rows: the weights are read once either way; 48 more rows' KV caches (1 408 slots x 40 960 B each)
    at64 = 9.4 + 48 * 1408 * 40960 / 4.8e9
    assert decode_step_ms(merged, 64) == pytest.approx(at64) == pytest.approx(9.977, abs=1e-3)
    assert decode_step_ms(merged, 64) < 1.1 * 9.4  # far less than 4x the 16-row step
    per_image = {rows: decode_step_ms(merged, rows) * 1280 / rows / 1000 for rows in (16, 64)}
    assert per_image[16] == pytest.approx(0.752) and per_image[64] == pytest.approx(0.1996, abs=1e-4)  # < 0.3 s
    # fewer rows read less KV; the rows' FLOPs (17.4 GFLOP a row: 2 x 8.23 G parameters + 1 408 x 655 360 of
    # attention; 17.6 us at 989 TFLOP/s) stay under the reads' time until ~669 rows
    flops_per_row = 2 * 8_226_398_208 + 1408 * 4 * 32 * 128 * 40
    per_row_compute, per_row_read = flops_per_row / 989e12, 1408 * 40960 / 4.8e12
    bound = 17_829_576_704 / 4.8e12 / (per_row_compute - per_row_read)
    assert st.compute_bound_rows(1408) == pytest.approx(bound) == pytest.approx(668.8, abs=0.1)
    assert decode_step_ms(merged, 600) == pytest.approx(9.4 + 584 * per_row_read * 1e3)  # still reads only
    # beyond the bound each row costs its compute: linear in rows from there
    assert decode_step_ms(merged, 2000) - decode_step_ms(merged, 1000) == pytest.approx(1000 * per_row_compute * 1e3)
    overhead = 9.4 - (17_829_576_704 + 16 * 1408 * 40960) / 4.8e9  # the measured step above its 16-row roofline
    assert decode_step_ms(merged, 1000) == pytest.approx(overhead + 1000 * per_row_compute * 1e3)


def test_prompts_per_rank_puts_more_rows_in_one_decode_step():
    """batch.prompts_per_rank x G rows decode as one batch: 4 prompts' groups at G=16 cost one 64-row step per token,
    not four 16-row ones; the image decode and the update scale with the images."""
    one = step_time(
        cfg(
            "launch/configs/gpu_check.yaml", "grpo.group_size=16", "rollout.fuse_lora=false", "rollout.merge_lora=true"
        ),
        2,
        1280,
    )
    four = step_time(
        cfg(
            "launch/configs/gpu_check.yaml",
            "grpo.group_size=16",
            "rollout.fuse_lora=false",
            "rollout.merge_lora=true",
            "batch.prompts_per_rank=4",
        ),
        2,
        1280,
    )
    assert one.rollout_s == pytest.approx(1280 * 13.0 / 1000)  # graph, merged, 16 rows: as measured
    assert four.rollout_s == pytest.approx(1280 * (13.0 + 48 * 1408 * 40960 / 4.8e9) / 1000)
    assert four.decode_s == pytest.approx(4 * one.decode_s) and four.update_s == pytest.approx(4 * one.update_s)
    assert "at 64 rows (computed from the 16-row measurement)" in describe(four)
    assert "rows" not in describe(one).split("rollout: ")[1].split(";")[0]


def test_the_memory_plan_counts_the_kv_cache_of_every_row():
    """The plan's rollout KV cache is prompts_per_rank x G rows of (prompt + generated) slots at GLM-Image's KV
    width: the bytes the step-time model reads per row and slot."""
    text = dict(layers=40, hidden=4096, intermediate=13696, heads=32, kv_heads=2, head_dim=128, vision_vocab=16512)
    sizes = Sizes(
        ar_base=[1000], lora=[64], trainable=64, largest_trainable=64, decoder=500, dit_hidden=32, text=text, source="t"
    )
    zero2 = json.loads((ROOT / "ds_configs" / "zero2.json").read_text())

    def kv(prompts_per_rank):
        overrides = [f"batch.prompts_per_rank={prompts_per_rank}", "rewards=[{name: pixel_mse}]"]  # no model to size
        c = cfg("launch/configs/glm_image_lora.yaml", *overrides)
        return plan(c, zero2, EstimateConfig(num_gpus=1), sizes)["components"]["rollout_kv_cache"]

    assert kv(1) == 16 * (128 + 1280) * st.KV_BYTES_PER_SLOT == 16 * 57_671_680  # 0.92 GB at G=16, 1024x1024
    assert kv(4) == 4 * kv(1) and kv(8) == 128 * 1408 * 40960  # 7.4 GB at 128 rows


def test_a_runs_measured_steps_per_phase_per_image_and_per_gpu_second(tmp_path, capsys):
    """launch/gpu_timing.sh's report of its training steps: the phases of metrics.jsonl, their sum, per image and
    images per GPU-second (16 images a step here), the plan beside; records without times (eval) left out."""
    import json

    from glm_grpo_ds.memory.step_time import main

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(
        json.dumps({"train": {"grpo": {"group_size": 8}, "batch": {"prompts_per_rank": 2}}})
    )
    steps = [
        {"step": 1, "time/rollout": 20.0, "time/decode": 37.0, "time/reward": 0.4, "time/update": 6.6},
        {"step": 2, "time/rollout": 15.4, "time/decode": 37.0, "time/reward": 0.4, "time/update": 5.6},
        {"step": 2, "eval/reward": 0.5},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"step_time": {"total_s": 52.0, "rollout_s": 10.0, "decode_s": 37.0, "update_s": 5.0}}))
    assert main([str(run), str(plan)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["step", "rollout", "s", "decode", "s", "reward", "s", "update", "s", "step", "s"] + [
        "s/image",
        "images/GPU-s",
    ]
    # 64.0 s / 16 images = 4.000 s an image, 0.250 images a second; 58.4 s: 3.650, 0.274
    assert out[1].split() == ["1", "20.00", "37.00", "0.40", "6.60", "64.00", "4.000", "0.250"]
    assert out[2].split() == ["2", "15.40", "37.00", "0.40", "5.60", "58.40", "3.650", "0.274"]
    assert out[3].split() == ["plan", "10.00", "37.00", "-", "5.00", "52.00", "3.250", "0.308"]
    assert out[-1] == "16 images per step and GPU" and len(out) == 6
    assert main([str(tmp_path / "nowhere")]) == 2 and "config.json" in capsys.readouterr().err


def test_one_step_off_plans_the_rollout_beside_the_decode():
    """rollout.one_step_off: the step is the longer of rollout and decode, plus the update (the gain's upper bound:
    the two sharing the GPU without slowing each other); the printed line says so."""
    serial = step_time(cfg(), 2, 1280)
    off = step_time(cfg(ROOT / "launch/configs/glm_image_lora.yaml", "rollout.one_step_off=true",
                        "grpo.sampler_correction=token_truncate"), 2, 1280)  # fmt: skip
    assert (off.rollout_s, off.decode_s, off.update_s) == (serial.rollout_s, serial.decode_s, serial.update_s)
    assert serial.total_s == pytest.approx(serial.rollout_s + serial.decode_s + serial.update_s)
    assert off.total_s == pytest.approx(max(off.rollout_s, off.decode_s) + off.update_s)
    assert " beside image decode " in describe(off) and "one step off" in describe(off)


def test_measured_steps_one_step_off_count_the_wait_not_the_overlapped_rollout():
    # step 1 sampled on-policy (its rollout on the path), step 2 took a rollout drawn beside step 1
    base = {"time/decode": 3.0, "time/reward": 1.0, "time/update": 2.0, "time/rollout_wait": 0.5}
    records = [
        {"step": 1, "time/rollout": 4.0, "rollout_overlapped": False, **base},
        {"step": 2, "time/rollout": 4.0, "rollout_overlapped": True, **base},
        {"step": 3, "time/rollout": 4.0, "time/decode": 3.0, "time/reward": 1.0, "time/update": 2.0},  # on-policy
    ]
    lines = st.measured_lines(records, images=4)
    totals = [float(line.split()[5]) for line in lines[1:4]]
    assert totals == [10.5, 6.5, 10.0]  # 4 + 3 + 1 + 2 (+ 0.5 waited); the overlapped rollout off the path
    assert any("one_step_off" in line for line in lines)


def _run_dir(path, records, group_size=16):
    import json

    path.mkdir()
    (path / "config.json").write_text(
        json.dumps({"train": {"grpo": {"group_size": group_size}, "batch": {"prompts_per_rank": 1}}})
    )
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_a_serial_and_a_one_step_off_run_compare_on_their_steady_steps(tmp_path, capsys):
    """launch/gpu_timing.sh ONE_STEP_OFF=both: the serial run's steps after its first, the other's overlapped ones;
    the steps' means, images per GPU-second, and how much the rollout and the decode slowed each other. By hand."""
    first = {"step": 1, "time/rollout": 20.0, "time/decode": 37.0, "time/reward": 0.4, "time/update": 6.6}
    serial = [
        first,
        {"step": 2, "time/rollout": 15.4, "time/decode": 37.0, "time/reward": 0.4, "time/update": 5.6},
        {"step": 3, "time/rollout": 15.6, "time/decode": 37.0, "time/reward": 0.4, "time/update": 5.4},
    ]
    beside = {"time/rollout": 17.05, "time/decode": 40.7, "time/reward": 0.4, "rollout_overlapped": True}
    off = [
        {**first, "rollout_overlapped": False, "time/rollout_wait": 0.0},
        {"step": 2, **beside, "time/rollout_wait": 0.0, "time/update": 5.6},
        {"step": 3, **beside, "time/rollout_wait": 0.2, "time/update": 5.4},
    ]
    lines = st.compared_lines(serial, off, images=16)
    # serial: 15.5 + 37 + 0.4 + 5.5 = 58.4 s, 16 / 58.4 = 0.274 images a second; one step off: 40.7 + 0.4 + 0.1 +
    # 5.5 = 46.7 s (its rollouts beside the decodes), 0.343; 58.4 / 46.7 = 1.25; 17.05 / 15.5 = 40.7 / 37 = 1.10
    assert lines[1] == (
        "  serial:       step   58.40 s = rollout 15.50 + decode 37.00 + reward 0.40 + update 5.50; "
        "0.274 images/GPU-s (mean of 2)"
    )
    assert lines[2].split()[:6] == ["one", "step", "off:", "step", "46.70", "s"]
    assert "wait 0.10 + update 5.50; 0.343 images/GPU-s (mean of 2)" in lines[2]
    assert "1.25x the serial run's images per GPU-second" in lines[3]
    assert "the rollout took 1.10x its serial seconds, the decode 1.10x" in lines[3]

    a, b = _run_dir(tmp_path / "serial", serial), _run_dir(tmp_path / "off", off)
    assert st.main(["--compare", a, b]) == 0 and capsys.readouterr().out.splitlines() == lines
    assert st.main(["--compare", b, a]) == 2
    assert capsys.readouterr().err.startswith("step_time: the first run drew rollouts one step off: give the serial")
    assert st.main(["--compare", a, _run_dir(tmp_path / "short", serial[:1])]) == 2
    assert "the one step off run has no step to compare: give each run 2 steps" in capsys.readouterr().err
    assert st.main(["--compare", a, _run_dir(tmp_path / "g8", off, group_size=8)]) == 2
    assert "makes 16 images a step and rank" in capsys.readouterr().err
    assert st.main(["--compare", a]) == 2 and "--compare SERIAL_RUN_DIR" in capsys.readouterr().err
    assert st.main(["--compare", a, str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.startswith(f"step_time: {tmp_path / 'nowhere'}: FileNotFoundError")

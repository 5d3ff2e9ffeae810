"""The embedded tiny GLM-Image: builds offline, reloads through diffusers, renders, is deterministic."""

import hashlib
import json

import pytest
import torch
from in_process import glm_grpo  # noqa: E402  (tests/in_process.py)

from glm_grpo_ds.testing import tiny


def _digest(directory):
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.fixture(scope="module")
def pipe(tiny_model_dir):
    from diffusers import GlmImagePipeline

    p = GlmImagePipeline.from_pretrained(tiny_model_dir)
    p.set_progress_bar_config(disable=True)
    return p


def test_directory_is_complete_small_and_deterministic(tiny_model_dir, tmp_path):
    index = json.loads((tiny_model_dir / "model_index.json").read_text())
    for component in (
        "tokenizer",
        "processor",
        "text_encoder",
        "vision_language_encoder",
        "vae",
        "transformer",
        "scheduler",
    ):
        assert component in index and (tiny_model_dir / component).is_dir()
    size = sum(p.stat().st_size for p in tiny_model_dir.rglob("*") if p.is_file())
    assert size < 5 * 1024 * 1024

    again = tiny.build_tiny_pipeline(tmp_path / "again", seed=0)
    assert _digest(again) == _digest(tiny_model_dir)  # byte-identical for the same seed
    other = tiny.build_tiny_pipeline(tmp_path / "other", seed=1)
    differs = {k for k, v in _digest(other).items() if _digest(tiny_model_dir)[k] != v}
    assert "vision_language_encoder/model.safetensors" in differs
    assert "transformer/diffusion_pytorch_model.safetensors" in differs


def test_vocabularies_are_consistent(pipe):
    ar = pipe.vision_language_encoder
    text = ar.config.text_config
    assert ar.lm_head.out_features == text.vision_vocab_size == tiny.VISION_VOCAB_SIZE
    # every id lm_head can produce must exist in the input embedding (it is fed back)
    assert text.vocab_size > text.vision_vocab_size
    # the DiT's prior-token codebook equals the VQ codebook; start/end sit right above it
    assert (
        pipe.transformer.config.prior_vq_quantizer_codebook_size
        == ar.config.vq_config.num_embeddings
        == tiny.CODEBOOK_SIZE
    )
    assert (
        ar.config.image_start_token_id == tiny.CODEBOOK_SIZE and ar.config.image_end_token_id == tiny.CODEBOOK_SIZE + 1
    )
    # eos outside what lm_head can emit: random weights cannot end generation early
    eos = ar.generation_config.eos_token_id
    assert eos >= text.vision_vocab_size and text.eos_token_id >= text.vision_vocab_size
    tok = pipe.processor.tokenizer
    assert tok.convert_tokens_to_ids(tok.bos_token) == ar.config.image_start_token_id
    assert tok.convert_tokens_to_ids(tok.image_token) == ar.config.image_token_id


@pytest.mark.parametrize("height,width,preview", [(64, 64, (16, 16)), (64, 96, (13, 19))])
def test_processor_grids(pipe, height, width, preview):
    msgs = [[{"role": "user", "content": [{"type": "text", "text": p}]}] for p in ("a cat", "a much longer prompt")]
    inputs = pipe.processor.apply_chat_template(
        msgs, tokenize=True, padding=True, target_h=height, target_w=width, return_dict=True, return_tensors="pt"
    )
    grid = [1, height // 32, width // 32]
    assert inputs["image_grid_thw"].tolist() == [grid, [1, *preview]] * 2
    assert inputs["images_per_sample"].tolist() == [2, 2]
    # left padding: every row ends with the image-start token the AR continues from
    assert (inputs["input_ids"][:, -1] == tiny.IMAGE_START_ID).all()
    assert inputs["attention_mask"][0, 0] == 0 and inputs["attention_mask"][1].all()


@pytest.mark.parametrize("height,width", [(64, 64), (64, 96)])
def test_renders_both_sizes_deterministically(pipe, height, width):
    def render(seed):
        g = torch.Generator().manual_seed(seed)
        out = pipe(
            "a sign that says 'HI'", height=height, width=width, num_inference_steps=3, generator=g, output_type="pt"
        )
        return out.images

    a, b = render(0), render(0)
    assert a.shape == (1, 3, height, width)
    assert torch.isfinite(a).all() and a.min() >= 0 and a.max() <= 1
    assert torch.equal(a, b)


def test_prior_tokens_fill_the_grid_with_codebook_ids(pipe):
    prior, _, _ = pipe.generate_prior_tokens(
        prompt=["a", "bb"], height=64, width=96, generator=torch.Generator().manual_seed(0)
    )
    # large grid 2x3 upsampled x2 -> 4x6 = 24 ids per sample, all inside the DiT codebook
    assert prior.shape == (2, 24)
    assert prior.min() >= 0 and prior.max() < tiny.CODEBOOK_SIZE


def test_cli_tiny_model(tmp_path, capfd):
    out = tmp_path / "cli"
    code, stdout, err = glm_grpo(["tiny-model", out, "--seed", "3"], capfd)
    assert code == 0, err
    assert (out / "model_index.json").is_file() and "wrote tiny GLM-Image pipeline" in stdout
    assert glm_grpo(["tiny-model", out, "--seed", "3"], capfd)[0] == 0  # its own directory: written again


def test_tiny_model_and_tiny_data_do_not_write_over_files_they_did_not_write(tmp_path, capfd):
    """A real pipeline (its weights: save_pretrained would delete the shards it does not write) or a prompt folder
    given by mistake is refused in one line; --overwrite writes into it."""
    real = tmp_path / "GLM-Image"
    (real / "transformer").mkdir(parents=True)
    (real / "transformer" / "diffusion_pytorch_model-00001-of-00003.safetensors").write_bytes(b"weights")
    code, _, err = glm_grpo(["tiny-model", real], capfd)
    assert code == 2 and err.strip() == (
        f"glm-grpo tiny-model: {real} holds files glm-grpo tiny-model did not write; give a new or empty directory, "
        "or --overwrite to write into it"
    )
    assert (real / "transformer" / "diffusion_pytorch_model-00001-of-00003.safetensors").read_bytes() == b"weights"
    data = tmp_path / "data"
    data.mkdir()
    (data / "prompts.jsonl").write_text('{"prompt": "mine"}\n')
    config = ["--config", "launch/configs/tiny_cpu.yaml", f"model.path={real}", f"data.train_file={data}/prompts.jsonl"]
    code, _, err = glm_grpo(["tiny-data", *config], capfd)
    assert code == 2 and "holds files glm-grpo tiny-data did not write" in err
    assert (data / "prompts.jsonl").read_text() == '{"prompt": "mine"}\n'
    # other files beside what tiny-data writes are left alone, and do not stop it (a project folder, a venv)
    from glm_grpo_ds.commands.tiny import foreign_files

    (data / "prompts.jsonl").rename(data / "notes.jsonl")
    assert foreign_files(data, "tiny-data", (data / "prompts.jsonl", data / "targets")) is None
    code, stdout, err = glm_grpo(["tiny-model", real, "--overwrite"], capfd)
    assert code == 0 and "wrote tiny GLM-Image pipeline" in stdout, err


def test_cli_render_writes_pngs_and_rejects_bad_size(tiny_model_dir, tmp_path, capfd):
    from PIL import Image

    cmd = ["render", "--model", tiny_model_dir, "--steps", "2"]
    sizes = ["--height", "64", "--width", "96", "--out", tmp_path / "r"]
    code, _, err = glm_grpo(cmd + ["--prompt", "a", "--prompt", "b", *sizes], capfd)
    assert code == 0, err
    pngs = sorted((tmp_path / "r").glob("*.png"))
    assert len(pngs) == 2 and Image.open(pngs[0]).size == (96, 64)
    index = [json.loads(line) for line in (tmp_path / "r" / "index.jsonl").read_text().splitlines()]
    assert [(r["file"], r["prompt"], r["seed"]) for r in index] == [("000.png", "a", 0), ("001.png", "b", 1)]
    assert index[0]["num_inference_steps"] == 2 and (index[0]["height"], index[0]["width"]) == (64, 96)

    # an --out holding that render is refused (nothing touched); --overwrite replaces it, and the index follows
    before = {p.name: p.read_bytes() for p in (tmp_path / "r").iterdir()}
    code, _, err = glm_grpo(cmd + ["--prompt", "c", *sizes], capfd)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"--out {tmp_path / 'r'} already holds 3 file(s) of an earlier render (000.png, 001.png, index.jsonl)" in err
    assert {p.name: p.read_bytes() for p in (tmp_path / "r").iterdir()} == before
    code, _, err = glm_grpo(cmd + ["--prompt", "c", *sizes, "--overwrite"], capfd)
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["000.png", "index.jsonl"]
    assert [json.loads(line)["prompt"] for line in (tmp_path / "r" / "index.jsonl").read_text().splitlines()] == ["c"]

    code, _, err = glm_grpo(cmd + ["--prompt", "a", "--height", "50"], capfd)
    assert code == 2 and "--height 50 must be a positive multiple of 32" in err


def test_full_size_ar_config_is_glm_image_with_the_tiny_vocabulary_layout():
    """`glm-grpo tiny-model --full-size-ar` (GPU benchmarks): the real AR dimensions; built here on
    the meta device only (10 B parameters)."""
    from transformers import GlmImageConfig, GlmImageForConditionalGeneration

    real = GlmImageConfig()
    cfg = tiny.build_ar_config(len(tiny.tiny_vocab()), 0, 0, full_size=True)
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
        "vision_vocab_size",
    ):
        assert getattr(cfg.text_config, key) == getattr(real.text_config, key), key
    assert cfg.vision_config.depth == real.vision_config.depth
    assert cfg.vq_config.num_embeddings == tiny.CODEBOOK_SIZE and cfg.image_start_token_id == tiny.IMAGE_START_ID
    with torch.device("meta"):
        n = sum(p.numel() for p in GlmImageForConditionalGeneration(cfg).parameters())
    assert 10.0e9 < n < 10.3e9


def test_full_size_ar_config_has_a_working_rotary_embedding():
    # transformers' bare GlmImageConfig() has no partial_rotary_factor: its 8/12/12 M-RoPE sections then
    # do not fit the 128-wide heads and the first forward fails (found by the real-width slice, #26)
    from transformers.models.glm_image.modeling_glm_image import GlmImageTextRotaryEmbedding

    text = tiny.build_ar_config(168064, 167841, 167841, full_size=True).text_config
    rope = GlmImageTextRotaryEmbedding(text)
    x = torch.zeros(1, 4, text.hidden_size)
    cos, sin = rope(x, torch.arange(4).expand(3, 1, 4))
    assert cos.shape[-1] == sin.shape[-1] == text.hidden_size // text.num_attention_heads // 2

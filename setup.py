"""Install glm-grpo-ds: ``pip install -e .[dev]`` (README; docs/install.md for GPU containers and offline nodes)."""

import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent


def pinned(path: str) -> dict[str, str]:
    """``{canonical name: "name==version"}`` of a constraints file (comments and blank lines skipped)."""
    pins = {}
    for line in (HERE / path).read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            pins[re.sub(r"[-_.]+", "-", line.split("==", 1)[0]).lower()] = line
    return pins


def tested(requirements: list[str]) -> list[str]:
    """The ``tested`` extra: constraints.txt's pin of each dependency in ``requirements`` (the tested top;
    ``glm-grpo env`` shows it next to the floor)."""
    pins = pinned("constraints.txt")
    names = [re.sub(r"[-_.]+", "-", re.split(r"[<>=!~; \[]", req, maxsplit=1)[0]).lower() for req in requirements]
    return [pins[name] for name in dict.fromkeys(names) if name in pins]


REQUIRES = [
    # a0: NVIDIA's containers carry their own builds of a release as its pre-release (torch 2.11.0a0+ecf3bae40a), which
    # ">=2.11.0" refused: glm-grpo env said too old, and the offline bundle replaced the container's torch
    "torch>=2.11.0a0",
    "torchvision>=0.26.0a0",  # lpips needs it; must match torch's build
    "transformers>=5.23.0",  # GlmImageForConditionalGeneration
    "diffusers>=0.40.0",  # GlmImagePipeline
    # model.path Hub ids (snapshot_download, the `hf download` CLI), model cards (ModelCard), uploads (HfApi)
    "huggingface_hub>=1.31.0",
    "accelerate>=1.13.0",
    "peft>=0.20.0",
    # 0.19.3-0.19.7 read ZeRO-3 gathers on CPU (gloo) before they arrive; 0.19.2 fails LoRA + ZeRO-3 + checkpointing
    "deepspeed>=0.19.8",
    "bitsandbytes>=0.50.0",
    "lpips>=0.1.4",
    "safetensors>=0.8.0",
    "tokenizers>=0.23.1",
    "pillow>=10.4.0",
    "numpy>=2.0.2",
    "pyyaml>=6.0.1",
    "packaging>=24.2",  # glm-grpo env's ranges, glm-grpo wheelhouse's tags (glm_grpo_ds/install/)
    "tqdm>=4.66.5",
    "matplotlib>=3.11.2",  # reward-curve PNG
    "torchmetrics>=1.9.0",  # ssim reward
    "requests>=2.32.3",  # the remote reward's client
    "urllib3>=2.0.7",  # its retries with backoff (urllib3.util.Retry)
    "datasets>=4.8.0",  # prompt sets: parquet / csv / json, save_to_disk directories, Hub datasets
    "pyarrow>=21.0.0",  # the memory-mapped tables datasets reads (glm_grpo_ds/data/tables.py)
    "scipy>=1.14.1",  # rank correlation of glm-grpo decode-agreement (scipy.stats.spearmanr)
]


setup(
    name="glm-grpo-ds",
    version="0.1.0",
    description="GRPO post-training of the GLM-Image autoregressive policy with DeepSpeed",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    # bench_defaults holds data only (no __init__.py) but Python can import it, so setuptools wants it named here
    # (else a 40-line "Package would be ignored" warning at every install)
    packages=[*find_packages(include=["glm_grpo_ds", "glm_grpo_ds.*"]), "glm_grpo_ds.profiling.bench_defaults"],
    include_package_data=True,
    package_data={"glm_grpo_ds.profiling.bench_defaults": ["*.yaml", "*.json"]},
    # Floors: the oldest versions CI tests (constraints-floor.txt, `make test-floor`); the tested top is
    # constraints.txt (the `tested` extra below). docs/install.md says how they were found.
    install_requires=REQUIRES,
    extras_require={
        "tested": tested(REQUIRES),  # the tested top of every dependency: exactly constraints.txt's versions
        "flash": ["flash-attn>=2.7"],  # GPU only, sdpa without it; builds with --no-build-isolation (docs/install.md)
        "ocr": ["rapidocr-onnxruntime>=1.4.4", "rapidfuzz>=3.14.6"],
        # logging.report_to: [tensorboard, wandb] (accelerate's trackers); the other trackers accelerate supports
        # (mlflow, trackio, comet_ml, clearml, dvclive, swanlab, aim) are installed by their own package names
        "tracking": ["tensorboard>=2.18", "wandb>=0.19"],
        "server": ["fastapi>=0.163.2", "uvicorn>=0.54.0"],  # glm-grpo reward-server
        # tests cover the ocr reward, the TensorBoard / W&B trackers and the reward server
        "dev": [
            "pytest>=9.0",
            "pytest-xdist>=3.8",  # make test: 2 workers (tests/conftest.py)
            "filelock>=3.12",  # tests/built_once.py (also a dependency of transformers)
            "ruff>=0.15",
            "rapidocr-onnxruntime>=1.4.4",
            "rapidfuzz>=3.14.6",
            "tensorboard>=2.18",
            "wandb>=0.19",
            "fastapi>=0.163.2",
            "uvicorn>=0.54.0",
            "trl==1.16.0",  # tests compare loss options with TRL's GRPOTrainer (the package never imports it)
        ],
    },
    entry_points={"console_scripts": ["glm-grpo=glm_grpo_ds.commands.cli:console_main"]},
)

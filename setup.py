"""Install glm-grpo-ds: ``pip install -e .[dev]`` (see README for the tested pins in constraints.txt)."""

from setuptools import find_packages, setup

setup(
    name="glm-grpo-ds",
    version="0.1.0",
    description="GRPO post-training of the GLM-Image autoregressive policy with DeepSpeed",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["glm_grpo_ds", "glm_grpo_ds.*"]),
    include_package_data=True,
    package_data={"glm_grpo_ds.commands": ["bench_defaults/*.yaml", "bench_defaults/*.json"]},
    # Lower bounds are the versions the test suite ran with (constraints.txt pins them).
    install_requires=[
        "torch>=2.15.0",
        "torchvision>=0.29.2",  # lpips needs it; must match torch's build
        "transformers>=5.23.0",  # GlmImageForConditionalGeneration
        "diffusers>=0.42.1",  # GlmImagePipeline
        "huggingface_hub>=2.4.0",  # model.path Hub ids: snapshot_download, the `hf download` CLI
        "accelerate>=1.15.0",
        "peft>=0.21.2",
        "huggingface_hub>=2.4.0",  # model cards (ModelCard), uploads (HfApi)
        "deepspeed>=0.19.8",  # >= 0.19.3 needed for LoRA + ZeRO-3 + non-reentrant checkpointing
        "bitsandbytes>=0.50.2",
        "lpips>=0.1.4",
        "safetensors>=0.8.0",
        "tokenizers>=0.23.3",
        "pillow>=10.0",
        "numpy>=1.26",
        "pyyaml>=6.0",
        "tqdm>=4.66",
        "matplotlib>=3.11.2",  # reward-curve PNG
        "torchmetrics>=1.9.0",  # ssim reward
        "requests>=2.32",  # the remote reward's client
        "urllib3>=2.0",  # its retries with backoff (urllib3.util.Retry)
        "datasets>=5.2.0",  # prompt sets: parquet / csv / json, save_to_disk directories, Hub datasets
        "pyarrow>=26.0.1",  # the memory-mapped tables datasets reads (glm_grpo_ds/data/tables.py)
        "scipy>=1.11",  # rank correlation of glm-grpo decode-agreement (scipy.stats.spearmanr)
    ],
    extras_require={
        "flash": ["flash-attn>=2.7"],  # GPU only; sdpa is used without it
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
    entry_points={"console_scripts": ["glm-grpo=glm_grpo_ds.commands.cli:main"]},
)

"""The model plumbing: GLM-Image's AR as the trainer, the samplers and the tools load it.

* glm_image.py: a pipeline directory's layout (the AR's folder, its config), reaching the AR inside peft /
  DeepSpeed wrappers, the ``auto`` model options resolved against the machine and the model's generation config;
* source.py: ``model.path`` (a directory, a Hub id, a revision) -> a local pipeline directory;
* policy.py: the AR loaded as the trainable policy (LoRA or full fine-tuning), the frozen reference, a plain
  sampling model;
* adapters.py: peft's LoraConfig of the ``lora`` section and adapters on disk;
* reference.py: the KL term's reference when ``grpo.ref_sync_steps`` resets it (LoRA's copy, full fine-tuning's mix);
* ema.py: ``lora.ema_decay``'s moving average of the adapter (the evaluations', ``final_adapter_ema/``);
* kept.py: the tensors a checkpoint keeps of those two, read back on every rank alike;
* prompt_layout.py: GLM-Image's text-to-image prompt layout (chat template, grids, left padding);
* token_ids.py: the startup check that every token id the rollout feeds the AR has an embedding row.

Import the modules themselves (this file imports nothing).
"""

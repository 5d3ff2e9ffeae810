"""Config: YAML + dotted overrides into the dataclasses, type conversion, one line per problem."""

import re
import typing

import pytest

from glm_grpo_ds.advantages import COMBINATIONS, ESTIMATORS
from glm_grpo_ds.config import ConfigError, DecoderConfig, GRPOConfig, TrainConfig, load_config
from glm_grpo_ds.grpo import AGGREGATIONS

BASE = ["model.path=/m", "data.train_file=/d.jsonl", "rewards=[{name: pixel_mse}]"]


def test_yaml_and_overrides(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(
        "model: {path: /models/glm}\ndata: {train_file: p.txt}\nrewards: [{name: pixel_mse, weight: 2}]\n"
        "grpo: {group_size: 4, sampling: {temperature: 0.9}}\nbatch: {prompts_per_rank: 2, micro_batch_size: 2}\n"
    )
    cfg = load_config(
        str(cfg_file), ["optimizer.lr=1e-4", "grpo.beta=0", "lora.r=8", "max_steps=3", "decoder.fixed_seeds=true"]
    )
    assert cfg.model.path == "/models/glm" and cfg.grpo.group_size == 4 and cfg.grpo.sampling.temperature == 0.9
    assert cfg.optimizer.lr == 1e-4 and isinstance(cfg.optimizer.lr, float)  # "1e-4" is a string to PyYAML
    assert cfg.grpo.beta == 0.0 and cfg.lora.r == 8 and cfg.max_steps == 3 and cfg.decoder.fixed_seeds is True
    assert cfg.rewards[0].name == "pixel_mse" and cfg.rewards[0].weight == 2.0
    assert cfg.sequences_per_rank == 8


def test_lora_null_is_full_finetuning_and_back():
    assert load_config(None, BASE + ["lora=null"]).lora is None
    cfg = load_config(None, BASE + ["lora=null", "lora.r=4"])
    assert cfg.lora is not None and cfg.lora.r == 4 and cfg.lora.alpha == TrainConfig().lora.alpha
    # `lora=` (an unset shell variable: lora=$X) is refused as `lora:` in a file is, not full fine-tuning
    with pytest.raises(ConfigError, match=r"^lora is empty \(`lora:` with nothing under it, or `lora=`\)"):
        load_config(None, BASE + ["lora="])


def test_an_empty_output_dir_is_refused_and_home_is_expanded_in_the_paths(monkeypatch, tmp_path):
    """output_dir= was the working directory (its config.json overwritten, with overwrite_output_dir its contents
    deleted); a quoted ~ in a path was a directory named ~."""
    with pytest.raises(ConfigError, match=r"^output_dir is empty: give the run's directory"):
        load_config(None, BASE + ["output_dir="])
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = load_config(None, BASE + ["output_dir=~/run", "data.train_file=~/p.jsonl", "eval.file=~/e.jsonl"])
    assert (cfg.output_dir, cfg.data.train_file, cfg.eval.file) == tuple(
        str(tmp_path / name) for name in ("run", "p.jsonl", "e.jsonl")
    )


@pytest.mark.parametrize(
    "override, message",
    [
        ("rewards[0].weight=.nan", "rewards[0].weight must be a finite number, got nan"),
        ("grpo.beta=.inf", "grpo.beta must be >= 0 and finite, got inf"),
        ("grpo.entropy_coef=.inf", "grpo.entropy_coef must be >= 0 and finite, got inf"),
        ("decoder.guidance_scale=.inf", "decoder.guidance_scale must be > 0 and finite"),
        ("grpo.sampling.temperature=.inf", "grpo.sampling.temperature must be > 0 and finite, got inf"),
    ],
)
def test_a_number_that_is_not_finite_is_refused(override, message):
    """A NaN reward weight made every reward undefined and the run blamed the rewards (exit 3 after loading)."""
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        load_config(None, BASE + [override])


def test_a_reward_label_names_metrics_and_tags_so_it_takes_plain_characters():
    assert load_config(None, BASE + ["rewards[0].label=text_v2"]).rewards[0].label == "text_v2"
    with pytest.raises(ConfigError, match=re.escape("rewards[0].label 'my/reward:x': letters, digits, _ . - only")):
        load_config(None, BASE + ["rewards[0].label=my/reward:x"])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["grpo.delta=1.2"], "grpo.delta must be null or above 1 + epsilon_high = 1.2, got 1.2"),
        (["grpo.epsilon_high=0.5", "grpo.delta=1.4"], "grpo.delta must be null or above 1 + epsilon_high = 1.5"),
        (["grpo.off_policy_mask_threshold=-0.1"], "grpo.off_policy_mask_threshold must be null or >= 0 and finite"),
        (["grpo.beta=0", "grpo.kl_bias_correction=true"], "grpo.kl_bias_correction=true weights a KL term that"),
        (["grpo.objective=cispo", "grpo.cispo_max=0"], "grpo.cispo_max must be > 0 and finite, got 0.0"),
        (["grpo.objective=sapo", "grpo.sapo_temperature_pos=inf"], "grpo.sapo_temperature_pos must be > 0 and fini"),
        (["grpo.objective=vespo", "grpo.vespo_lambda_neg=0"], "grpo.vespo_lambda_neg must be > 0 and finite, got 0."),
        (["grpo.objective=vespo", "grpo.vespo_k_pos=-1"], "grpo.vespo_k_pos must be >= 0 and finite, got -1.0"),
        (
            ["grpo.objective=vespo", "grpo.importance_sampling_level=sequence"],
            "grpo.objective=vespo weighs each sequence by the product of its tokens' ratios: set grpo.importance_sam",
        ),
        (
            ["grpo.objective=vespo", "grpo.sampler_correction=sequence_mask"],
            "grpo.objective=vespo weighs each sequence by the product of its tokens' ratios and takes the sampler",
        ),
        (["grpo.objective=ppo"], "grpo.objective: unknown objective 'ppo'"),
        (["grpo.entropy_target=0.5", "grpo.entropy_coef=2"], "grpo.entropy_coef=2.0 starts the adaptive coefficien"),
        (["grpo.entropy_target=-1"], "grpo.entropy_target must be null or >= 0 and finite, got -1.0"),
        (["grpo.entropy_target=1", "grpo.entropy_coef_min=0.5", "grpo.entropy_coef_max=0.1"], "grpo.entropy_coef_min"),
        (["grpo.ref_sync_steps=-1"], "grpo.ref_sync_steps must be >= 0, got -1"),
        (["grpo.ref_sync_steps=5", "grpo.ref_sync_alpha=0"], "grpo.ref_sync_alpha must be in (0, 1], got 0.0"),
        (["grpo.ref_sync_steps=5", "grpo.beta=0"], "grpo.ref_sync_steps=5 resets the reference of a KL term that"),
        (["grpo.ref_sync_alpha=0.5"], "grpo.ref_sync_alpha=0.5 mixes a reference that grpo.ref_sync_steps=0 never"),
        (["grpo.ref_sync_steps=5", "grpo.ref_sync_alpha=0.6"], "grpo.ref_sync_alpha=0.6: a LoRA run's reference"),
    ],
)
def test_the_two_sided_clip_off_policy_mask_and_kl_correction_are_checked(overrides, message):
    """A delta at or under 1 + epsilon_high would cap ratios the clip already bounds; a correction of a KL term
    beta=0 leaves out would do nothing."""
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        load_config(None, BASE + overrides)
    fine = ["grpo.delta=1.5", "grpo.off_policy_mask_threshold=0", "grpo.kl_bias_correction=true", "grpo.beta=0.04"]
    g = load_config(None, BASE + fine).grpo
    assert (g.delta, g.off_policy_mask_threshold, g.kl_bias_correction) == (1.5, 0.0, True)
    full = load_config(None, BASE + ["lora=null", "grpo.ref_sync_steps=5", "grpo.ref_sync_alpha=0.6"]).grpo
    assert (full.ref_sync_steps, full.ref_sync_alpha) == (5, 0.6)  # full fine-tuning mixes the reference model


def test_an_unreadable_config_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"^config file /proc/self/mem cannot be read \("):
        load_config("/proc/self/mem", BASE)


def test_an_empty_or_null_text_field_is_off_and_a_null_number_says_what_to_write(tmp_path):
    # issue #27: `eval.file=` answered "eval.file cannot be null"
    assert load_config(None, BASE + ["eval.file=data/eval.jsonl", "eval.file="]).eval.file == ""
    assert load_config(None, BASE + ["eval.file=null"]).eval.file == ""
    (tmp_path / "c.yaml").write_text("eval:\n  file:\n")
    assert load_config(str(tmp_path / "c.yaml"), BASE).eval.file == ""
    with pytest.raises(ConfigError, match=r"^grpo.beta cannot be null: write a float value \(grpo.beta=VALUE\)"):
        load_config(None, BASE + ["grpo.beta="])
    with pytest.raises(ConfigError, match=r"^max_steps cannot be null: write an int value \(max_steps=VALUE\)"):
        load_config(None, BASE + ["max_steps="])


def test_what_safe_load_changed_silently_is_kept_or_refused_with_the_file_and_line(tmp_path):
    """PyYAML's safe_load kept the last of two `grpo:` sections, read `lora:` with its keys commented out as null
    (full fine-tuning, a reference model), and turned revisions 0777 / 1.10 into "511" / "1.1"."""
    c = tmp_path / "c.yaml"
    c.write_text("grpo: {beta: 0.0, group_size: 4}\nmodel: {path: m}\ngrpo: {num_iterations: 2}\n")
    with pytest.raises(ConfigError, match=r"c.yaml line 3, column 1 is not valid YAML: key 'grpo' is given twice in "):
        load_config(str(c), BASE)
    c.write_text("lora:\n  # r: 8\n")
    with pytest.raises(ConfigError, match=r"^lora is empty \(`lora:` with nothing under it, or `lora=`\): give its"):
        load_config(str(c), BASE)
    assert load_config(str(tmp_path / "c.yaml"), BASE + ["lora=null"]).lora is None  # a command line's null wins
    c.write_text("lora: null\ngrpo:\n")  # null is null; an empty section that is always there: its defaults
    assert load_config(str(c), BASE).lora is None
    c.write_text("model: {revision: 0777}\ndata: {revision: 1.10}\nrewards: [{name: pixel_mse, args: {k: 010}}]\n")
    cfg = load_config(str(c), ["model.path=m", "data.train_file=p.txt", "logging.run_name=1e3", "save_steps=1e3"])
    assert (cfg.model.revision, cfg.data.revision, cfg.logging.run_name) == ("0777", "1.10", "1e3")
    assert cfg.rewards[0].args == {"k": 8} and type(cfg.rewards[0].args["k"]) is int  # free-form: YAML's number
    assert cfg.save_steps == 1000
    c.write_text("save_steps: 1e3\n")  # YAML 1.1 text in a file, a number on the command line: both a number
    assert load_config(str(c), BASE).save_steps == 1000
    with pytest.raises(ConfigError, match=r'^hub.revision must be a string \(quote it: "..."\), got True$'):
        load_config(None, BASE + ["hub.revision=yes"])
    with pytest.raises(ConfigError, match=r"^max_steps must be an integer, got inf$"):
        load_config(None, BASE + ["max_steps=.inf"])
    c.write_bytes(b"model: {path: \xff}\n")
    with pytest.raises(ConfigError, match=r"c.yaml is not UTF-8 text \(invalid start byte at byte 14\)$"):
        load_config(str(c), BASE)
    c.write_text("grpo: {42: 1}\n")
    with pytest.raises(ConfigError, match=r"c.yaml: key 42 is not a name; config keys are text"):
        load_config(str(c), BASE)
    with pytest.raises(ConfigError, match=r"config file .* is a directory; give the YAML file in it"):
        load_config(str(tmp_path), BASE)


def test_an_override_sets_one_entry_of_the_rewards_as_the_errors_name_it(tmp_path):
    """Errors name rewards[0].weight, but the command line refused that spelling (a sweep over one reward's weight
    had to repeat the whole list)."""
    (tmp_path / "c.yaml").write_text("rewards:\n  - {name: pixel_mse}\n  - {name: ssim, args: {win: 7}}\n")
    cfg = load_config(str(tmp_path / "c.yaml"), BASE[:2] + ["rewards[1].weight=0.5", "rewards[1].args.win=3"])
    assert [(r.name, r.weight, r.args) for r in cfg.rewards] == [("pixel_mse", 1.0, {}), ("ssim", 0.5, {"win": 3})]
    cfg = load_config(str(tmp_path / "c.yaml"), BASE[:2] + ["rewards[0]={name: lpips}"])
    assert [r.name for r in cfg.rewards] == ["lpips", "ssim"]
    with pytest.raises(ConfigError, match=r"^rewards\[2\]: the config has 2 rewards entries before this override; "):
        load_config(str(tmp_path / "c.yaml"), BASE[:2] + ["rewards[2].weight=1"])
    with pytest.raises(ConfigError, match=r"^unknown config key 'rewards\[0\].wieght'; did you mean 'rewards\[0\]"):
        load_config(str(tmp_path / "c.yaml"), BASE[:2] + ["rewards[0].wieght=1"])


def test_unknown_key_suggests_close_match():
    with pytest.raises(
        ConfigError, match=r"unknown config key 'grpo\.betta'; did you mean 'grpo\.beta', 'grpo\.delta'\?"
    ):
        load_config(None, BASE + ["grpo.betta=0.1"])
    with pytest.raises(ConfigError, match="did you mean 'optimizer'"):
        load_config(None, BASE + ["optimiser.lr=1"])


def test_type_errors_name_the_key():
    with pytest.raises(ConfigError, match="grpo.group_size must be an integer"):
        load_config(None, BASE + ["grpo.group_size=many"])
    with pytest.raises(ConfigError, match="model.gradient_checkpointing must be true or false"):
        load_config(None, BASE + ["model.gradient_checkpointing=maybe"])
    # every one at once, as the other problems (the first alone was said, the next one at the next launch)
    with pytest.raises(ConfigError) as err:
        load_config(None, BASE + ["max_steps=abc", "seed=xyz", "grpo.group_size=many"])
    assert sorted(str(err.value).splitlines()) == [
        "grpo.group_size must be an integer, got 'many'",
        "max_steps must be an integer, got 'abc'",
        "seed must be an integer, got 'xyz'",
    ]


def test_validation_reports_every_problem_one_line_each():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["grpo.group_size=8", "batch.micro_batch_size=3", "rollout.height=100", "optimizer.name=sgd"])
    lines = str(err.value).splitlines()
    assert any(line.startswith("model.path is required") for line in lines)
    assert any(line.startswith("data.train_file is required") for line in lines)
    assert any("batch.micro_batch_size=3 must divide" in line for line in lines)
    assert any(line.startswith("rollout.height=100 must be a positive multiple of 32") for line in lines)
    assert "optimizer.name: unknown optimizer 'sgd'; known: adamw, adamw_8bit, paged_adamw_8bit" in lines
    assert any(line.startswith("rewards: at least one reward") for line in lines)


def test_bad_yaml_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  path: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad.yaml line \d+, column \d+ is not valid YAML"):
        load_config(str(bad))
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["grpo.beta"])


# Every choice field: (override, the one-line error it gives).
BAD_CHOICES = [
    ("model.dtype=bf17", "model.dtype: unknown dtype 'bf17'; did you mean 'bf16'? known: auto, bf16, fp32, fp16"),
    (
        "model.attn_implementation=flash",
        "model.attn_implementation: unknown attention implementation 'flash'; "
        "known: auto, sdpa, eager, flash_attention_2",
    ),
    (
        "decoder.dtype=float32",
        "decoder.dtype: unknown dtype 'float32'; did you mean 'fp32'? known: auto, bf16, fp32, fp16",
    ),
    ("optimizer.name=sgd", "optimizer.name: unknown optimizer 'sgd'; known: adamw, adamw_8bit, paged_adamw_8bit"),
    (
        "optimizer.schedule=cosin",
        "optimizer.schedule: unknown schedule 'cosin'; did you mean 'cosine'? known: constant, linear, cosine",
    ),
    ("logging.wandb_mode=cloud", "logging.wandb_mode: unknown wandb mode 'cloud'; known: offline, online"),
    (
        "logging.report_to=[wandb, tensorbord]",
        "logging.report_to[1]: unknown tracker 'tensorbord'; did you mean 'tensorboard'? known: tensorboard, wandb, "
        "mlflow, trackio, comet_ml, clearml, dvclive, swanlab, aim, all, none",
    ),
    ("grpo.aggregation=sum", "grpo.aggregation: unknown aggregation 'sum'; known: token_mean, seq_mean, dr_grpo"),
    (
        "grpo.advantage_estimator=grop",
        "grpo.advantage_estimator: unknown advantage estimator 'grop'; did you mean 'group'? known: group, batch, "
        "none, rloo",
    ),
    (
        "grpo.reward_combination=sum",
        "grpo.reward_combination: unknown reward combination 'sum'; known: sum_then_normalize, normalize_then_sum, "
        "win_rate, win_rate_per_reward",
    ),
]


@pytest.mark.parametrize("override,message", BAD_CHOICES, ids=[o.split("=")[0] for o, _ in BAD_CHOICES])
def test_bad_choice_is_one_line_naming_key_value_and_choices(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, BASE + [override])
    assert str(err.value) == message


def test_bad_choice_did_you_mean_and_every_problem_still_reported():
    with pytest.raises(ConfigError) as err:
        load_config(None, BASE + ["grpo.aggregation=dr_grop", "optimizer.schedule=linaer", "grpo.beta=-1"])
    assert sorted(str(err.value).splitlines()) == [
        "grpo.aggregation: unknown aggregation 'dr_grop'; did you mean 'dr_grpo'? known: token_mean, seq_mean, dr_grpo",
        "grpo.beta must be >= 0 and finite, got -1.0",
        "optimizer.schedule: unknown schedule 'linaer'; did you mean 'linear'? known: constant, linear, cosine",
    ]
    with pytest.raises(ConfigError, match=r"^grpo\.aggregation must be a string, got \['token_mean'\]$"):
        load_config(None, BASE + ["grpo.aggregation=[token_mean]"])


def test_decoder_config_checks_its_choice_outside_the_loader():
    with pytest.raises(
        ValueError, match=r"^decoder\.dtype: unknown dtype 'bf17'; did you mean 'bf16'\? known: auto, bf16, fp32, fp16$"
    ):
        DecoderConfig(dtype="bf17").validate()


def test_math_variant_choices_are_the_registry_names(monkeypatch):
    hints = typing.get_type_hints(GRPOConfig)
    assert typing.get_args(hints["aggregation"]) == tuple(AGGREGATIONS) == ("token_mean", "seq_mean", "dr_grpo")
    assert typing.get_args(hints["advantage_estimator"]) == tuple(ESTIMATORS) == ("group", "batch", "none", "rloo")
    assert (
        typing.get_args(hints["reward_combination"])
        == tuple(COMBINATIONS)
        == ("sum_then_normalize", "normalize_then_sum", "win_rate", "win_rate_per_reward")
    )
    # a registered variant is a valid config value at once: the registry is the one list of names
    monkeypatch.setitem(AGGREGATIONS, "my_mean", AGGREGATIONS["token_mean"])
    assert load_config(None, BASE + ["grpo.aggregation=my_mean"]).grpo.aggregation == "my_mean"
    # the leave-one-out estimator is selected like the others
    assert load_config(None, BASE + ["grpo.advantage_estimator=rloo"]).grpo.advantage_estimator == "rloo"


def test_a_renamed_key_is_read_under_its_old_name_with_one_warning(tmp_path, monkeypatch):
    """grpo.advantage_scale (until 2026-11-26) is grpo.advantage_estimator: old YAML files and command lines still
    load, with a warning naming the new key; both names at once are refused."""
    import logging

    from glm_grpo_ds.runtime import log

    monkeypatch.setattr(log, "_warned", set())
    seen = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage())
    monkeypatch.setattr(log._LOGGER, "handlers", [*log._LOGGER.handlers, handler])
    assert load_config(None, BASE + ["grpo.advantage_scale=rloo"]).grpo.advantage_estimator == "rloo"
    assert seen == ["glm-grpo: warning: grpo.advantage_scale is now grpo.advantage_estimator; write the new name"]
    old = tmp_path / "old.yaml"
    old.write_text("grpo:\n  advantage_scale: batch\n")
    assert load_config(str(old), BASE).grpo.advantage_estimator == "batch"
    both = tmp_path / "both.yaml"
    both.write_text("grpo:\n  advantage_scale: batch\n  advantage_estimator: group\n")
    with pytest.raises(ConfigError, match="give grpo.advantage_estimator only"):
        load_config(str(both), BASE)
    with pytest.raises(ConfigError, match="give grpo.advantage_estimator only"):  # on the command line too
        load_config(None, BASE + ["grpo.advantage_estimator=none", "grpo.advantage_scale=batch"])


# ----------------------------------------------------------------------------- command lines
def _train_args(argv):
    from glm_grpo_ds.config.arguments import parse_train_args as parse_args

    return parse_args(argv)


def test_overrides_may_come_before_between_and_after_options():
    args = _train_args(["max_steps=2", "--config", "C.yaml", "grpo.beta=0", "--deepspeed", "D.json", "lora.r=4"])
    assert (args.config, args.deepspeed) == ("C.yaml", "D.json")
    assert args.overrides == ["max_steps=2", "grpo.beta=0", "lora.r=4"]
    # the deepspeed launcher puts --local_rank first
    assert _train_args(["--local_rank=0", "x=1", "--deepspeed", "D.json"]).overrides == ["x=1"]


def test_the_jobs_shape_without_check_is_refused_not_ignored(capsys):
    """`glm-grpo train --num-gpus 8` ran one process, silently: those flags only describe the job to --check."""
    with pytest.raises(SystemExit) as err:
        _train_args(["--deepspeed", "D.json", "--num-gpus", "8", "--gpu-memory-gb", "40"])
    assert err.value.code == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.startswith("glm-grpo train: error: --num-gpus, --gpu-memory-gb describe the job for --check only;")
    assert "deepspeed --num_gpus N --module glm_grpo_ds.train" in line
    checked = _train_args(["--check", "--deepspeed", "D.json", "--num-gpus", "8"])
    assert (checked.num_gpus, checked.gpu_memory_gb) == (8, None)  # None: the planner's GPU (preflight.cluster_shape)
    with pytest.raises(SystemExit):
        _train_args(["--check", "--deepspeed", "D.json", "--gpu-memory-gb", "nan"])


@pytest.mark.parametrize(
    "argv,hint",
    [
        (
            ["--max_steps", "3"],
            "unknown option --max_steps; config keys are overrides without dashes: write max_steps=3",
        ),
        (["--max-steps=3"], "unknown option --max-steps; config keys are overrides without dashes: write max_steps=3"),
        (["--grpo.beta", "0.0", "lora.r=4"], "write grpo.beta=0.0"),
    ],
)
def test_a_config_key_written_as_an_option_gets_a_one_line_hint(argv, hint, capsys):
    with pytest.raises(SystemExit) as exit_:
        _train_args(["--deepspeed", "D.json", *argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("glm-grpo train: error: ") and err[0].endswith(hint), err


def test_tools_with_overrides_take_them_anywhere_and_hint_flag_style_keys(capsys):
    from glm_grpo_ds.commands import estimate_memory
    from glm_grpo_ds.profiling import bench

    a = estimate_memory.parse_args(["lora.r=4", "--config", "C", "max_steps=1", "--deepspeed", "D", "--num-gpus", "2"])
    assert a.overrides == ["lora.r=4", "max_steps=1"] and a.num_gpus == 2
    assert bench.parse_args(["lora.r=4", "--size", "64", "seed=1"]).overrides == ["lora.r=4", "seed=1"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--seed", "1"])
    assert capsys.readouterr().err.strip().endswith("write seed=1")
    with pytest.raises(SystemExit):  # an unknown option that is no config key: argparse's own error
        bench.parse_args(["--no-such-option"])
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err


def test_dist_timeout_minutes_takes_fractions_and_must_be_positive():
    assert load_config(None, BASE).dist_timeout_minutes == 60
    assert load_config(None, BASE + ["dist_timeout_minutes=0.5"]).dist_timeout_minutes == 0.5  # 30 s
    with pytest.raises(ConfigError, match=r"^dist_timeout_minutes must be > 0 and finite \(minutes; fractions "):
        load_config(None, BASE + ["dist_timeout_minutes=0"])
    with pytest.raises(ConfigError, match=r"^dist_timeout_minutes must be > 0 and finite"):
        load_config(None, BASE + ["dist_timeout_minutes=.inf"])


def test_optimizer_and_lora_values_torch_refuses_after_the_load_are_refused_before_it():
    """torch / bitsandbytes / peft raise on these after the model loaded (a traceback minutes in); a NaN or negative
    max_grad_norm turned clipping off and lora.alpha 0 scaled every update away, without a word."""
    bad = [
        "optimizer.betas=[2, 0.9]",
        "optimizer.eps=-1e-8",
        "optimizer.weight_decay=-0.1",
        "optimizer.max_grad_norm=.nan",
        "optimizer.lr=.inf",
        "lora.alpha=0",
        "lora.dropout=1.5",
    ]
    with pytest.raises(ConfigError) as err:
        load_config(None, BASE + bad)
    assert str(err.value).splitlines() == [
        "optimizer.lr must be > 0 and finite, got inf",
        "optimizer.betas must be two numbers in [0, 1), got [2.0, 0.9]",
        "optimizer.eps must be > 0 and finite, got -1e-08",
        "optimizer.weight_decay must be >= 0 and finite, got -0.1",
        "optimizer.max_grad_norm must be >= 0 (0 = off) and finite, got nan",
        "lora.alpha must be > 0, got 0",
        "lora.dropout must be in [0, 1), got 1.5",
    ]
    assert load_config(None, BASE + ["optimizer.max_grad_norm=0"]).optimizer.max_grad_norm == 0  # off


def test_derived_rules_are_written_once_on_train_config():
    lora = load_config(None, BASE + ["grpo.beta=0.04", "max_steps=5", "grpo.num_iterations=3"])
    assert not lora.needs_reference_model  # LoRA: the reference is the policy with its adapters disabled
    assert lora.total_optimizer_steps == 15
    assert load_config(None, BASE + ["lora=null", "grpo.beta=0.04"]).needs_reference_model
    assert not load_config(None, BASE + ["lora=null", "grpo.beta=0"]).needs_reference_model


def test_sections_report_every_problem_one_line_each():
    with pytest.raises(ValueError) as err:
        DecoderConfig(num_inference_steps=0, dtype="bf17").validate()
    assert str(err.value).splitlines() == [
        "decoder.num_inference_steps must be >= 1, got 0",
        "decoder.dtype: unknown dtype 'bf17'; did you mean 'bf16'? known: auto, bf16, fp32, fp16",
    ]


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["grpo.preview_in_loss=false", "grpo.preview_weight=0.5"], "grpo.preview_weight=0.5 weighs preview tokens"),
        (["grpo.rank_tie_tolerance=0.01"], "grpo.rank_tie_tolerance=0.01 applies to the win_rate combinations only"),
        (["grpo.sampler_correction_min=0.5"], "grpo.sampler_correction_min=0.5 caps weights"),
        (["grpo.sampler_correction_max=2"], "grpo.sampler_correction_max=2.0 caps weights"),
        (["lora=null", "rollout.adapters_in_model_dtype=true"], "rollout.adapters_in_model_dtype casts LoRA adapters"),
        (["lora=null", "rollout.merge_lora=true"], "rollout.merge_lora merges LoRA adapters"),
        (["lora=null", "rollout.fuse_lora=true"], "rollout.fuse_lora fuses LoRA adapters"),
        (["rollout.compile_scope=layers"], "rollout.compile_scope=layers chooses what rollout.compile=false"),
        (["rollout.merge_copy=host"], "rollout.merge_copy=host places a copy"),
        (["grpo.cispo_max=3"], "grpo.cispo_max=3.0 is read by objective cispo only, but grpo.objective=clip"),
        (["grpo.entropy_coef_delta=0.01"], "grpo.entropy_coef_delta=0.01 moves an adaptive coefficient that"),
        (["grpo.sapo_temperature_neg=2"], "grpo.sapo_temperature_neg=2.0 is read by objective sapo only"),
        (["grpo.vespo_k_neg=1"], "grpo.vespo_k_neg=1.0 is read by objective vespo only, but grpo.objective=clip"),
        (["grpo.objective=cispo", "grpo.delta=2"], "grpo.delta=2.0 is read by objective clip only, but grpo.objectiv"),
        # alarms are checked at the evaluations when the run evaluates: at eval.steps=0 only before and at the end
        (["monitor.stop_on_alarm=true", "eval.file=x"], "monitor.stop_on_alarm checks the alarms at each evaluation"),
    ],
)
def test_a_setting_the_others_make_ineffective_is_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, BASE + overrides)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    # the same setting with what makes it count is taken
    fixes = {
        "grpo.preview_weight=0.5": "grpo.preview_in_loss=true",
        "grpo.rank_tie_tolerance=0.01": "grpo.reward_combination=win_rate",
        "grpo.sampler_correction_min=0.5": "grpo.sampler_correction=token_truncate",
        "grpo.sampler_correction_max=2": "grpo.sampler_correction=token_truncate",
        "rollout.adapters_in_model_dtype=true": "lora.r=8",
        "rollout.merge_lora=true": "lora.r=8",
        "rollout.fuse_lora=true": "lora.r=8",
        "rollout.compile_scope=layers": "rollout.compile=true",
        "rollout.merge_copy=host": "rollout.merge_lora=true",
        "monitor.stop_on_alarm=true": "eval.steps=5",
        "grpo.cispo_max=3": "grpo.objective=cispo",
        "grpo.entropy_coef_delta=0.01": "grpo.entropy_target=0.5",
        "grpo.sapo_temperature_neg=2": "grpo.objective=sapo",
        "grpo.vespo_k_neg=1": "grpo.objective=vespo",
        "grpo.objective=cispo": "grpo.objective=clip",
    }
    kept = [o for o in overrides if o != "lora=null" and o not in fixes.values()]
    load_config(None, BASE + kept + [fixes[o] for o in kept if o in fixes])


@pytest.mark.parametrize(
    "overrides,message",
    [
        ([], "rollout.one_step_off samples with the weights one update old: set grpo.sampler_correction"),
        (
            ["grpo.sampler_correction=token_truncate", "data.dead_prompt_skip_prob=0.5"],
            "rollout.one_step_off draws step t+1's prompts before step t's dead groups are known",
        ),
    ],
)
def test_one_step_off_needs_the_sampler_correction_and_no_prompt_skipping(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, BASE + ["rollout.one_step_off=true", *overrides])
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_one_step_off_leaves_the_old_log_probs_to_the_update():
    """One step off, the rollout's pre-update log-probs would be the previous policy's: the update computes them
    (with more than one iteration); the reference's stay in the rollout (the reference does not move)."""
    off = ["rollout.one_step_off=true", "grpo.sampler_correction=token_truncate", "grpo.num_iterations=2"]
    assert load_config(None, BASE + ["grpo.beta=0", "grpo.num_iterations=2"]).logprobs_in_rollout
    assert not load_config(None, BASE + ["grpo.beta=0", *off]).logprobs_in_rollout
    with_ref = load_config(None, BASE + ["grpo.beta=0.04", *off])
    assert with_ref.logprobs_in_rollout and with_ref.reference_in_rollout and not with_ref.old_logprobs_in_rollout


def test_fused_and_merged_sampling_together_are_refused_in_one_line():
    with pytest.raises(ConfigError) as err:
        load_config(None, BASE + ["lora.r=8", "rollout.fuse_lora=true", "rollout.merge_lora=true"])
    assert str(err.value).startswith("rollout.fuse_lora samples the adapters unmerged, rollout.merge_lora merged")
    assert "\n" not in str(err.value)
    for one in ("rollout.fuse_lora=true", "rollout.merge_lora=true"):
        load_config(None, BASE + ["lora.r=8", one])


def test_tiny_data_says_a_config_error_in_one_line(capsys):
    """It printed a traceback (exit 1) for a bad override or a missing config file."""
    from pathlib import Path

    from glm_grpo_ds.commands.tiny import tiny_data

    config = str(Path(__file__).parents[2] / "launch" / "configs" / "tiny_cpu.yaml")
    assert tiny_data(["--config", config, "max_steps=abc"]) == 2
    assert capsys.readouterr().err == "glm-grpo tiny-data: max_steps must be an integer, got 'abc'\n"


def test_settings_a_run_accepts_and_does_not_act_on_are_said(tmp_path):
    """A checkpoint limit with checkpoints off, a split of one prompt file, a warmup as long as the run: accepted (a
    short try of a longer plan) and said, by train --check as notes and at start as warnings; the shipped configs
    say none."""
    from pathlib import Path

    from glm_grpo_ds.config.notes import unused_settings

    said = unused_settings(
        load_config(
            None,
            BASE
            + ["save_steps=0", "save_total_limit=3", "data.split=validation", "max_steps=5"]
            + ["optimizer.warmup_steps=10", "grpo.num_iterations=2"],
        )
    )
    assert said == [
        "save_steps=0: this run saves no checkpoint (save_total_limit=3 prunes nothing)",
        "data.split=validation on one .jsonl file, which has no splits",
        "optimizer.warmup_steps=10 is not shorter than the run's 10 optimizer steps: the learning rate never "
        "reaches optimizer.lr=1e-05",
    ]
    assert (
        unused_settings(load_config(None, BASE + ["optimizer.warmup_steps=9", "max_steps=5", "grpo.num_iterations=2"]))
        == []
    )
    # alarms compare evaluations with the first: one evaluation, and fail_on_alarm counts on rules that cannot fire
    once = ["eval.file=e.jsonl", "eval.steps=0", "eval.at_start=false", "monitor.fail_on_alarm=true"]
    (line,) = unused_settings(load_config(None, BASE + once))
    assert line.startswith("monitor.alarms compare each evaluation with the first, and this run evaluates once")
    assert unused_settings(load_config(None, BASE + once + ["eval.at_start=true"])) == []
    assert unused_settings(load_config(None, BASE + [*once[:3], "eval.steps=100", "max_steps=100"])) != []
    assert unused_settings(load_config(None, BASE + [*once[:3], "eval.steps=40", "max_steps=100"])) == []  # 40 80 100
    for config in sorted((Path(__file__).parents[2] / "launch" / "configs").glob("*.yaml")):
        assert unused_settings(load_config(str(config))) == [], config
    # the clip range under an objective without one (the shipped GPU configs set it): said, with the key it reads
    (line,) = unused_settings(load_config(None, BASE + ["grpo.objective=cispo", "grpo.epsilon_high=5"]))
    assert line == (
        "grpo.epsilon_high=5.0: the clip objective's range; grpo.objective=cispo reads its weight's cap, "
        "grpo.cispo_max (TRL's epsilon_high under loss_type cispo)"
    )
    assert unused_settings(load_config(None, BASE + ["grpo.objective=sapo"])) == []


def test_save_best_needs_a_checkpoint_at_an_evaluated_step():
    """save_best keeps the best evaluated checkpoint: a run that evaluates no checkpointed step could never keep one."""
    ok = ["save_best=true", "eval.file=e.jsonl", "eval.steps=10", "save_steps=20", "max_steps=40"]
    assert load_config(None, BASE + ok).save_best
    assert load_config(None, BASE + [*ok, "eval.steps=0", "max_steps=20"]).save_best  # the last step is evaluated
    for bad in (["eval.file=null"], ["save_steps=0"], ["eval.steps=30", "save_steps=20", "max_steps=50"]):
        with pytest.raises(ConfigError, match=r"save_best=true keeps the best evaluated checkpoint, and this run has"):
            load_config(None, BASE + ok + bad)

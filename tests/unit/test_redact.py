"""config/redact.py: what leaves this machine (a model card's reward table, a tracker's hyperparameters) has its
secrets masked: values of keys named like a secret and a URL's user:password; everything else is unchanged."""

import json

from glm_grpo_ds.config import load_config, to_dict
from glm_grpo_ds.config.redact import MASK, redacted
from glm_grpo_ds.observability.tracking import hyperparameters
from glm_grpo_ds.sharing.run_sections import training_section

SECRET = "sk-5e3c1a9f0b7d"


def test_secret_keys_and_url_passwords_are_masked_and_nothing_else_is():
    given = {
        "api_key": SECRET, "hf_token": SECRET, "Password": SECRET, "secret": SECRET, "apikey": SECRET, "key": SECRET,
        "url": f"http://bob:{SECRET}@10.0.0.7:8123/score", "tracking_uri": f"https://alice:{SECRET}@mlflow.example",
        "nested": [{"token": SECRET, "x": 1}],
        # not secrets: a data column's name, a secret's file, a plain URL, an unset token
        "prompt_key": "prompt", "token_file": "~/.token", "plain": "http://10.0.0.7:8123", "auth": None, "n": 3,
    }  # fmt: skip
    got = redacted(given)
    assert SECRET not in json.dumps(got)
    assert got["url"] == f"http://{MASK}@10.0.0.7:8123/score" and got["nested"] == [{"token": MASK, "x": 1}]
    kept = ("prompt_key", "token_file", "plain", "auth", "n")
    assert {k: got[k] for k in kept} == {k: given[k] for k in kept}


def test_the_cards_reward_table_and_the_trackers_hyperparameters_hold_no_secret():
    rewards = f"rewards=[{{name: remote, args: {{url: 'http://bob:{SECRET}@h:1', api_key: {SECRET}, timeout_s: 5}}}}]"
    base = ["model.path=/m", "data.train_file=/d.jsonl", "lora=null"]
    cfg = load_config(None, [*base, rewards, f"logging.tracker_kwargs={{comet_ml: {{api_key: {SECRET}}}}}"])
    card = "\n".join(training_section(to_dict(cfg), {}, ["remote"]))
    assert "timeout_s=5" in card and f"url=http://{MASK}@h:1" in card and SECRET not in card
    hp = hyperparameters(cfg)
    assert SECRET not in json.dumps(hp) and json.loads(hp["rewards"])[0]["args"]["timeout_s"] == 5
    assert to_dict(cfg)["rewards"][0]["args"]["api_key"] == SECRET  # config.json, on this machine, keeps it

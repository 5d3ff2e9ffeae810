"""`glm-grpo profile TOOL`: the profilers (glm_grpo_ds/profiling/) under one verb, listed by `glm-grpo profile
--help`; their old verbs (`glm-grpo bench`, ...) print one line naming the new command and exit 2."""

import subprocess
import sys

import pytest

from glm_grpo_ds.commands import cli
from glm_grpo_ds.profiling.tools import PROFILE_TOOLS


@pytest.mark.parametrize("tool", list(PROFILE_TOOLS))
def test_an_old_verb_names_its_new_command_and_exits_2(tool, capsys):
    assert cli.main([tool, "--out", "my dir", "lora.r=4"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"glm-grpo {tool} moved: run glm-grpo profile {tool} --out 'my dir' lora.r=4\n"


def test_the_console_script_exits_2_on_an_old_verb():
    r = subprocess.run(
        [sys.executable, "-m", "glm_grpo_ds.commands.cli", "bench"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == ["glm-grpo bench moved: run glm-grpo profile bench"]


def test_help_lists_profile_not_the_old_verbs(capsys):
    assert cli.main(["--help"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert "profile" in listed and not set(PROFILE_TOOLS) & set(listed)


def test_profile_help_lists_every_tool_with_its_help(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # each help on one line (argparse breaks lines at hyphens)
    with pytest.raises(SystemExit) as exited:
        cli.main(["profile", "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert text.startswith("usage: glm-grpo profile")
    for name, tool in PROFILE_TOOLS.items():
        assert f"{name} {' '.join(tool.help.split())}" in text, name


def test_profile_passes_the_arguments_to_the_tool(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["profile", "decode-counts", "--layers", "3"])
    assert exited.value.code == 2
    assert "glm-grpo profile decode-counts: error: --layers: two different layer counts" in capsys.readouterr().err


def test_profile_without_a_known_tool_names_the_tools(capsys):
    for argv in ([], ["bnch"]):
        with pytest.raises(SystemExit) as exited:
            cli.main(["profile", *argv])
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert "glm-grpo profile: error:" in err and "TOOL" in err, argv


def test_decode_timing_checks_fused_against_verify_logprobs_fp32_tolerance():
    """decode-timing does not import the command (the profilers import no command): its copy must agree."""
    from glm_grpo_ds.commands.verify_logprobs import VerifyConfig
    from glm_grpo_ds.profiling.decode_timing import FP32_LOGP_TOLERANCE

    assert FP32_LOGP_TOLERANCE == VerifyConfig.DEFAULT_TOLERANCE["fp32"]

"""`greenfed completion bash|zsh`: the scripts, sourced into a real bash and a real zsh,
complete what `greenfed`'s parser says: its commands, a command's options, an option's
values, the files a command takes."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest

from greenfed.cli import build_parser, main
from tests.support.system_tools import require_tool


def script(shell: str, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert main(["completion", shell]) == 0
    return capsys.readouterr().out


def subcommands(*path: str) -> list[str]:
    """The commands the parser has under `greenfed PATH...`, in its order."""
    parser = build_parser()
    for name in path:
        (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = commands.choices[name]
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(commands.choices)


def top_level_commands() -> list[str]:
    return subcommands()


# (the words typed, the cursor in the last one) -> what is offered
BASH_CASES: list[tuple[list[str], list[str]]] = [
    (["greenfed", "no"], ["nodes"]),
    (["greenfed", "nodes", "join-token", "create", "--work", ""], ["training", "inference", "any"]),
    (["greenfed", "jobs", "-o", ""], ["table", "wide", "json", "yaml"]),
    (["greenfed", "jobs", "--output", "w"], ["wide"]),
    (["greenfed", "jobs", "--output", "=", "y"], ["yaml"]),  # `--output=y`, split at the `=`
    (["greenfed", "usage", "-o", ""], ["table", "wide", "json", "yaml", "csv"]),
    (["greenfed", "cancel", "-o", ""], ["table", "json", "yaml"]),  # an action: no wide
    # An option's value is skipped on the way to the sub-command.
    (["greenfed", "tokens", "--api", "http://x", "list", "--o"], ["--output"]),
    (["greenfed", "nodes", "--zone", "DE", "--k"], ["--kind"]),
    (["greenfed", "rollout", ""], ["promote", "abort"]),
    (["greenfed", "rollout", "promote", ""], []),  # its second argument is an id
    (["greenfed", "completion", ""], ["bash", "zsh"]),
    (["greenfed", "mqtt", "accounts", "create", "--role", ""], ["telemetry-reader"]),
]


def bash_completes(script_file: Path, cases: list[list[str]]) -> list[list[str]]:
    """COMPREPLY for each case, from the completion function the script registered."""
    bash = require_tool("bash", "bash")
    calls = "\n".join(
        "COMP_WORDS=({words}); COMP_CWORD={cword}; $complete; "
        'printf "%s\\n" "${{COMPREPLY[@]}}"; echo ---'.format(
            words=" ".join(f"'{word}'" for word in words), cword=len(words) - 1
        )
        for words in cases
    )
    program = (
        f"source {script_file}\n"
        # The function `complete -p` names: the script registered it for greenfed.
        "complete=$(complete -p greenfed | sed -E 's/.* -F ([^ ]+) .*/\\1/')\n" + calls
    )
    result = subprocess.run(
        [bash, "--norc", "--noprofile", "-c", program],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    assert result.stderr == ""
    return [block.split() for block in result.stdout.split("---\n")[: len(cases)]]


def test_bash_completes_commands_options_and_their_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script_file = tmp_path / "greenfed.bash"
    script_file.write_text(script("bash", capsys))
    cases = [
        (["greenfed", ""], top_level_commands()),
        (["greenfed", "nodes", ""], subcommands("nodes")),
        *BASH_CASES,
    ]
    offered = bash_completes(script_file, [words for words, _ in cases])
    for (words, expected), got in zip(cases, offered, strict=True):
        assert got == expected, words

    jobs_options = bash_completes(script_file, [["greenfed", "jobs", "-"]])[0]
    assert {"-o", "--output", "--json", "--state", "--all-tenants", "--api"} <= set(jobs_options)


def test_bash_completes_files_where_a_command_takes_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script_file = tmp_path / "greenfed.bash"
    script_file.write_text(script("bash", capsys))
    (tmp_path / "train.toml").write_text("")
    (tmp_path / "train.yaml").write_text("")
    offered = bash_completes(
        script_file,
        [
            ["greenfed", "submit", f"{tmp_path}/tra"],
            ["greenfed", "up", "--config", f"{tmp_path}/train.t"],
            ["greenfed", "jobs", "--state", f"{tmp_path}/tra"],  # a state, not a file
        ],
    )
    assert [sorted(files) for files in offered] == [  # readline sorts what it shows
        [f"{tmp_path}/train.toml", f"{tmp_path}/train.yaml"],
        [f"{tmp_path}/train.toml"],
        [],
    ]


ZSH_STUBS = r"""
# What compsys would show, printed: the candidates each completion call adds.
_describe() { local name=${@[-1]}; print -r -- "describe ${(j: :)${(@)${(@P)name}%%:*}}" }
compadd() { [[ $1 == -- ]] && shift; print -r -- "compadd $*" }
_files() { print -r -- "files" }
compset() { :; }
"""


def test_zsh_script_is_valid_and_completes_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    zsh = require_tool("zsh", "zsh")
    script_file = tmp_path / "_greenfed"
    text = script("zsh", capsys)
    assert text.startswith("#compdef greenfed\n")
    script_file.write_text(text)
    subprocess.run([zsh, "-n", str(script_file)], check=True, timeout=30)

    cases = {
        "greenfed ''": "describe " + " ".join(top_level_commands()),
        "greenfed jobs -o ''": "compadd table wide json yaml",
        "greenfed nodes join-token ''": "describe create list revoke",
        "greenfed tokens list --t": "describe -h --help --tenant --all-tenants --api --token "
        "--token-file -o --output --json",
        "greenfed submit ''": "files",
        "greenfed schema ''": "compadd status telemetry desired reported events logs",
    }
    program = (
        ZSH_STUBS
        + f"source {script_file}\n"
        + "\n".join(
            f"words=( {words} ); CURRENT=${{#words}}; _greenfed; print -- ---" for words in cases
        )
    )
    result = subprocess.run(
        [zsh, "-f", "-c", program], capture_output=True, text=True, check=True, timeout=30
    )
    assert result.stderr == ""
    shown = [block.strip() for block in result.stdout.split("---\n")[: len(cases)]]
    assert shown == list(cases.values())


def test_the_scripts_name_every_command_of_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    """Generated, never written by hand: a new command is in them with nothing to do."""
    bash, zsh = script("bash", capsys), script("zsh", capsys)
    for command in top_level_commands():
        assert f" {command}" in bash
        assert f"'{command}:" in zsh
    assert "--confirm-bulk" in bash  # `nodes drain`'s, two levels down

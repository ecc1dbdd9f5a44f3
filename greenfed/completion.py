"""`greenfed completion bash|zsh`: shell completion scripts generated from `greenfed`'s
own argparse parser (its commands, their options, the values an option or argument
accepts, which take a file), so a completion never drifts from the command line.

Both scripts hold the same tables as shell `case` statements and walk the words typed
so far the same way: option values are skipped, a command's name moves into it, any
other word is its next argument. bash completes words; zsh also shows each command's
and option's help.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Final

SHELLS: Final = ("bash", "zsh")
# An option whose value is a local path, though its type is a plain str.
_FILE_FLAG_SUFFIXES: Final = ("-file", "-dir", "-conf")


@dataclass(frozen=True, slots=True)
class Option:
    flags: tuple[str, ...]
    help: str
    takes_value: bool
    choices: tuple[str, ...]
    files: bool  # its value is a path


@dataclass(frozen=True, slots=True)
class Argument:
    """A positional argument."""

    choices: tuple[str, ...]
    files: bool


@dataclass(frozen=True, slots=True)
class Command:
    path: str  # the command's words after `greenfed` ("" for greenfed itself)
    subcommands: tuple[tuple[str, str], ...]  # (name, help)
    options: tuple[Option, ...]
    arguments: tuple[Argument, ...]


def _takes_files(action: argparse.Action) -> bool:
    metavar = action.metavar if isinstance(action.metavar, str) else ""
    return (
        action.type is Path
        or "FILE" in metavar
        or any(flag.endswith(_FILE_FLAG_SUFFIXES) for flag in action.option_strings)
    )


def _help(action: argparse.Action) -> str:
    return " ".join((action.help or "").replace("%%", "%").split())


def commands_of(parser: argparse.ArgumentParser, path: str = "") -> list[Command]:
    """`parser` and every sub-command under it, depth first, in the parser's order."""
    subcommands: list[tuple[str, str]] = []
    options: list[Option] = []
    arguments: list[Argument] = []
    below: list[Command] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: _help(choice) for choice in action._choices_actions}
            for name, subparser in action.choices.items():
                subcommands.append((name, helps.get(name, "")))
                below.extend(commands_of(subparser, f"{path} {name}".strip()))
        elif action.help == argparse.SUPPRESS:
            continue
        elif action.option_strings:
            options.append(
                Option(
                    flags=tuple(action.option_strings),
                    help=_help(action),
                    takes_value=action.nargs != 0,
                    choices=tuple(str(choice) for choice in action.choices or ()),
                    files=_takes_files(action),
                )
            )
        else:
            choices = tuple(str(choice) for choice in action.choices or ())
            arguments.append(Argument(choices=choices, files=_takes_files(action)))
    command = Command(path, tuple(subcommands), tuple(options), tuple(arguments))
    return [command, *below]


# ---- the tables both shells read --------------------------------------------------------


def _case(function: str, comment: str, key: str, rows: list[tuple[str, list[str]]]) -> str:
    """A shell function that prints the words of the row whose key is `key`."""
    lines = [f"{function}() {{  # {comment}", f'    case "{key}" in']
    lines.extend(
        f"        {shlex.quote(row_key)}) echo {shlex.quote(' '.join(words))} ;;"
        for row_key, words in rows
        if words
    )
    lines += ["    esac", "}"]
    return "\n".join(lines)


def _tables(prog: str, commands: list[Command]) -> str:
    subcommands = [(c.path, [name for name, _ in c.subcommands]) for c in commands]
    options = [(c.path, [flag for option in c.options for flag in option.flags]) for c in commands]
    valued = [
        (c.path, [flag for option in c.options if option.takes_value for flag in option.flags])
        for c in commands
    ]
    files = [
        (
            c.path,
            [flag for option in c.options if option.files for flag in option.flags]
            + [f"#{index}" for index, argument in enumerate(c.arguments) if argument.files],
        )
        for c in commands
    ]
    choices = [
        (f"{c.path} {flag}", list(option.choices))
        for c in commands
        for option in c.options
        for flag in option.flags
    ] + [
        (f"{c.path} #{index}", list(argument.choices))
        for c in commands
        for index, argument in enumerate(c.arguments)
    ]
    name = _function_name(prog)
    return "\n\n".join(
        (
            _case(f"{name}_subcommands", "$1: a command", "$1", subcommands),
            _case(f"{name}_options", "$1: a command", "$1", options),
            _case(f"{name}_valued", "$1: a command; its options that take a value", "$1", valued),
            _case(
                f"{name}_files", "$1: a command; what takes a path (#N: argument N)", "$1", files
            ),
            _case(
                f"{name}_choices",
                "$1: a command, $2: its option or #N (argument N); the values it accepts",
                "$1 $2",
                choices,
            ),
        )
    )


def _function_name(prog: str) -> str:
    return "_" + "".join(char if char.isalnum() else "_" for char in prog)


# ---- bash -------------------------------------------------------------------------------------

_BASH_MAIN: Final = r"""
# The command the words before the cursor name ($command_path) and how many of its
# arguments they hold ($argument); option values (also `--opt=value`) are skipped.
NAME_walk() {
    command_path="" argument=0
    local word skip=0 i
    for (( i = 1; i < COMP_CWORD; i++ )); do
        word=${COMP_WORDS[i]}
        if [[ $word == "=" ]]; then skip=1; continue; fi
        if (( skip )); then skip=0; continue; fi
        case $word in
            -*=*) continue ;;
            -*) [[ " $(NAME_valued "$command_path") " == *" $word "* ]] && skip=1; continue ;;
        esac
        if [[ " $(NAME_subcommands "$command_path") " == *" $word "* ]]; then
            command_path=${command_path:+$command_path }$word argument=0
        else
            argument=$(( argument + 1 ))
        fi
    done
}

NAME_add_files() {
    compopt -o filenames 2>/dev/null
    local IFS=$'\n'
    COMPREPLY+=( $(compgen -f -- "$1") )
}

NAME() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev="" command_path argument option="" prefix=""
    (( COMP_CWORD > 0 )) && prev=${COMP_WORDS[COMP_CWORD - 1]}
    COMPREPLY=()
    NAME_walk
    if [[ $cur == "=" ]]; then  # `--opt=`, split at the `=`
        option=$prev cur="" prefix="="
    elif [[ $prev == "=" && COMP_CWORD -gt 1 ]]; then
        option=${COMP_WORDS[COMP_CWORD - 2]}
    elif [[ $cur == -*=* ]]; then  # `--opt=val`, one word
        option=${cur%%=*} prefix="${cur%%=*}=" cur=${cur#*=}
    elif [[ $prev == -* && " $(NAME_valued "$command_path") " == *" $prev "* ]]; then
        option=$prev
    fi
    if [[ -n $option ]]; then
        if [[ " $(NAME_files "$command_path") " == *" $option "* ]]; then
            NAME_add_files "$cur"
        else
            local values
            values=$(NAME_choices "$command_path" "$option")
            COMPREPLY=( $(compgen -P "$prefix" -W "$values" -- "$cur") )
        fi
        return 0
    fi
    if [[ $cur == -* ]]; then
        COMPREPLY=( $(compgen -W "$(NAME_options "$command_path")" -- "$cur") )
        return 0
    fi
    local words
    words="$(NAME_subcommands "$command_path") $(NAME_choices "$command_path" "#$argument")"
    COMPREPLY=( $(compgen -W "$words" -- "$cur") )
    if [[ " $(NAME_files "$command_path") " == *" #$argument "* ]]; then
        NAME_add_files "$cur"
    fi
    return 0
}

complete -F NAME PROG
"""


def bash_script(parser: argparse.ArgumentParser) -> str:
    prog = parser.prog
    name = _function_name(prog)
    header = (
        f"# bash completion for {prog}, generated from its command line by "
        f"`{prog} completion bash`.\n"
        f"# Load it now: source <({prog} completion bash)\n"
        f"# For every shell: {prog} completion bash > /etc/bash_completion.d/{prog}\n"
    )
    main = _BASH_MAIN.replace("NAME", name).replace("PROG", prog)
    return header + "\n" + _tables(prog, commands_of(parser)) + "\n" + main


# ---- zsh --------------------------------------------------------------------------------------


def _pair(word: str, text: str) -> str:
    """`_describe`'s `name:help` (a colon in the name escaped)."""
    name = word.replace(":", r"\:")
    return f"{name}:{text}" if text else name


def _described(function: str, rows: list[tuple[str, list[tuple[str, str]]]]) -> str:
    """A zsh function that sets `reply` to the `name:help` pairs of the row `$1` names."""
    lines = [f"{function}() {{", "    reply=()", '    case "$1" in']
    for key, pairs in rows:
        if not pairs:
            continue
        items = " ".join(shlex.quote(_pair(word, text)) for word, text in pairs)
        lines.append(f"        {shlex.quote(key)}) reply=( {items} ) ;;")
    lines += ["    esac", "}"]
    return "\n".join(lines)


_ZSH_MAIN: Final = r"""
NAME() {
    local command_path="" word cur=${words[CURRENT]} prev=${words[CURRENT-1]} option=""
    local -i argument=0 skip=0 i
    local -a reply choices
    for (( i = 2; i < CURRENT; i++ )); do
        word=${words[i]}
        if (( skip )); then skip=0; continue; fi
        case $word in
            -*=*) continue ;;
            -*) [[ " $(NAME_valued "$command_path") " == *" $word "* ]] && skip=1; continue ;;
        esac
        if [[ " $(NAME_subcommands "$command_path") " == *" $word "* ]]; then
            command_path=${command_path:+$command_path }$word
            argument=0
        else
            argument+=1
        fi
    done
    if [[ $cur == -*=* ]]; then  # `--opt=val`
        option=${cur%%=*}
        compset -P '*='
    elif [[ $prev == -* && " $(NAME_valued "$command_path") " == *" $prev "* ]]; then
        option=$prev
    fi
    if [[ -n $option ]]; then
        if [[ " $(NAME_files "$command_path") " == *" $option "* ]]; then
            _files
        else
            choices=( ${=$(NAME_choices "$command_path" "$option")} )
            (( ${#choices} )) && compadd -- $choices
        fi
        return 0
    fi
    if [[ $cur == -* ]]; then
        NAME_option_help "$command_path"
        (( ${#reply} )) && _describe -t options option reply
        return 0
    fi
    NAME_subcommand_help "$command_path"
    (( ${#reply} )) && _describe -t commands command reply
    choices=( ${=$(NAME_choices "$command_path" "#$argument")} )
    (( ${#choices} )) && compadd -- $choices
    if [[ " $(NAME_files "$command_path") " == *" #$argument "* ]]; then
        _files
    fi
    return 0
}

# `source <(PROG completion zsh)` after compinit registers it; from $fpath, compinit reads
# the #compdef line and runs this file as NAME the first time.
(( $+functions[compdef] )) && compdef NAME PROG
if [[ $funcstack[1] == NAME ]]; then
    NAME "$@"
fi
"""


def zsh_script(parser: argparse.ArgumentParser) -> str:
    prog = parser.prog
    name = _function_name(prog)
    commands = commands_of(parser)
    header = (
        f"#compdef {prog}\n"
        f"# zsh completion for {prog}, generated from its command line by "
        f"`{prog} completion zsh`.\n"
        f"# Install: {prog} completion zsh > ~/.zfunc/_{prog}, with fpath=(~/.zfunc $fpath)\n"
        "# before compinit in ~/.zshrc; or, after compinit: "
        f"source <({prog} completion zsh)\n"
    )
    described = "\n\n".join(
        (
            _described(
                f"{name}_subcommand_help", [(c.path, list(c.subcommands)) for c in commands]
            ),
            _described(
                f"{name}_option_help",
                [
                    (c.path, [(flag, option.help) for option in c.options for flag in option.flags])
                    for c in commands
                ],
            ),
        )
    )
    main = _ZSH_MAIN.replace("NAME", name).replace("PROG", prog)
    return header + "\n" + _tables(prog, commands) + "\n\n" + described + "\n" + main


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of `parser` for `shell` (bash or zsh)."""
    return bash_script(parser) if shell == "bash" else zsh_script(parser)

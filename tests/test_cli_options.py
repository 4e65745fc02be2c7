"""The options people read about are the options there are: every flag has help text, and the
README's option table lists exactly the flags `minidnn train --help` prints."""
import argparse
import os
import re

import pytest

from minidnn.cli import build_parser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def subparsers() -> dict:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def flags(parser) -> set:
    return {option for action in parser._actions for option in action.option_strings
            if option not in ("-h", "--help")}


def command_line_section() -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    start = text.index("\n## Command line")
    return text[start:text.index("\n## ", start + 1)]


@pytest.mark.parametrize("command", ["train", "plan", "summary", "models"])
def test_every_flag_has_help_text(command):
    parser = subparsers()[command]
    silent = [a.option_strings[0] for a in parser._actions
              if a.option_strings and (not a.help or a.help == argparse.SUPPRESS)]
    assert silent == []


def test_the_readme_table_lists_exactly_the_train_flags():
    rows = [line for line in command_line_section().splitlines() if line.startswith("| `--")]
    in_table = set()
    for row in rows:
        first_cell = re.split(r"(?<!\\)\|", row)[1]     # '\|' inside a cell is an escaped bar
        in_table |= set(re.findall(r"--[a-z][a-z0-9-]*", first_cell))
    parser_flags = flags(subparsers()["train"])
    assert sorted(parser_flags - in_table) == [], "flags --help prints that the table lacks"
    assert sorted(in_table - parser_flags) == [], "flags in the table that --help lacks"


def test_the_readme_summary_usage_lists_its_flags():
    usage = re.search(r"`minidnn summary ([^`]*)`", command_line_section()).group(1)
    assert set(re.findall(r"--[a-z][a-z0-9-]*", usage)) == flags(subparsers()["summary"])

"""``trilm --help`` lists commands; every one of them imports and answers ``--help``."""

from __future__ import annotations

import pytest

from trilm.cli import COMMANDS, main


def test_top_level_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in COMMANDS)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_listed_command_imports_and_answers_help(name, capsys):
    with pytest.raises(SystemExit) as exc:
        main([name, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: trilm {name}")

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


def test_python_dash_m_trilm_is_the_trilm_command():
    """Scripts (the cooldown benchmark) run ``python -m trilm`` to stay in the interpreter that started
    them."""
    import subprocess
    import sys

    def trilm(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "trilm", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    done = trilm("--help")
    assert done.returncode == 0, done.stderr
    assert all(f"  {name} " in done.stdout for name in COMMANDS)
    assert trilm("no-such-command").returncode != 0

"""``python -m trilm``: the ``trilm`` command, for scripts that keep the interpreter that started them."""

from trilm.cli import main

if __name__ == "__main__":
    raise SystemExit(main())

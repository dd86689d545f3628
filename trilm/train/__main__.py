"""``python -m trilm.train --config RUN.yaml [key=value ...] [--dry-run]``: the trainer's entry point.

What every launcher starts in each process (``torchrun -m trilm.train``, ``deepspeed --module trilm.train``,
``trilm suite launch``): the installed package, so no checkout is needed. ``trilm train`` and the thin
script ``train/pretrain.py`` run the same :func:`trilm.train.cli.main`.
"""

import sys

from trilm.train.cli import main

if __name__ == "__main__":
    sys.exit(main())

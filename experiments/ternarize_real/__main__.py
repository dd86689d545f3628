"""``python -m experiments.ternarize_real``: the experiment's driver, :mod:`experiments.ternarize_real.run`,
with the same arguments."""

from experiments.ternarize_real.run import main

if __name__ == "__main__":
    raise SystemExit(main())

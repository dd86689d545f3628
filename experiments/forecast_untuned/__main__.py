"""``python -m experiments.forecast_untuned``: :mod:`experiments.forecast_untuned.run` (``collect`` writes the
runs' curve tables, ``report`` the forecasts). Its usage line names this command rather than
``__main__.py``."""

import sys

from experiments.forecast_untuned.run import main

if __name__ == "__main__":
    sys.argv[0] = "python -m experiments.forecast_untuned"
    main()

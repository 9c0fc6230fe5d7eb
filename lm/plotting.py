"""Matplotlib for files, never a screen: the one place that picks the Agg backend.

`from lm.plotting import plt` instead of importing pyplot, so figures render on headless machines
(CI, cluster nodes) whatever backend the environment would choose.
"""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["plt"]

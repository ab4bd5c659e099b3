"""Repair of Inseq 0.7's heatmap colours under numpy 2.

Inseq 0.7 writes a cell colour as ``"rgba" + str(tuple)``. Under numpy 2 the tuple holds ``np.float64`` values whose
``str`` is ``np.float64(178.0)``, so the HTML says ``rgba(np.float64(178.0), ...)``: browsers reject it and
``out.show()`` draws colourless tables. The repair replaces only that formatting, only for Inseq 0.7 and only where
numpy prints scalars this way.
"""

from importlib.metadata import version

import numpy as np
from inseq.utils import viz_utils


def needs_colour_repair(inseq_version: str) -> bool:
    """Inseq 0.7.x with a numpy whose scalars print their type (numpy 2)."""
    return inseq_version.startswith("0.7.") and str((np.float64(1.0),)) != "(1.0,)"


def rgba_string(color: tuple) -> str:
    """CSS ``rgba(r, g, b, a)`` (or ``rgba(r, g, b)``) from a tuple of numbers of any numeric type."""
    return "rgba(" + ", ".join(str(float(channel)) for channel in color) + ")"


def repair_inseq_colours() -> bool:
    """Make Inseq's ``get_color`` write plain numbers (idempotent). Returns whether the repair is in place."""
    if not needs_colour_repair(version("inseq")):
        return False
    if getattr(viz_utils.get_color, "writes_plain_numbers", False):
        return True
    original = viz_utils.get_color

    def get_color(score, min_value, max_value, cmap, return_alpha=True, return_string=True):
        color = original(score, min_value, max_value, cmap, return_alpha, return_string=False)
        return rgba_string(color) if return_string else color

    get_color.writes_plain_numbers = True
    viz_utils.get_color = get_color
    return True

"""Every change this package makes to Inseq's own behaviour, for Inseq 0.7.x, in one place.

Each is idempotent and applied by :func:`register` (called by ``import inseq_mixing``, at once when Inseq is already
imported, otherwise right after Inseq's import):

- **Inseq's built-in value zeroing is renamed** ``inseq_value_zeroing`` (Inseq picks among same-named methods at
  random, so its ``value_zeroing`` must give up the name) **and guarded** so that a failure restores the model
  (:mod:`.inseq_adapter.builtin`).
- **Heatmap colours under numpy 2** (:func:`repair_inseq_colours`): Inseq 0.7 writes a cell colour as
  ``"rgba" + str(tuple)``. Under numpy 2 the tuple holds ``np.float64`` values whose ``str`` is
  ``np.float64(178.0)``, so the HTML says ``rgba(np.float64(178.0), ...)``: browsers reject it and ``out.show()``
  draws colourless tables. The repair replaces only that formatting, only for Inseq 0.7 and only where numpy prints
  scalars this way.
- **This package's methods join Inseq's registry**: importing :mod:`.inseq_adapter` creates one Inseq method class
  per declaration (Inseq registers a method when its class is created).

A new Inseq release is checked here: each patch names the behaviour it changes and the version it targets.
"""

import importlib
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


#: The name Inseq's own value zeroing is registered under.
BUILTIN_VALUE_ZEROING_NAME = "inseq_value_zeroing"

_registered: list[bool] = []  # non-empty once register() has run


def rename_builtin_value_zeroing() -> None:
    """Inseq 0.7's ``value_zeroing`` gives up its name (see the module docstring); under its new name a failure
    restores the model (see :mod:`inseq_mixing.frontends.inseq_adapter.builtin`)."""
    from inseq.attr.feat.perturbation_attribution import ValueZeroingAttribution as BuiltinValueZeroing

    from .inseq_adapter.builtin import guard_builtin_value_zeroing

    BuiltinValueZeroing.method_name = BUILTIN_VALUE_ZEROING_NAME
    guard_builtin_value_zeroing(BuiltinValueZeroing)


def register() -> list[str]:
    """Apply every patch of this module once (idempotent) and put the plugin's methods in Inseq's registry. Imports
    Inseq.

    Returns:
        The names of the plugin's methods.
    """
    if not _registered:
        _registered.append(True)
        rename_builtin_value_zeroing()
        repair_inseq_colours()
        # When Inseq's import was started by the adapter itself, the adapter is half-imported here and creates the
        # classes once it resumes; otherwise this import creates them.
        importlib.import_module(f"{__package__}.inseq_adapter")
    from ..declarations import DECLARATIONS

    return list(DECLARATIONS)

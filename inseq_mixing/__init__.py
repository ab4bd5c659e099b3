"""inseq-mixing: Transformer context-mixing attribution methods for Inseq.

``import inseq_mixing`` registers the plugin's methods in Inseq's registry, whichever of the two packages is imported
first: at once when Inseq is already imported, otherwise right after Inseq's own import finishes (a post-import hook,
:class:`_RegisterAfterInseq`). So the import itself stays light (no torch), and ``inseq-mixing --help`` answers at
once. Inseq's own ``value_zeroing`` is renamed to ``inseq_value_zeroing`` so that ``value_zeroing`` deterministically
loads this package's implementation.

The public names below (``compare``, ``evaluate``, ``attribute_dataset``, ``load_run``, ``get_spec``...) are imported
when first used.
"""

import importlib
import importlib.abc
import importlib.util
import sys
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("inseq-mixing")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+local"

#: Public name → the submodule that defines it (imported on first use).
_LAZY = {
    "SUPPORTED_FAMILIES": "specs",
    "UnsupportedModelError": "specs",
    "get_spec": "specs",
    "supported_model_types": "specs",
    "trace_model": "trace",
    "Comparison": "evaluation",
    "Evaluation": "evaluation",
    "compare": "evaluation",
    "evaluate": "evaluation",
    "evaluate_run": "evaluation",
    "attribute_dataset": "runs",
    "load_run": "runs",
    "load_model": "frontends",
    "load_output": "frontends.output",
    "explore": "views.explorer",
    "contribution_graphs": "views.explorer",
    "explore_model": "views.explorer",
    "EncoderAttributionModel": "frontends",
    "SpeechAttributionModel": "frontends",
    "BUILTIN_VALUE_ZEROING_NAME": "frontends.patches",
}


def register() -> list[str]:
    """Register the plugin's methods inside Inseq (idempotent): Inseq's built-in value zeroing is renamed, Inseq's
    heatmap colours are repaired, ``inseq.load_model`` names :func:`load_model` for encoder-only and speech models,
    outputs get ``explore()`` (the explorer page), and one Inseq method class per declaration is generated
    (:mod:`inseq_mixing.frontends.patches`, where every change to Inseq's behaviour is kept). Called by
    ``import inseq_mixing`` (at once, or when Inseq is imported); imports Inseq.

    Returns:
        The names of the plugin's methods.
    """
    from .frontends.patches import add_explore, guide_other_kinds
    from .frontends.patches import register as apply_patches
    from .frontends.router import inseq_refusal
    from .views.explorer import explore

    names = apply_patches()
    guide_other_kinds(inseq_refusal)
    add_explore(explore)
    from .hooks import WRITERS

    WRITERS["evaluation"] = _write_evaluation_report
    WRITERS["image_report"] = _image_report
    WRITERS["image_overlays"] = _image_overlays
    return names


def _image_report(output, images, path):
    """A vision output's ``show()`` page (the views sit above the front ends)."""
    from .views.images import image_report

    return image_report(output, images, path)


def _image_overlays(output, images, folder):
    """A vision output's ``show()`` in a terminal: the overlays as PNG files."""
    from .views.images import overlay_files

    return overlay_files(output, images, folder)


def _write_evaluation_report(evaluation, path, **kwargs):
    """:meth:`Evaluation.report`'s writer (the views sit above the evaluation)."""
    from .views.eval_report import write_evaluation_report

    return write_evaluation_report(evaluation, path, **kwargs)


class _RegisterAfterInseq(importlib.abc.MetaPathFinder):
    """A post-import hook: finds ``inseq`` with the other finders, and has its loader call :func:`register` once
    Inseq's package has run (so Inseq's registry is complete and ours is added to it). Removes itself when used."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "inseq":
            return None
        sys.meta_path[:] = [finder for finder in sys.meta_path if finder is not self]
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run_inseq = spec.loader.exec_module

        def exec_module(module):
            run_inseq(module)
            register()

        spec.loader.exec_module = exec_module
        return spec


def load_demo_model(method: str = "alti_logit", **kwargs):
    """The embedded demo model (a small Marian-style encoder–decoder shipped with the package: no network) as an Inseq
    model with ``method``; ``kwargs`` go to ``inseq.load_model`` (e.g. ``device="cuda"``).

    Example:
        ``inseq_mixing.load_demo_model("decompx").attribute("the red cats sleep", attribute_target=True).show()``
    """
    from .frontends import load_model

    return load_model("demo", method, **kwargs)


def __getattr__(name: str):
    if name == "METHODS":  # the plugin's method names, in listing order
        from .declarations import DECLARATIONS

        return list(DECLARATIONS)
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY, "METHODS"])


def _inseq_installed() -> bool:
    try:
        return importlib.util.find_spec("inseq") is not None
    except (ImportError, ValueError):  # a finder that refuses it
        return False


if "inseq" in sys.modules:
    register()
elif _inseq_installed():  # without Inseq, the math and the declarations still work
    sys.meta_path.insert(0, _RegisterAfterInseq())

__all__ = [
    "METHODS",
    "Comparison",
    "Evaluation",
    "attribute_dataset",
    "load_run",
    "load_model",
    "load_output",
    "EncoderAttributionModel",
    "SpeechAttributionModel",
    "compare",
    "evaluate",
    "evaluate_run",
    "explore",
    "explore_model",
    "contribution_graphs",
    "SUPPORTED_FAMILIES",
    "UnsupportedModelError",
    "get_spec",
    "load_demo_model",
    "register",
    "supported_model_types",
    "trace_model",
]

"""inseq-mixing: Transformer context-mixing attribution methods for Inseq.

``import inseq_mixing`` registers the plugin's methods in Inseq's registry. Inseq's own ``value_zeroing`` is renamed to
``inseq_value_zeroing`` so that ``value_zeroing`` deterministically loads this package's implementation.
"""

from importlib.metadata import PackageNotFoundError, version

from .specs import SUPPORTED_FAMILIES, UnsupportedModelError, get_spec, supported_model_types
from .trace import trace_model

try:
    __version__ = version("inseq-mixing")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+local"

BUILTIN_VALUE_ZEROING_NAME = "inseq_value_zeroing"


def _rename_builtin_value_zeroing() -> None:
    """Inseq picks among same-named methods at random, so its ``value_zeroing`` must give up the name. Under its new
    name a failure restores the model (see :mod:`inseq_mixing.attr.builtin`)."""
    from inseq.attr.feat.perturbation_attribution import ValueZeroingAttribution as BuiltinValueZeroing

    from .attr.builtin import guard_builtin_value_zeroing

    BuiltinValueZeroing.method_name = BUILTIN_VALUE_ZEROING_NAME
    guard_builtin_value_zeroing(BuiltinValueZeroing)


def register() -> list[str]:
    """Register the plugin's methods inside Inseq (idempotent: importing twice registers nothing new): one Inseq method
    class is generated from each declaration (:mod:`inseq_mixing.declarations`).

    Returns:
        The names of the plugin's methods.
    """
    _rename_builtin_value_zeroing()
    from .attr import ContextMixingAttribution

    return [cls.method_name for cls in _subclasses(ContextMixingAttribution) if "method_name" in vars(cls)]


def load_demo_model(method: str = "alti_logit", **kwargs):
    """The embedded demo model (a small Marian-style encoder–decoder shipped with the package: no network) as an Inseq
    model with ``method``; ``kwargs`` go to ``inseq.load_model`` (e.g. ``device="cuda"``).

    Example:
        ``inseq_mixing.load_demo_model("decompx").attribute("the red cats sleep", attribute_target=True).show()``
    """
    import inseq

    from .demo import load_demo_model as demo_model_and_tokenizer

    model, tokenizer = demo_model_and_tokenizer()
    return inseq.load_model(model, method, tokenizer=tokenizer, **kwargs)


def _subclasses(cls: type) -> list[type]:
    """Every subclass of ``cls``, depth first, in definition order (registration happens at class creation)."""
    found = []
    for subclass in cls.__subclasses__():
        found += [subclass, *_subclasses(subclass)]
    return found


try:
    import inseq  # noqa: F401
except ImportError:  # the math and the declarations work without Inseq
    from .declarations import DECLARATIONS

    METHODS = list(DECLARATIONS)
else:
    METHODS = register()

    from .views.colors import repair_inseq_colours

    repair_inseq_colours()

    from .evaluation import (  # evaluation uses the registered methods  # comparisons use the registered methods
        Comparison,
        Evaluation,
        compare,
        evaluate,
    )
    from .runs import attribute_dataset, load_run  # runs use the registered methods

__all__ = [
    "METHODS",
    "Comparison",
    "Evaluation",
    "attribute_dataset",
    "load_run",
    "compare",
    "evaluate",
    "SUPPORTED_FAMILIES",
    "UnsupportedModelError",
    "get_spec",
    "load_demo_model",
    "register",
    "supported_model_types",
    "trace_model",
]

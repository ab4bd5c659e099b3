"""Architecture specs for every supported model family, and the lookup from a model to its spec."""

import importlib
import pkgutil

from torch import nn
from transformers import PreTrainedModel

from .base import AttentionSpec, FFNSpec, HeadSpec, LayerSpec, ModelSpec, StackSpec, UnsupportedModelError


def _spec_modules() -> tuple:
    """Every module of this package that declares ``MODEL_TYPES``: adding a family is adding such a file."""
    names = sorted(info.name for info in pkgutil.iter_modules(__path__) if info.name != "base")
    modules = (importlib.import_module(f"{__name__}.{name}") for name in names)
    return tuple(module for module in modules if hasattr(module, "MODEL_TYPES"))


#: One module per family: its ``FAMILY`` name, the ``MODEL_TYPES`` (``config.model_type``) it covers, and ``build``.
SPEC_MODULES = _spec_modules()

_BUILDERS = {model_type: module.build for module in SPEC_MODULES for model_type in module.MODEL_TYPES}

SUPPORTED_FAMILIES = {module.FAMILY: ", ".join(sorted(module.MODEL_TYPES)) for module in SPEC_MODULES}


def supported_model_types() -> list[str]:
    """The ``config.model_type`` values with a spec."""
    return sorted(_BUILDERS)


def get_spec(model: nn.Module) -> ModelSpec:
    """Build the spec of a Hugging Face model.

    Args:
        model: A Hugging Face ``PreTrainedModel`` with an LM head (``...ForConditionalGeneration`` or
            ``...ForCausalLM``), an encoder-only model (``...ForMaskedLM``, ``...ForSequenceClassification``,
            ``...ForTokenClassification``, or the bare encoder), or an Inseq ``AttributionModel`` wrapping one.

    Raises:
        UnsupportedModelError: The architecture has no spec.
    """
    if not isinstance(model, PreTrainedModel) and isinstance(getattr(model, "model", None), PreTrainedModel):
        model = model.model
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in _BUILDERS:
        families = "; ".join(f"{name} ({types})" for name, types in SUPPORTED_FAMILIES.items())
        raise UnsupportedModelError(
            f"inseq-mixing has no architecture spec for model_type={model_type!r} "
            f"({type(model).__name__}). Supported families: {families}."
        )
    spec = _BUILDERS[model_type](model)
    if not spec.is_encoder_only and spec.lm_head is None:
        raise UnsupportedModelError(
            f"{type(model).__name__} has no LM head, and every method explains next-token predictions. Load the model "
            "with its head: AutoModelForSeq2SeqLM for encoder–decoders, AutoModelForCausalLM for decoder-only models."
        )
    return spec


__all__ = [
    "AttentionSpec",
    "FFNSpec",
    "HeadSpec",
    "LayerSpec",
    "ModelSpec",
    "StackSpec",
    "SUPPORTED_FAMILIES",
    "UnsupportedModelError",
    "get_spec",
    "supported_model_types",
]

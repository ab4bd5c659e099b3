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


#: Vision architectures whose tokens mix outside attention, by ``config.model_type``: what mixes them. The methods
#: measure mixing by attention; a decomposition through these steps would be a different method, so they are refused.
MIXING_OUTSIDE_ATTENTION = {
    "swin": "shifted windows and patch merging (neighbouring patches are concatenated between stages)",
    "swinv2": "shifted windows and patch merging (neighbouring patches are concatenated between stages)",
    "cvt": "convolutional token embeddings and convolutional projections inside every block",
    "pvt": "spatial-reduction convolutions on the keys and values",
    "pvt_v2": "spatial-reduction convolutions on the keys and values and a depth-wise convolution in the FFN",
    "mobilevit": "convolutions inside the blocks (unfolding and folding patches)",
    "mobilevitv2": "convolutions inside the blocks (unfolding and folding patches)",
    "levit": "convolutions and attention that subsamples the tokens between stages",
    "hiera": "pooling of the query tokens between stages",
    "focalnet": "focal modulation (depth-wise convolutions), no attention",
    "convnext": "convolutions, no attention",
    "convnextv2": "convolutions, no attention",
}


NOT_YET_EXPLAINED = {
    "deepseek_v32": "multi-head latent attention with a sparse token selector",
    "mllama": "cross-attention layers that read the vision tower's projected states (tanh-gated, the rows that see "
    "no image masked out of their FFN), an encoder–decoder's reading without an encoder stack for the methods to "
    "start from; explain an image-token VLM (LLaVA, Qwen2-VL, ...)",
    "minimax": "lightning (linear) attention layers",
    "jetmoe": "a mixture of attention heads",
    "dbrx": "experts laid out in modules of its own",
    "llama4": "chunked attention and experts laid out in modules of its own",
    "granitemoe_swa": "learned attention sinks that scale the attention output after the softmax, while the "
    "probabilities its attention returns leave that scale out",
}


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
    if model_type in MIXING_OUTSIDE_ATTENTION:
        raise UnsupportedModelError(
            f"{type(model).__name__} mixes its tokens outside attention: {MIXING_OUTSIDE_ATTENTION[model_type]}. "
            "Every method here measures mixing through attention, so none applies to it: explain a plain Vision "
            "Transformer instead (ViT, DeiT, BEiT, Data2Vec-vision, DINOv2, CLIP, SigLIP)."
        )
    if model_type in NOT_YET_EXPLAINED:
        raise UnsupportedModelError(
            f"{type(model).__name__} is not explained yet: {NOT_YET_EXPLAINED[model_type]}. The methods would need a "
            "decomposition of that part that inseq-mixing does not have; explain a dense or mixture-of-experts "
            "Transformer (see docs/supported-models.md)."
        )
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
    "MIXING_OUTSIDE_ATTENTION",
    "SUPPORTED_FAMILIES",
    "UnsupportedModelError",
    "get_spec",
    "supported_model_types",
]

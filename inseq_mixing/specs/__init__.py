"""Architecture specs for every supported model family, and the lookup from a model to its spec."""

from torch import nn
from transformers import PreTrainedModel

from . import bart, gpt2, llama, t5
from .base import AttentionSpec, FFNSpec, LayerSpec, ModelSpec, StackSpec, UnsupportedModelError

_BUILDERS = {
    **dict.fromkeys(bart.MODEL_TYPES, bart.build),
    **dict.fromkeys(t5.MODEL_TYPES, t5.build),
    **dict.fromkeys(gpt2.MODEL_TYPES, gpt2.build),
    **dict.fromkeys(llama.MODEL_TYPES, llama.build),
}

SUPPORTED_FAMILIES = {
    "Marian": "marian",
    "BART": "bart",
    "mBART": "mbart",
    "M2M100 / NLLB": "m2m_100",
    "T5 / mT5 (v1.0 and gated-GELU v1.1)": "t5, mt5, umt5",
    "GPT-2": "gpt2",
    "Llama-style": "llama, mistral, qwen2",
}


def supported_model_types() -> list[str]:
    """The ``config.model_type`` values with a spec."""
    return sorted(_BUILDERS)


def get_spec(model: nn.Module) -> ModelSpec:
    """Build the spec of a Hugging Face model.

    Args:
        model: A Hugging Face ``PreTrainedModel`` with an LM head (``...ForConditionalGeneration`` or
            ``...ForCausalLM``), or an Inseq ``AttributionModel`` wrapping one.

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
    if model.get_output_embeddings() is None:
        raise UnsupportedModelError(
            f"{type(model).__name__} has no LM head, and every method explains next-token predictions. Load the model "
            "with its head: AutoModelForSeq2SeqLM for encoder–decoders, AutoModelForCausalLM for decoder-only models."
        )
    return _BUILDERS[model_type](model)


__all__ = [
    "AttentionSpec",
    "FFNSpec",
    "LayerSpec",
    "ModelSpec",
    "StackSpec",
    "SUPPORTED_FAMILIES",
    "UnsupportedModelError",
    "get_spec",
    "supported_model_types",
]

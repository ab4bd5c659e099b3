"""Whisper (speech encoder–decoder): pre-LN blocks with a final layer norm on both stacks.

The encoder reads log-mel features through two 1-D convolutions (GELU) and adds sinusoidal positions; decompositions
start at the first block's input, after that front end (each frame already mixes its neighbouring mel frames through
the convolutions' windows, outside attention). The blocks are BART's layout (``self_attn`` / ``self_attn_layer_norm``,
``encoder_attn`` / ``encoder_attn_layer_norm``, ``fc1`` / ``fc2`` / ``final_layer_norm``), pre-LN, so the BART spec
builds them. ``WhisperForConditionalGeneration`` explains its ``proj_out`` logits; a bare ``WhisperEncoder`` is an
encoder-only stack for the map methods.
"""

from torch import nn

from .bart import stack_spec
from .base import ModelSpec

FAMILY = "Whisper (speech)"
KIND = "speech"
MODEL_TYPES = {"whisper"}


def build(model: nn.Module) -> ModelSpec:
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    if isinstance(model, WhisperEncoder):
        return ModelSpec(family="whisper", decoder=stack_spec(model, pre_norm=True), causal=False)
    base = getattr(model, "model", model)  # WhisperForConditionalGeneration wraps a WhisperModel
    return ModelSpec(
        family="whisper",
        encoder=stack_spec(base.encoder, pre_norm=True),
        decoder=stack_spec(base.decoder, pre_norm=True),
        lm_head=model.get_output_embeddings() if hasattr(model, "proj_out") else None,
        max_positions=model.config.max_target_positions,
    )

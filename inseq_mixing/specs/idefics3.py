"""Idefics3 and SmolVLM (Hugging Face, 2024–2025): a SigLIP-style vision tower whose patch states are pixel-shuffled
(each 2 × 2 block of patches folded into one state of four times the width) and projected into the embeddings of the
image's tokens in a Llama language model's input. The decoder is explained as LLaVA's is (the image tokens'
embeddings are the first block's input); traced with ``pixel_values`` ``(batch, images, 3, H, W)``.

Issue 56: the decoder's spec and trace. Not yet: scores through the pixel shuffle and the vision tower.
"""

from torch import nn

from .base import ModelSpec
from .llava import decoder_spec

FAMILY = "Idefics3, SmolVLM (a Llama decoder over pixel-shuffled image tokens and text)"
KIND = "vision-language"
MODEL_TYPES = {"idefics3", "smolvlm"}


def build(model: nn.Module) -> ModelSpec:
    return decoder_spec(model, model.model.text_model, model.config.image_token_id)

"""InternVL (Shanghai AI Lab, 2024–2025): a vision tower whose patch states are pixel-shuffled and projected into the
embeddings of the image's tokens in a Llama-layout language model's input (Qwen2 in InternVL 3), an image given as
tiles. The decoder is explained as LLaVA's is; traced with ``pixel_values`` ``(tiles, 3, H, W)``, the tiles of every
image of the batch in one run (a row holds the tiles whose tokens it holds, in order).

Issue 56: the decoder's spec and trace. Not yet: scores through the pixel shuffle and the vision tower.
"""

from torch import nn

from .base import ModelSpec
from .llava import decoder_spec

FAMILY = "InternVL (a Llama-layout decoder over pixel-shuffled image tiles and text)"
KIND = "vision-language"
MODEL_TYPES = {"internvl"}


def build(model: nn.Module) -> ModelSpec:
    return decoder_spec(model, model.model.language_model, model.config.image_token_id)

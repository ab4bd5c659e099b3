"""Qwen2-VL and Qwen2.5-VL (Alibaba Qwen, 2024–2025): a vision tower whose patch states are merged 2 × 2 into the
embeddings of the image's tokens in a Qwen2 language model's input, with multimodal rotary positions (M-RoPE: an
image token's temporal, row and column positions). The decoder is explained as LLaVA's is: its positions are the
image's tokens and the text's, every method reads them as it reads a Qwen2's (the image tokens' embeddings are the
first block's input). The model computes its positions from the ids, the image grids and the padding mask itself
(``own_positions``): the trace is given ``pixel_values``, ``image_grid_thw`` and ``mm_token_type_ids`` (what the
processor returns) and passes no positions.

Issue 56: the decoder's spec and trace. Not yet: a front end over images and prompts, scores through the merger and the
vision tower.
"""

from torch import nn

from .base import ModelSpec
from .llava import decoder_spec

FAMILY = "Qwen2-VL, Qwen2.5-VL (a Qwen2 decoder over image and text tokens, multimodal rotary positions)"
KIND = "vision-language"
MODEL_TYPES = {"qwen2_vl", "qwen2_5_vl"}


def build(model: nn.Module) -> ModelSpec:
    return decoder_spec(model, model.model.language_model, model.config.image_token_id, own_positions=True)

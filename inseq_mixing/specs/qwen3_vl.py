"""Qwen3-VL and Qwen3-VL-MoE (Alibaba Qwen, 2025): Qwen2-VL's layout (a vision tower whose patch states are merged
2 × 2 into the image tokens' embeddings, multimodal rotary positions, here interleaved over the channels) over a Qwen3
decoder, dense or a mixture of experts, plus DeepStack: the tower's states at some of its earlier layers, each merged
by a merger of its own, are added to the image tokens' hidden states after each of the decoder's first blocks.

The decoder is explained as Qwen2-VL's is (the image tokens' embeddings are the first block's input; the model
computes its positions itself). DeepStack's added vectors are inputs between blocks
(:class:`~.base.InjectedInputs`): the trace records them from the language model's call, and every method credits an
added vector to the image token it is added at, as it credits that token's embedding (**our extension**: the
decomposition methods (DecompX, ALTI-logit's direct term, AttnLRP's relevance at the vector) give it to the token
whole; the map methods read it as part of the token's residual stream at the next block, as they read an FFN's
output). Scores stop at the image tokens: not through the mergers and the tower.
"""

from torch import nn

from . import llama, mixture
from .base import InjectedInputs, ModelSpec
from .llava import decoder_spec

FAMILY = "Qwen3-VL, Qwen3-VL-MoE (a Qwen3 decoder over image and text tokens, DeepStack features added between blocks)"
KIND = "vision-language"
MODEL_TYPES = {"qwen3_vl", "qwen3_vl_moe"}


def build(model: nn.Module) -> ModelSpec:
    language = model.model.language_model
    layer_spec = mixture.layer_spec if model.config.model_type == "qwen3_vl_moe" else llama.layer_spec
    deepstack = InjectedInputs(module=language, vectors="deepstack_visual_embeds", mask="visual_pos_masks")
    return decoder_spec(model, language, model.config.image_token_id, layer_spec=layer_spec, injected=deepstack,
                        own_positions=True)  # fmt: skip

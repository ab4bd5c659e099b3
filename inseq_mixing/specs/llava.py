"""LLaVA (Liu et al., NeurIPS 2023), LLaVA-NeXT and LLaVA-OneVision (an image in tiles of any aspect ratio, each row of
tiles ended by a learned newline embedding): a vision tower whose patch states a projector turns into the embeddings
of the image's tokens in a Llama-layout language model's input. The decoder is explained: its positions are the image's
tokens and the text's, every method reads them as it reads a Llama's (the image tokens' embeddings are the first
block's input, as a token's embedding is).

Issue 56, first step: the decoder's spec and trace (the forward pass takes ``pixel_values`` beside the ids). Not yet:
a front end over images and prompts, scores through the projector and the vision tower, image views.
"""

from torch import nn

from . import llama
from .base import InjectedInputs, ModelSpec, StackSpec, TowerSpec, UnsupportedModelError

FAMILY = "LLaVA, LLaVA-NeXT, LLaVA-OneVision (a Llama-layout decoder over image and text tokens)"
KIND = "vision-language"
MODEL_TYPES = {"llava", "llava_next", "llava_onevision"}

#: The language models a vision-language decoder may be, by ``text_config.model_type``: those laid out as Llama's
#: (Qwen2-VL's and Qwen2.5-VL's own are Qwen2's, Qwen3-VL's Qwen3's or Qwen3-MoE's).
TEXT_MODELS = {
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen2_vl_text",
    "qwen2_5_vl_text",
    "qwen3_vl_text",
    "qwen3_vl_moe_text",
    "qwen3_5_text",
    "qwen3_5_moe_text",
}


def decoder_spec(model: nn.Module, language: nn.Module, image_token_id: int, layer_spec=llama.layer_spec,
                 injected: InjectedInputs | None = None, **fields) -> ModelSpec:  # fmt: skip
    """The spec of a vision-language model's Llama-layout decoder ``language`` (its blocks, final norm, the model's LM
    head); ``layer_spec`` builds each block's (a mixture of experts' own), ``injected``: what the decoder adds between
    its blocks; ``fields``: other :class:`ModelSpec` fields.

    Raises:
        UnsupportedModelError: The language model is not laid out as Llama's.
    """
    text = model.config.text_config.model_type
    if text not in TEXT_MODELS:
        known = ", ".join(sorted(TEXT_MODELS))
        raise UnsupportedModelError(f"This {model.config.model_type}'s language model is a {text!r}; its decoder is "
                                    f"explained when it is laid out as Llama's ({known}).")  # fmt: skip
    layers = [layer_spec(layer, model.config.text_config) for layer in language.layers]
    stack = StackSpec(layers=layers, final_norm=language.norm, injected=injected)
    return ModelSpec(family=model.config.model_type, decoder=stack, lm_head=model.get_output_embeddings(),
                     image_token_id=image_token_id, **fields)  # fmt: skip


def tower_spec(model: nn.Module) -> TowerSpec | None:
    """LLaVA's vision tower as its image tokens read it (one layer's states, the class token dropped or kept, the
    projector applied token by token), or None where the features come from several layers (a list of layers) or the
    image is cut into tiles (LLaVA-NeXT, OneVision)."""
    from . import get_spec

    config, tower = model.config, model.model.vision_tower
    layer = config.vision_feature_layer
    if config.model_type != "llava" or not isinstance(layer, int):
        return None
    inner = getattr(tower, "vision_model", tower)
    if getattr(inner, "encoder", None) is None:
        return None
    blocks = len(inner.encoder.layers)
    through = layer if layer >= 0 else blocks + 1 + layer  # hidden_states[layer]: the output of that many blocks
    first = 1 if config.vision_feature_select_strategy == "default" else 0
    return TowerSpec(module=tower, spec=get_spec(tower), layers=through, first_feature=first,
                     tokens=inner.embeddings.num_positions)  # fmt: skip


def build(model: nn.Module) -> ModelSpec:
    return decoder_spec(model, model.model.language_model, model.config.image_token_index, tower=tower_spec(model))

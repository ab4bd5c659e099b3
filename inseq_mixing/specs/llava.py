"""LLaVA (Liu et al., NeurIPS 2023), LLaVA-NeXT and LLaVA-OneVision (an image in tiles of any aspect ratio, each row of
tiles ended by a learned newline embedding): a vision tower whose patch states a projector turns into the embeddings
of the image's tokens in a Llama-layout language model's input. The decoder is explained: its positions are the image's
tokens and the text's, every method reads them as it reads a Llama's (the image tokens' embeddings are the first
block's input, as a token's embedding is).

The tower (our extension, :mod:`inseq_mixing.methods.tower`): the projector maps one tower token's state to one image
token, so each image token's score goes to its tower token whole, then through the tower's rollout. LLaVA-NeXT's and
OneVision's image tokens are the base tile's, then the other tiles' put together on the image's grid, cut to its aspect
ratio, each row ended by a learned newline (which no tower token gives: its score stays on the decoder's row); which
tile and token each image token is comes from the model's own packing run on indices (:func:`tile_runs`).
"""

from collections.abc import Callable

import torch
from torch import nn

from . import llama
from .base import InjectedInputs, ModelSpec, StackSpec, TowerRun, TowerSpec, UnsupportedModelError

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
    projector applied token by token; LLaVA-NeXT's and OneVision's tiles laid out by the model's own packing:
    :func:`tile_runs`), or None where the features come from several layers (a list of layers)."""
    from . import get_spec

    config, tower = model.config, model.model.vision_tower
    layer = config.vision_feature_layer
    if not isinstance(layer, int):
        return None
    inner = getattr(tower, "vision_model", tower)
    if getattr(inner, "encoder", None) is None:
        return None
    blocks = len(inner.encoder.layers)
    through = layer if layer >= 0 else blocks + 1 + layer  # hidden_states[layer]: the output of that many blocks
    first = 1 if config.vision_feature_select_strategy == "default" else 0
    tokens = inner.embeddings.num_positions
    runs = None if config.model_type == "llava" else tile_runs(model, tokens, tokens - first)
    return TowerSpec(module=tower, spec=get_spec(tower), layers=through, first_feature=first, tokens=tokens,
                     runs=runs)  # fmt: skip


#: The model's keyword inputs its image features are computed from (LLaVA-NeXT's, OneVision's).
IMAGE_ARGUMENTS = ("pixel_values", "image_sizes", "batch_num_images")


def packed_layout(model: nn.Module, kwargs: dict, read: int, what: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Where each image token's embedding comes from in LLaVA-NeXT's and OneVision's packing, read from the model's
    own ``get_image_features`` on the inputs ``kwargs``, its projector's output replaced by each tile token's index
    (and its square) in float64: the packing (the base tile, then the other tiles put together on the image's grid,
    cut to its aspect ratio, a learned newline after each row) moves the indices as it moves the embeddings.
    ``read``: the tokens of a tile the projector reads; ``what``: the request, for the error.

    Returns:
        The tiles' pixels the tower read (every image's, in order) and, per image, ``(tokens, 2)``: the tile (counted
        over every image's) and the token read in it, ``(-1, -1)`` for a learned newline.

    Raises:
        ValueError: The model resamples an image's grid (OneVision's ``anyres_max``, for images whose tiles make more
            patches than it keeps): its tokens then blend patches, which is not decomposed.
    """
    inner, seen = model.model, {}

    def tiles(_module, args, call) -> None:
        seen["pixels"] = args[0] if args else call["pixel_values"]

    def indices(_module, _args, output) -> torch.Tensor:
        count = output.shape[0] * output.shape[1]
        index = torch.arange(count, dtype=torch.float64, device=output.device).reshape(*output.shape[:2], 1)
        return torch.cat([index, index.square(), index.new_zeros(*output.shape[:2], output.shape[2] - 2)], -1)

    hooks = [inner.vision_tower.register_forward_pre_hook(tiles, with_kwargs=True),
             inner.multi_modal_projector.register_forward_hook(indices)]  # fmt: skip
    try:
        with torch.no_grad():
            packed = inner.get_image_features(**{name: kwargs[name] for name in IMAGE_ARGUMENTS
                                                 if name in kwargs}).pooler_output  # fmt: skip
    finally:
        for hook in hooks:
            hook.remove()
    newline = inner.image_newline.detach().double()
    layout = []
    for number, rows in enumerate(packed):
        is_newline = (rows == newline.to(rows.device)).all(-1)
        index = rows[:, 0]
        if not torch.equal(rows[~is_newline, 1], index[~is_newline].square()):
            raise ValueError(f"{what}: the model resamples image {number + 1}'s grid of tiles (its tokens blend "
                             "patches), which is not decomposed: give a smaller image.")  # fmt: skip
        where = index.round().long()
        layout.append(torch.stack([where // read, where % read], -1).masked_fill_(is_newline[:, None], -1))
    return seen["pixels"], layout


def tile_runs(model: nn.Module, tokens: int, read: int) -> Callable[[dict, dict | None], list[TowerRun]]:
    """LLaVA-NeXT's and OneVision's tower run: every tile the model encodes, each image token placed by the model's
    own packing (:func:`packed_layout`). ``tokens``: the tower's per tile, ``read``: those the projector reads."""

    def runs(kwargs: dict, _recorded: dict | None = None) -> list[TowerRun]:  # read before the method: no recorder
        pixels, layout = packed_layout(model, kwargs, read, "tower=True")
        mask = torch.ones(pixels.shape[0], tokens, dtype=torch.long, device=pixels.device)
        return [TowerRun({"pixel_values": pixels}, mask, layout=layout)]

    return runs


def image_tiles(model: nn.Module) -> Callable[[dict], list[torch.Tensor]] | None:
    """LLaVA-NeXT's and OneVision's tiles: per image of the model's keyword inputs, each image token's tile (counted
    over every image's; ``-1``: a learned newline), from the model's own packing (:func:`packed_layout`); None for
    LLaVA (one tile an image)."""
    if model.config.model_type == "llava":
        return None
    tower = model.model.vision_tower
    tokens = getattr(tower, "vision_model", tower).embeddings.num_positions
    read = tokens - (1 if model.config.vision_feature_select_strategy == "default" else 0)
    return lambda kwargs: [placed[:, 0] for placed in packed_layout(model, kwargs, read, "units='tiles'")[1]]


def build(model: nn.Module) -> ModelSpec:
    return decoder_spec(
        model,
        model.model.language_model,
        model.config.image_token_index,
        tower=tower_spec(model),
        image_tiles=image_tiles(model),
    )

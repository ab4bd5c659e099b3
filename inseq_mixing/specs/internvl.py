"""InternVL (Shanghai AI Lab, 2024–2025): a vision tower whose patch states are pixel-shuffled and projected into the
embeddings of the image's tokens in a Llama-layout language model's input (Qwen2 in InternVL 3), an image given as
tiles. The decoder is explained as LLaVA's is; traced with ``pixel_values`` ``(tiles, 3, H, W)``, the tiles of every
image of the batch in one run (a row holds the tiles whose tokens it holds, in order).

The tower (our extension, :mod:`inseq_mixing.methods.tower`): InternViT's blocks are BEiT's layout
(``layernorm_before``, attention with ``projection_layer``, ``lambda_1``; ``layernorm_after``, the MLP, ``lambda_2``);
the image tokens read
its last states without [CLS], 2 × 2 of them shuffled into one (which patches, in which order, read from the model's
own shuffle run on patch indices) and projected by an MLP (:class:`~.base.PatchMerge`: a LayerNorm on the
concatenation, a linear map, GELU, a linear map). Each tile is one tower image. Read only where the features are the
tower's last states (``vision_feature_layer=-1``) and its attention a plain softmax (no query-key norm changes that:
the probabilities are recorded as they are).
"""

import torch
from torch import nn

from .base import FFNSpec, LayerSpec, ModelSpec, PatchMerge, StackSpec, TowerSpec
from .base import attention as attn_spec
from .beit import layer_scale
from .llava import decoder_spec

FAMILY = "InternVL (a Llama-layout decoder over pixel-shuffled image tiles and text)"
KIND = "vision-language"
MODEL_TYPES = {"internvl"}


def vision_layer_spec(layer: nn.Module, config) -> LayerSpec:
    """One InternViT block."""
    attention, mlp = layer.attention, layer.mlp
    heads = (config.num_attention_heads, config.num_attention_heads, config.hidden_size // config.num_attention_heads)
    self_attn = attn_spec(attention, attention.v_proj, attention.projection_layer, heads, layer.layernorm_before, True,
                          out_norm=layer_scale(layer, "lambda_1", None))  # fmt: skip
    ffn = FFNSpec(forward=mlp, norm=layer.layernorm_after, pre_norm=True, w_in=mlp.fc1, w_out=mlp.fc2,
                  activation=mlp.activation_fn, out_norm=layer_scale(layer, "lambda_2", mlp))  # fmt: skip
    return LayerSpec(module=layer, self_attn=self_attn, ffn=ffn)


def tower_spec(model: nn.Module) -> TowerSpec | None:
    """The vision tower and the projector as the image tokens read them, or None where the features come from another
    layer than the last (or several) or keep [CLS]."""
    config, tower = model.config, model.model.vision_tower
    if config.vision_feature_layer != -1 or config.vision_feature_select_strategy != "default":
        return None
    side = config.vision_config.image_size[0] // config.vision_config.patch_size[0]
    order = torch.arange(side * side, dtype=torch.float64).reshape(1, side, side, 1)
    groups = model.model.pixel_shuffle(order, scale_factor=config.downsample_ratio)
    groups = groups.reshape(-1, groups.shape[-1]).round().long()  # (tokens, n): patch indices
    final = None if isinstance(tower.layernorm, nn.Identity) else tower.layernorm
    spec = ModelSpec(family=config.vision_config.model_type, causal=False,
                     decoder=StackSpec(layers=[vision_layer_spec(layer, config.vision_config)
                                               for layer in tower.encoder.layer], final_norm=final))  # fmt: skip
    projector = model.model.multi_modal_projector
    merge = PatchMerge(groups, projector.linear_1, norm=projector.layer_norm, activation=projector.act,
                       out=projector.linear_2)  # fmt: skip
    return TowerSpec(module=tower, spec=spec, layers=len(tower.encoder.layer), first_feature=1,
                     tokens=side * side + 1, merge=merge)  # fmt: skip


def build(model: nn.Module) -> ModelSpec:
    return decoder_spec(model, model.model.language_model, model.config.image_token_id, tower=tower_spec(model))

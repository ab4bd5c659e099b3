"""Qwen2-VL and Qwen2.5-VL (Alibaba Qwen, 2024–2025): a vision tower whose patch states are merged 2 × 2 into the
embeddings of the image's tokens in a Qwen2 language model's input, with multimodal rotary positions (M-RoPE: an
image token's temporal, row and column positions). The decoder is explained as LLaVA's is: its positions are the
image's tokens and the text's, every method reads them as it reads a Qwen2's (the image tokens' embeddings are the
first block's input). The model computes its positions from the ids, the image grids and the padding mask itself
(``own_positions``): the trace is given ``pixel_values``, ``image_grid_thw`` and ``mm_token_type_ids`` (what the
processor returns) and passes no positions.

The tower (our extension, :mod:`inseq_mixing.methods.tower`): pre-LN blocks (a LayerNorm and a GELU MLP in
Qwen2-VL's, an RMSNorm and a SwiGLU MLP in Qwen2.5-VL's) with 2-D rotary positions, read one image at a time
(:mod:`.packed_tower`); Qwen2.5-VL's blocks other than ``fullatt_block_indexes`` attend within windows of 2 × 2-patch
units (its own reordering undone: the trace runs the processor's order, each window a mask). The merger normalises each
patch, concatenates each unit's four and applies an MLP (:class:`~.base.PatchMerge` with ``patch_norm``).
"""

import torch
from torch import nn
from transformers.vision_utils import get_vision_window_index

from .base import FFNSpec, ModelSpec, PatchMerge, TowerSpec
from .llava import decoder_spec
from .packed_tower import packed_tower_spec

FAMILY = "Qwen2-VL, Qwen2.5-VL (a Qwen2 decoder over image and text tokens, multimodal rotary positions)"
KIND = "vision-language"
MODEL_TYPES = {"qwen2_vl", "qwen2_5_vl"}


def ffn_spec(block: nn.Module) -> FFNSpec:
    """A tower block's MLP: Qwen2-VL's ``fc1``, activation, ``fc2``; Qwen2.5-VL's SwiGLU."""
    mlp = block.mlp
    if hasattr(mlp, "gate_proj"):
        return FFNSpec(forward=mlp, norm=block.norm2, pre_norm=True, w_in=mlp.up_proj, w_out=mlp.down_proj,
                       activation=mlp.act_fn, w_gate=mlp.gate_proj)  # fmt: skip
    return FFNSpec(forward=mlp, norm=block.norm2, pre_norm=True, w_in=mlp.fc1, w_out=mlp.fc2, activation=mlp.act)


def tower_spec(model: nn.Module) -> TowerSpec:
    """The tower and the merger as the image tokens read them (Qwen2.5-VL's windows in the processor's order)."""
    tower = model.model.visual
    merger = tower.merger
    merge = PatchMerge(tower.spatial_merge_size**2, merger.mlp[0], norm=merger.ln_q, activation=merger.mlp[1],
                       out=merger.mlp[2], patch_norm=True)  # fmt: skip
    order = None
    if model.config.model_type == "qwen2_5_vl":

        def order(grid: torch.Tensor) -> torch.Tensor:  # the model's windows of units: the unit at each position
            units, _ = get_vision_window_index(grid, tower.spatial_merge_size, tower.window_size, tower.patch_size)
            size = tower.spatial_merge_unit
            return (units[:, None] * size + torch.arange(size, device=units.device)).flatten()

    return packed_tower_spec(tower, ffn_spec, merge, order)


def build(model: nn.Module) -> ModelSpec:
    return decoder_spec(model, model.model.language_model, model.config.image_token_id, own_positions=True,
                        tower=tower_spec(model))  # fmt: skip

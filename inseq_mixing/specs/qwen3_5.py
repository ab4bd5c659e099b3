"""Qwen3.5 and Qwen3.5-MoE (Alibaba Qwen, 2026), the vision–language models: Qwen3-VL's vision tower (patch states
merged 2 × 2 into the image tokens' embeddings, multimodal rotary positions interleaved over the rotated channels), no
DeepStack, over the Qwen3.5 text decoder: Gated DeltaNet blocks and, every fourth block, gated softmax attention, with
a dense SwiGLU FFN (Qwen3.5) or a routed mixture of experts with a gated shared expert (Qwen3.5-MoE).

The decoder is explained as Qwen2-VL's is (the image tokens' embeddings are the first block's input; the model
computes its positions itself), each block read as the text decoder's (:mod:`.qwen3_next`: the delta rule unrolled
into one exact mixing matrix per value head, the gated attention as a mixer). **Our extension**: the methods' papers
treat neither mixer, nor image tokens read by one. The tower (our extension): Qwen2-VL's reading
(:mod:`.qwen2_vl`, :mod:`.packed_tower`), its blocks LayerNorms and a GELU MLP, its merger's LayerNorm on each patch
(``use_postshuffle_norm=False``).
"""

from torch import nn

from . import qwen3_next
from .base import FFNSpec, ModelSpec, PatchMerge, TowerSpec
from .llava import decoder_spec
from .packed_tower import packed_tower_spec

FAMILY = "Qwen3.5, Qwen3.5-MoE (a Gated DeltaNet hybrid decoder over image and text tokens)"
KIND = "vision-language"
MODEL_TYPES = {"qwen3_5", "qwen3_5_moe"}


def ffn_spec(block: nn.Module) -> FFNSpec:
    mlp = block.mlp
    return FFNSpec(forward=mlp, norm=block.norm2, pre_norm=True, w_in=mlp.linear_fc1, w_out=mlp.linear_fc2,
                   activation=mlp.act_fn)  # fmt: skip


def tower_spec(model: nn.Module) -> TowerSpec:
    tower = model.model.visual
    merger = tower.merger
    merge = PatchMerge(tower.spatial_merge_size**2, merger.linear_fc1, norm=merger.norm, activation=merger.act_fn,
                       out=merger.linear_fc2, patch_norm=not merger.use_postshuffle_norm)  # fmt: skip
    return packed_tower_spec(tower, ffn_spec, merge)


def build(model: nn.Module) -> ModelSpec:
    return decoder_spec(model, model.model.language_model, model.config.image_token_id,
                        layer_spec=qwen3_next.layer_spec, own_positions=True, tower=tower_spec(model))  # fmt: skip

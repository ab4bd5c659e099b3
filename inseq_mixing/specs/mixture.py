"""Mixture-of-experts decoders in the Llama layout (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, PhiMoE, GLM-4-MoE,
ERNIE-4.5-MoE, Hunyuan-MoE; EXAONE-MoE, MiniMax-M2, Solar-Open, Sarvam-MoE, Mellum and HY-V3, whose transformers
modules have the same layout, some with q/k norms or sliding windows inside the recorded probabilities): Llama's
attention sub-block, and an FFN sub-block that is a routed mixture of gated
experts (transformers' fused experts), with a shared expert in some families (Qwen2-MoE's behind a sigmoid gate).

Layers whose FFN is dense (Qwen2-MoE's ``mlp_only_layers``, GLM-4-MoE's first layers) are Llama's. The routing is
recorded at the traced pass and frozen there (:class:`~inseq_mixing.specs.base.MoESpec`). Our extension: none of the
methods' papers treats a mixture of experts.
"""

from torch import nn

from . import llama
from .base import FFNSpec, LayerSpec, ModelSpec, MoESpec, check_experts

FAMILY = (
    "Mixture of experts, Llama layout (Mixtral, Qwen-MoE, OLMoE, PhiMoE, GLM-4-MoE, ERNIE-4.5, Hunyuan, EXAONE-MoE, "
    "MiniMax-M2, Solar-Open, Sarvam-MoE, Mellum, HY-V3)"
)
MODEL_TYPES = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "phimoe", "glm4_moe", "ernie4_5_moe", "hunyuan_v1_moe",
               "exaone_moe", "minimax_m2", "solar_open", "sarvam_moe", "mellum", "hy_v3"}  # fmt: skip

#: Where the families keep a block's router and its shared expert, in the order looked up.
ROUTER_NAMES = ("gate", "router")
SHARED_EXPERT_NAMES = ("shared_expert", "shared_experts", "shared_mlp")


def dense_ffn(mlp: nn.Module) -> FFNSpec:
    """A gated dense FFN (a shared expert) with no norms of its own."""
    return FFNSpec(mlp, None, True, mlp.up_proj, mlp.down_proj, mlp.act_fn, mlp.gate_proj)


def _first(module: nn.Module, names: tuple[str, ...]) -> nn.Module | None:
    return next((getattr(module, name) for name in names if getattr(module, name, None) is not None), None)


def ffn_spec(layer: nn.Module, norms: tuple[nn.Module | None, nn.Module | None] | None = None) -> FFNSpec | MoESpec:
    """The FFN sub-block of a Llama-layout block, dense or a mixture of experts; ``norms`` as in
    :func:`llama.gated_ffn`.

    Raises:
        UnsupportedModelError: The experts are laid out otherwise (biases, a clamped gate of their own).
    """
    block = layer.mlp
    if not hasattr(block, "experts"):
        return llama.gated_ffn(layer, block.up_proj, block.gate_proj, block.act_fn, norms)
    check_experts(block)
    in_norm, out_norm = norms or (layer.post_attention_layernorm, None)
    shared = _first(block, SHARED_EXPERT_NAMES)
    return MoESpec(
        forward=block,
        norm=in_norm,
        pre_norm=True,
        router=_first(block, ROUTER_NAMES),
        experts=block.experts,
        shared=None if shared is None else dense_ffn(shared),
        shared_gate=getattr(block, "shared_expert_gate", None),
        out_norm=out_norm,
    )


def layer_spec(layer: nn.Module, config) -> LayerSpec:
    return LayerSpec(
        module=layer, self_attn=llama.attention_spec(layer, config, layer.self_attn.v_proj), ffn=ffn_spec(layer)
    )


def build(model: nn.Module) -> ModelSpec:
    return llama.build(model, layer_spec)

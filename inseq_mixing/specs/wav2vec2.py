"""wav2vec 2.0 and HuBERT (speech encoders; CTC heads): post-LN blocks, or pre-LN in the "stable layer norm"
variants (``config.do_stable_layer_norm``: large models), which end with a final layer norm.

The raw waveform goes through a convolutional feature encoder (one frame per 20 ms at 16 kHz), a feature projection,
then a positional convolution over frames added to each frame (post-LN models then normalise the sum): that
convolution mixes neighbouring frames outside attention, before the first block. Decompositions start at the first
block's input, after it. Blocks: ``attention`` (``v_proj`` / ``out_proj``), ``layer_norm``, ``feed_forward``
(``intermediate_dense``, activation, ``output_dense``), ``final_layer_norm``. ``...ForCTC`` explains the per-frame
logits of its ``lm_head``; the bare encoder (``Wav2Vec2Model``, ``HubertModel``) gives the map methods only.
"""

from torch import nn

from .base import FFNSpec, LayerSpec, ModelSpec, StackSpec, UnsupportedModelError
from .base import attention as attn_spec
from .encoder_heads import head_spec

FAMILY = "wav2vec 2.0, HuBERT (speech, CTC)"
KIND = "speech"
MODEL_TYPES = {"wav2vec2", "hubert"}

HEADS = {"ctc": ("lm_head",)}


def layer_spec(layer: nn.Module, pre_norm: bool) -> LayerSpec:
    attention = layer.attention
    heads = (attention.num_heads, attention.num_heads, attention.head_dim)
    feed_forward = layer.feed_forward
    return LayerSpec(
        module=layer,
        self_attn=attn_spec(attention, attention.v_proj, attention.out_proj, heads, layer.layer_norm, pre_norm),
        ffn=FFNSpec(
            forward=feed_forward,
            norm=layer.final_layer_norm,
            pre_norm=pre_norm,
            w_in=feed_forward.intermediate_dense,
            w_out=feed_forward.output_dense,
            activation=feed_forward.intermediate_act_fn,
        ),
    )


def build(model: nn.Module) -> ModelSpec:
    config = model.config
    if getattr(config, "adapter_attn_dim", None) is not None or getattr(config, "add_adapter", False):
        raise UnsupportedModelError(
            f"{type(model).__name__} has adapter layers (adapter_attn_dim / add_adapter), which inseq-mixing does not "
            "decompose: load the model without them."
        )
    pre_norm = bool(config.do_stable_layer_norm)
    encoder = model.base_model.encoder
    return ModelSpec(
        family=config.model_type,
        decoder=StackSpec(
            layers=[layer_spec(layer, pre_norm) for layer in encoder.layers],
            final_norm=encoder.layer_norm if pre_norm else None,
        ),
        causal=False,
        head=head_spec(model, HEADS),
    )

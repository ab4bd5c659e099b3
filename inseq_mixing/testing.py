"""Tiny (or full-size) random models of every supported family and a local word-level tokenizer.

Nothing here downloads anything: models are built from configs with random weights, which is all that tests and
benchmarks need to check the math, the shapes and the speed.
"""

import inspect
from dataclasses import dataclass

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast


#: The method lists the tests parametrize over, derived from the declarations (a new method joins them by its
#: declaration alone): methods that explain a logit, map methods, and map methods whose rows sum to 1.
def _methods(keep) -> tuple[str, ...]:
    from .declarations import DECLARATIONS

    return tuple(name for name, declaration in DECLARATIONS.items() if keep(declaration))


LOGIT_METHODS = _methods(lambda declaration: declaration.explains_logit)
MAP_METHODS = _methods(lambda declaration: not declaration.explains_logit)
ROW_METHODS = _methods(lambda declaration: declaration.rows_sum_to_one)

SPECIAL_TOKENS = ["<pad>", "</s>", "<unk>", "<s>"]
PAD_ID, EOS_ID, UNK_ID, BOS_ID = range(4)
WORDS = (
    "the a books book in library were was read by many people cat dog sat on mat and it . , she he they we "
    "le la les livres livre dans bibliothèque ont été lus par beaucoup de gens chat chien assis sur tapis et il "
    "elle ils nous hello world good morning see you soon translate this sentence please"
).split()

#: Families with a builder, the names used by test parametrization.
SEQ2SEQ_FAMILIES = ("marian", "bart", "mbart", "m2m_100", "t5", "t5_gated", "mt5")
DECODER_FAMILIES = (
    "gpt2",
    "gpt_neox",
    "gpt_neox_sequential",
    "opt",
    "opt_post_ln",
    "llama",
    "qwen2",
    "mistral",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3",
    "phi3",
    "olmo2",
)
#: Mixture-of-experts decoders (tiny: :data:`TINY_EXPERTS` experts, top-:data:`TINY_TOP_K`), generation families like
#: the others.
MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "phimoe", "glm4_moe", "ernie4_5_moe", "hunyuan_v1_moe",
                "flex_olmo", "deepseek_v2", "deepseek_v3", "gpt_oss", "granitemoe", "granitemoeshared", "exaone_moe",
                "minimax_m2", "solar_open", "sarvam_moe", "mellum", "hy_v3")  # fmt: skip
#: Mixtures in the Llama layout built from their own configs' field names (:func:`_mixture`).
CONFIGURED_MIXTURES = ("exaone_moe", "minimax_m2", "solar_open", "sarvam_moe", "mellum", "hy_v3")
DECODER_FAMILIES = DECODER_FAMILIES + MOE_FAMILIES
ALL_FAMILIES = SEQ2SEQ_FAMILIES + DECODER_FAMILIES
#: Decoders whose token mixers are not all attention: hybrids, and Mamba-style models without attention or FFN
#: (tests/test_hybrids.py; not among the families above, whose tests every method runs on).
HYBRID_FAMILIES = ("bamba", "lfm2", "jamba", "qwen3_next", "qwen3_5", "qwen3_5_moe", "lfm2_moe", "mamba", "mamba2",
                   "falcon_mamba", "nemotron_h", "granitemoehybrid", "granitemoehybrid_dense",
                   "falcon_h1", "zamba2", "zamba")  # fmt: skip
#: Hybrids the builder knows that only some tests read (Falcon-H1 with its Mamba-2 mixers' gated norm).
HYBRID_VARIANTS = ("falcon_h1_norm",)
#: Families with grouped-query attention whose RMSNorms round through float32 (even in a float64 model).
LLAMA_STYLE_FAMILIES = ("llama", "qwen2", "mistral", "qwen3", "gemma", "gemma2", "gemma3", "phi3", "olmo2",
                        *MOE_FAMILIES)  # fmt: skip
#: Experts of the tiny mixture-of-experts models, and how many each position is routed to.
TINY_EXPERTS, TINY_TOP_K = 4, 2
#: Sliding-window size of the tiny Gemma 2 / 3 models (every other layer), small enough for test inputs to exceed it.
TINY_SLIDING_WINDOW = 3


def word_tokenizer(seq2seq: bool = True, words: list[str] | None = None) -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer; seq2seq tokenizers append ``</s>`` like Marian's."""
    vocab = {token: idx for idx, token in enumerate(SPECIAL_TOKENS + list(words or WORDS))}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if seq2seq:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", EOS_ID)]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>", unk_token="<unk>", bos_token="<s>"
    )


def _bart_like(config_cls, model_cls, vocab: int, d_model: int, layers: int, heads: int, ffn: int, **extra):
    config = config_cls(
        vocab_size=vocab,
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=ffn,
        decoder_ffn_dim=ffn,
        max_position_embeddings=1024,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        bos_token_id=BOS_ID,
        decoder_start_token_id=PAD_ID,
        forced_eos_token_id=None,
        dropout=0.1,
        attention_dropout=0.1,
        **extra,
    )
    return model_cls(config)


def _t5(vocab: int, d_model: int, layers: int, heads: int, ffn: int, gated: bool, config_cls=None, model_cls=None):
    config_cls = config_cls or transformers.T5Config
    model_cls = model_cls or transformers.T5ForConditionalGeneration
    config = config_cls(
        vocab_size=vocab,
        d_model=d_model,
        d_kv=d_model // heads,
        d_ff=ffn,
        num_layers=layers,
        num_decoder_layers=layers,
        num_heads=heads,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        feed_forward_proj="gated-gelu" if gated else "relu",
        tie_word_embeddings=not gated,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        decoder_start_token_id=PAD_ID,
        dropout_rate=0.1,
    )
    return model_cls(config)


def _decoder_only(family: str, vocab: int, d_model: int, layers: int, heads: int, ffn: int, kv_heads: int | None):
    if family == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=vocab, n_embd=d_model, n_layer=layers, n_head=heads, n_inner=ffn, n_positions=1024,
            bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
        )  # fmt: skip
        return transformers.GPT2LMHeadModel(config)
    if family in ("gpt_neox", "gpt_neox_sequential"):  # Pythia's layout: parallel residual, partial rotary
        config = transformers.GPTNeoXConfig(
            vocab_size=vocab, hidden_size=d_model, num_hidden_layers=layers, num_attention_heads=heads,
            intermediate_size=ffn, max_position_embeddings=1024, use_parallel_residual=family == "gpt_neox",
            bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID, tie_word_embeddings=False,
        )  # fmt: skip
        return transformers.GPTNeoXForCausalLM(config)
    if family in ("opt", "opt_post_ln"):  # the post-LN variant is laid out like OPT-350m: project_in / project_out
        config = transformers.OPTConfig(
            vocab_size=vocab, hidden_size=d_model, num_hidden_layers=layers, num_attention_heads=heads, ffn_dim=ffn,
            max_position_embeddings=1024, do_layer_norm_before=family == "opt",
            word_embed_proj_dim=d_model if family == "opt" else d_model // 2,
            bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
        )  # fmt: skip
        return transformers.OPTForCausalLM(config)
    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "gemma": (transformers.GemmaConfig, transformers.GemmaForCausalLM),
        "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM),
        "gemma3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM),
        "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM),
        "olmo2": (transformers.Olmo2Config, transformers.Olmo2ForCausalLM),
    }[family]
    extra = {"head_dim": d_model // heads} if family in ("qwen3", "gemma", "gemma2", "gemma3") else {}
    if family in ("gemma2", "gemma3"):  # sliding-window layers every other layer; Gemma 2 soft-caps (small caps bite)
        extra.update(
            sliding_window=TINY_SLIDING_WINDOW,
            layer_types=[("sliding_attention", "full_attention")[i % 2] for i in range(layers)],
            query_pre_attn_scalar=d_model // heads,
        )
        if family == "gemma2":
            extra.update(final_logit_softcapping=2.0, attn_logit_softcapping=3.0)
    config = config_cls(
        vocab_size=vocab,
        hidden_size=d_model,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads or max(1, heads // 2),
        max_position_embeddings=1024,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        tie_word_embeddings=False,
        **extra,
    )
    return model_cls(config)


def _mixture(family: str, vocab: int, d_model: int, layers: int, heads: int, ffn: int, kv_heads: int | None):
    """A tiny mixture-of-experts decoder: :data:`TINY_EXPERTS` experts of width ``ffn // 2``, top-:data:`TINY_TOP_K`
    routing; Qwen2-MoE with a gated shared expert and a dense first layer, GLM-4-MoE and ERNIE with a shared
    expert; DeepSeek-V2 (keys and values from a latent) and V3 (queries from a latent too) with multi-head latent
    attention, a shared expert and a dense first layer; GPT-OSS with sinks, alternating sliding-window layers and its
    clamped experts (a small clamp limit, so that the clamps bite in the tests); Granite-MoE with every multiplier
    away from 1 (Granite-MoE-Shared: a shared FFN too)."""
    experts, top_k, width = TINY_EXPERTS, TINY_TOP_K, ffn // 2
    if family in CONFIGURED_MIXTURES:  # each its own names for the experts' count and width: those it has
        config_class = type(transformers.AutoConfig.for_model(family))
        known = inspect.signature(config_class.__init__).parameters
        wanted = dict(vocab_size=vocab, hidden_size=d_model, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv_heads or max(1, heads // 2), head_dim=d_model // heads,
                      intermediate_size=ffn, moe_intermediate_size=width, num_experts=experts,
                      num_local_experts=experts, n_routed_experts=experts, num_experts_per_tok=top_k,
                      first_k_dense_replace=1, n_group=1, topk_group=1, max_position_embeddings=1024,
                      bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
                      tie_word_embeddings=False)  # fmt: skip
        config = config_class(**{key: value for key, value in wanted.items() if key in known})
        model = transformers.AutoModelForCausalLM.from_config(config)
        model.set_experts_implementation("eager")
        return model
    name = {"mixtral": "Mixtral", "qwen2_moe": "Qwen2Moe", "qwen3_moe": "Qwen3Moe", "olmoe": "Olmoe",
            "phimoe": "Phimoe", "glm4_moe": "Glm4Moe", "ernie4_5_moe": "Ernie4_5_Moe",
            "hunyuan_v1_moe": "HunYuanMoEV1", "flex_olmo": "FlexOlmo", "deepseek_v2": "DeepseekV2",
            "deepseek_v3": "DeepseekV3", "gpt_oss": "GptOss", "granitemoe": "GraniteMoe",
            "granitemoeshared": "GraniteMoeShared"}[family]  # fmt: skip
    granite = dict(
        intermediate_size=width,
        num_local_experts=experts,
        num_experts_per_tok=top_k,
        embedding_multiplier=1.5,
        residual_multiplier=0.7,
        attention_multiplier=0.3,
        logits_scaling=2.0,
    )
    extra = {
        "mixtral": dict(intermediate_size=width, num_local_experts=experts, num_experts_per_tok=top_k),
        "phimoe": dict(intermediate_size=width, num_local_experts=experts, num_experts_per_tok=top_k),
        "qwen2_moe": dict(intermediate_size=ffn, moe_intermediate_size=width, shared_expert_intermediate_size=width,
                          num_experts=experts, num_experts_per_tok=top_k, decoder_sparse_step=1, mlp_only_layers=[0]),
        "qwen3_moe": dict(head_dim=d_model // heads, intermediate_size=ffn, moe_intermediate_size=width,
                          num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=True),
        "olmoe": dict(intermediate_size=width, num_experts=experts, num_experts_per_tok=top_k),
        "flex_olmo": dict(intermediate_size=width, num_experts=experts, num_experts_per_tok=top_k),
        "glm4_moe": dict(head_dim=d_model // heads, intermediate_size=ffn, moe_intermediate_size=width,
                         n_routed_experts=experts, num_experts_per_tok=top_k, n_shared_experts=1,
                         first_k_dense_replace=1, n_group=1, topk_group=1),
        "ernie4_5_moe": dict(intermediate_size=ffn, moe_intermediate_size=width, moe_num_experts=experts,
                             moe_k=top_k, moe_num_shared_experts=1, moe_layer_start_index=0),
        "hunyuan_v1_moe": dict(head_dim=d_model // heads, intermediate_size=width, num_experts=experts,
                               moe_topk=top_k),
        "deepseek_v2": dict(intermediate_size=ffn, moe_intermediate_size=width, n_routed_experts=experts,
                            num_experts_per_tok=top_k, n_shared_experts=1, first_k_dense_replace=1, n_group=1,
                            topk_group=1, q_lora_rank=None, kv_lora_rank=max(2, d_model // 2),
                            qk_rope_head_dim=2, qk_nope_head_dim=2, v_head_dim=d_model // heads),
        "deepseek_v3": dict(intermediate_size=ffn, moe_intermediate_size=width, n_routed_experts=experts,
                            num_experts_per_tok=top_k, n_shared_experts=1, first_k_dense_replace=1, n_group=1,
                            topk_group=1, q_lora_rank=max(2, d_model // 2), kv_lora_rank=max(2, d_model // 2),
                            qk_rope_head_dim=2, qk_nope_head_dim=2, v_head_dim=d_model // heads),
        "granitemoe": granite,
        "granitemoeshared": dict(**granite, shared_intermediate_size=width),
        "gpt_oss": dict(head_dim=d_model // heads, intermediate_size=width, num_local_experts=experts,
                        num_experts_per_tok=top_k, sliding_window=TINY_SLIDING_WINDOW, swiglu_limit=1.0,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    }[family]  # fmt: skip
    if family.startswith("deepseek"):  # every head its own keys and values (decompressed from one latent)
        kv_heads = heads
    config_name = "HunYuanMoEV1Config" if family == "hunyuan_v1_moe" else f"{name}Config"
    config = getattr(transformers, config_name)(
        vocab_size=vocab, hidden_size=d_model, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads or max(1, heads // 2), max_position_embeddings=1024, bos_token_id=BOS_ID,
        eos_token_id=EOS_ID, pad_token_id=PAD_ID, tie_word_embeddings=False, **extra,
    )  # fmt: skip
    model = getattr(transformers, f"{name}ForCausalLM")(config)
    model.set_experts_implementation("eager")  # transformers' grouped matmul has no float64 (the property tests')
    return model


def _hybrid(family: str, vocab: int, d_model: int, layers: int, heads: int, ffn: int, kv_heads: int | None):
    """A tiny hybrid decoder: Bamba with Mamba-2 layers (``heads`` heads of ``d_model // 2`` channels, two groups,
    state 4, four taps, chunks of 4 so that test inputs cross chunks), LFM2 with short convolutions of three taps
    (LFM2-MoE: experts past the first two layers, or at every layer of a model of one or two),
    Jamba with Mamba layers and a mixture of experts at layer 1, or Qwen3-Next / Qwen3.5 / Qwen3.5-MoE with Gated
    DeltaNet layers (three taps) and gated attention; attention at layer 1 (every third layer after it)."""
    common = dict(vocab_size=vocab, hidden_size=d_model, intermediate_size=ffn, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads or max(1, heads // 2),
                  max_position_embeddings=1024, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
                  tie_word_embeddings=False)  # fmt: skip
    if family == "jamba":  # Mamba layers of 32 channels, 4 states; a mixture of 4 experts (top 2) at layer 1
        config = transformers.JambaConfig(
            attn_layer_period=3, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, num_experts=4,
            num_experts_per_tok=2, mamba_d_state=4, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4,
            use_mamba_kernels=False, **common,
        )  # fmt: skip
        return transformers.JambaForCausalLM(config)
    if family.startswith("granitemoehybrid"):  # every multiplier away from 1; experts unless "_dense"
        layer_types = [("linear_attention", "attention", "linear_attention")[i % 3] for i in range(layers)]
        experts = 0 if family.endswith("dense") else 4
        config = transformers.GraniteMoeHybridConfig(
            layer_types=layer_types, mamba_n_heads=2 * d_model // 8, mamba_d_head=8, mamba_n_groups=2,
            mamba_d_state=4, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=4, num_local_experts=experts,
            num_experts_per_tok=2, shared_intermediate_size=ffn // 2, position_embedding_type="rope",
            embedding_multiplier=1.5, residual_multiplier=0.7, attention_multiplier=0.3, logits_scaling=2.0,
            **{**common, "intermediate_size": ffn // 2},
        )  # fmt: skip
        model = transformers.GraniteMoeHybridForCausalLM(config)
        model.set_experts_implementation("eager")
        return model
    if family.startswith("falcon_h1"):  # Mamba-2 and attention in every block, every multiplier away from 1
        config = transformers.FalconH1Config(
            head_dim=2 * d_model // heads, mamba_d_ssm=2 * d_model, mamba_n_heads=2 * d_model // 8, mamba_d_head=8,
            mamba_n_groups=2, mamba_d_state=4, mamba_d_conv=4, mamba_chunk_size=4, projectors_bias=True,
            mamba_rms_norm=family.endswith("_norm"), mamba_norm_before_gate=True, embedding_multiplier=1.5,
            lm_head_multiplier=0.5, mlp_multipliers=[1.2, 0.9], key_multiplier=0.7, attention_in_multiplier=0.8,
            attention_out_multiplier=1.4, ssm_multipliers=[0.9, 1.1, 0.8, 1.2, 0.7], ssm_in_multiplier=1.3,
            ssm_out_multiplier=0.6, **common,
        )  # fmt: skip
        return transformers.FalconH1ForCausalLM(config)
    if family == "zamba2":  # shared attention blocks at layers 0 and 2 of three (one shared block, each call its
        # adapters; every other layer from the fourth), Mamba-2 heads of 8 channels, two groups, chunks of 4
        pattern = [("hybrid", "mamba", "hybrid", "mamba")[i % 4] for i in range(layers)]
        config = transformers.Zamba2Config(
            layers_block_type=pattern, mamba_d_state=4, mamba_d_conv=4, mamba_expand=2, mamba_ngroups=2,
            n_mamba_heads=2 * d_model // 8, chunk_size=4, num_mem_blocks=1, use_shared_attention_adapter=True,
            adapter_rank=4, use_mem_rope=True, use_mamba_kernels=False, hidden_act="gelu",
            **{**common, "num_key_value_heads": heads},  # its adapters need as many key/value heads as query heads
        )  # fmt: skip
        return transformers.Zamba2ForCausalLM(config)
    if family == "zamba":  # Zamba 2's layout over Mamba's selective scan in two heads (no adapters, no rotary)
        pattern = [("hybrid", "mamba", "hybrid", "mamba")[i % 4] for i in range(layers)]
        config = transformers.ZambaConfig(
            layers_block_type=pattern, mamba_d_state=4, mamba_d_conv=4, mamba_expand=2, n_mamba_heads=2,
            mamba_dt_rank=4, attention_head_dim=2 * d_model // heads, use_mamba_kernels=False, hidden_act="gelu",
            **{**common, "num_key_value_heads": heads},
        )  # fmt: skip
        return transformers.ZambaForCausalLM(config)
    if family == "nemotron_h":  # blocks of one sub-block: Mamba-2, attention, FFN, Mamba-2, ...
        pattern = [("linear_attention", "full_attention", "mlp", "linear_attention")[i % 4] for i in range(layers)]
        config = transformers.NemotronHConfig(
            layers_block_type=pattern, head_dim=2 * d_model // heads, mamba_num_heads=2 * d_model // 8,
            mamba_head_dim=8, n_groups=2, ssm_state_size=4, conv_kernel=4, expand=2, chunk_size=4, **common,
        )  # fmt: skip
        return transformers.NemotronHForCausalLM(config)
    if family in ("mamba", "falcon_mamba", "mamba2"):  # no attention, no FFN
        if family == "mamba2":  # heads of 8 channels, two groups, chunks of 4 that test inputs cross
            config = transformers.Mamba2Config(num_heads=2 * d_model // 8, head_dim=8, n_groups=2, state_size=4,
                                               conv_kernel=4, expand=2, chunk_size=4, **common)  # fmt: skip
            return transformers.Mamba2ForCausalLM(config)
        name = {"mamba": "Mamba", "falcon_mamba": "FalconMamba"}[family]
        config = getattr(transformers, f"{name}Config")(state_size=4, expand=2, conv_kernel=4, time_step_rank=4,
                                                        use_mambapy=False, **common)  # fmt: skip
        return getattr(transformers, f"{name}ForCausalLM")(config)
    if family.startswith("qwen3"):  # Gated DeltaNet layers of 2 key and 4 value heads, gated attention at layer 1
        layer_types = [("linear_attention", "full_attention", "linear_attention")[i % 3] for i in range(layers)]
        linear = dict(linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=d_model // 4,
                      linear_value_head_dim=d_model // 4, linear_conv_kernel_dim=3, layer_types=layer_types,
                      head_dim=2 * d_model // heads)  # fmt: skip
        experts = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=ffn // 2,
                       shared_expert_intermediate_size=ffn // 2)  # fmt: skip
        if family == "qwen3_5":  # a dense FFN
            return transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**linear, **common))
        if family == "qwen3_5_moe":  # experts in every layer
            common.pop("intermediate_size")
            model = transformers.Qwen3_5MoeForCausalLM(transformers.Qwen3_5MoeTextConfig(**linear, **experts,
                                                                                         **common))  # fmt: skip
        else:  # Qwen3-Next: a dense FFN at layer 2
            model = transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(
                decoder_sparse_step=1, mlp_only_layers=[2], **linear, **experts, **common))  # fmt: skip
        model.set_experts_implementation("eager")
        return model
    if family.startswith("lfm2"):
        layer_types = [("conv", "full_attention", "conv")[i % 3] for i in range(layers)]
        if family == "lfm2":
            return transformers.Lfm2ForCausalLM(transformers.Lfm2Config(conv_L_cache=3, layer_types=layer_types,
                                                                        **common))  # fmt: skip
        config = transformers.Lfm2MoeConfig(  # experts from layer 0, their selection biased
            conv_L_cache=3, layer_types=layer_types, num_dense_layers=min(layers - 1, 2) if layers > 2 else 0,
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=ffn // 2, use_expert_bias=True, **common,
        )  # fmt: skip
        model = transformers.Lfm2MoeForCausalLM(config)
        generator = torch.Generator().manual_seed(1)
        for name, buffer in model.named_buffers():
            if name.endswith("expert_bias"):  # the selection's bias (a buffer, zero at init)
                buffer.copy_(0.3 * torch.randn(buffer.shape, generator=generator))
        model.set_experts_implementation("eager")
        return model
    config = transformers.BambaConfig(
        attn_layer_indices=list(range(1, layers, 3)), mamba_n_heads=heads, mamba_d_head=2 * d_model // heads,
        mamba_n_groups=2, mamba_d_state=4, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=4, **common,
    )  # fmt: skip
    return transformers.BambaForCausalLM(config)


#: Vision–language decoders with a tiny builder (:func:`tiny_vlm`; issue 56, the decoder's first step).
VLM_FAMILIES = ("llava", "llava_next", "llava_onevision", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe",
                "qwen3_5", "qwen3_5_moe", "idefics3", "smolvlm", "internvl", "gemma3", "paligemma")  # fmt: skip
#: The VLMs some of whose tokens attend both ways: Gemma 3's images (each image's block), PaliGemma's prefix.
VLM_BIDIRECTIONAL = ("gemma3", "paligemma")
#: The VLMs whose decoder adds vectors to the image tokens' states between its blocks: Qwen3-VL's DeepStack (the tiny
#: ones after both of their blocks).
VLM_INJECTED = ("qwen3_vl", "qwen3_vl_moe")
#: The tiny VLM's image tokens: a :data:`TINY_IMAGE_SIZE` image in :data:`TINY_PATCH_SIZE` patches, 3 × 3 (its class
#: token dropped).
VLM_IMAGE_TOKENS = 9
#: The tiny VLMs' tokens per image: LLaVA-NeXT's and OneVision's images are the whole image and one tile of it, 3 × 3
#: tokens each, the tile's rows of 3 ended by a newline token.
VLM_TOKENS_PER_IMAGE = {"llava": 9, "llava_next": 21, "llava_onevision": 21, "qwen2_vl": 9, "qwen2_5_vl": 9,
                        "qwen3_vl": 9, "qwen3_vl_moe": 9, "qwen3_5": 9, "qwen3_5_moe": 9, "idefics3": 9, "smolvlm": 9,
                        "internvl": 18, "gemma3": 9, "paligemma": 9}  # fmt: skip


#: The tokens around a tiny VLM's image tokens that its processor writes (:func:`tiny_vlm_processor`), by the
#: tokenizer's attribute naming each: ids after the words, before the image token (the last id).
VLM_MARKS = {
    "idefics3": {"fake_image_token": "<fake_token_around_image>", "end_of_utterance_token": "<end_of_utterance>",
                 "global_image_token": "<global-img>"},
    "smolvlm": {"fake_image_token": "<fake_token_around_image>", "end_of_utterance_token": "<end_of_utterance>",
                "global_image_token": "<global-img>"},
    "internvl": {"start_image_token": "<img>", "end_image_token": "</img>", "video_token": "<video>"},
}  # fmt: skip


def tiny_vlm(family: str = "llava", seed: int = 0, tower_layers: int = 1, feature_layer: int = -1) -> torch.nn.Module:
    """A random vision-language decoder over the word tokenizer's vocabulary plus its image tokens (the last ids), in
    eval mode and eager attention: a LLaVA (a one-layer CLIP vision tower, 24 × 24 images in 8 × 8 patches, the GELU
    projector, a two-layer Llama; ``tower_layers`` CLIP blocks, the features read from ``feature_layer``), or a
    Qwen2-VL / Qwen2.5-VL (a one-block vision tower, 24 × 24 images in 4 × 4
    patches merged 2 × 2, a two-layer Qwen2 with multimodal rotary positions), a Qwen3-VL (a two-block tower whose
    blocks' states are also added after each of the two Qwen3 blocks, DeepStack; Qwen3-VL-MoE: four experts, two
    a token), a Qwen3.5 (a one-block tower, a Gated DeltaNet block then a gated attention block; Qwen3.5-MoE: four
    experts and a shared one); :data:`VLM_IMAGE_TOKENS` tokens per image. The Qwens' towers (but Qwen3-VL's) have
    ``tower_layers`` blocks (Qwen2.5-VL's last with full attention, the others in windows of 2 × 2 units)."""
    if family not in VLM_FAMILIES:
        raise ValueError(f"No builder for vision-language family {family!r}; known: {VLM_FAMILIES}")
    torch.manual_seed(seed)
    if family.startswith("qwen"):
        vocab = len(SPECIAL_TOKENS) + len(WORDS) + 3  # the image token, the image's start and end
        vision = dict(depth=tower_layers, hidden_size=16, num_heads=2, patch_size=TINY_PATCH_SIZE // 2,
                      spatial_merge_size=2, temporal_patch_size=2, in_channels=3)  # fmt: skip
        mrope = [1, 1, 0]
        if family == "qwen2_vl":
            vision.update(embed_dim=16, mlp_ratio=2)
        elif family == "qwen2_5_vl":  # Qwen2.5-VL's tower: windows of 16 pixels, its last block with full attention
            vision.update(out_hidden_size=16, intermediate_size=32, window_size=16,
                          fullatt_block_indexes=[tower_layers - 1])  # fmt: skip
        elif family.startswith("qwen3_5"):  # Qwen3.5's: Qwen3-VL's learned positions, no DeepStack
            vision.update(out_hidden_size=16, intermediate_size=32, num_position_embeddings=36)
            mrope = [2, 1, 1]  # over a head's 4 rotary frequencies (half of its 16 channels rotate), interleaved
        else:  # Qwen3-VL's: learned positions of a 6 × 6 grid, both blocks' states added to the decoder's (DeepStack)
            vision.update(depth=2, out_hidden_size=16, intermediate_size=32, num_position_embeddings=36,
                          deepstack_visual_indexes=[0, 1])  # fmt: skip
            mrope = [2, 1, 1]  # over a head's 4 rotary frequencies, interleaved
        text = dict(
            vocab_size=vocab,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            bos_token_id=BOS_ID,
            eos_token_id=EOS_ID,
            pad_token_id=PAD_ID,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": mrope},
        )
        if family.startswith("qwen3"):
            text.update(head_dim=8, rope_parameters={**text["rope_parameters"], "mrope_interleaved": True})
        if family.startswith("qwen3_5"):  # a Gated DeltaNet block (2 key, 4 value heads), then gated attention
            text.update(head_dim=16, layer_types=["linear_attention", "full_attention"], linear_num_value_heads=4,
                        linear_num_key_heads=2, linear_key_head_dim=4, linear_value_head_dim=4,
                        linear_conv_kernel_dim=3)  # fmt: skip
            text["rope_parameters"]["partial_rotary_factor"] = 0.5
        if family.endswith("_moe"):
            text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, decoder_sparse_step=1)
        if family == "qwen3_5_moe":  # and a sigmoid-gated shared expert
            text.update(shared_expert_intermediate_size=16)
        name = {"qwen2_vl": "Qwen2VL", "qwen2_5_vl": "Qwen2_5_VL", "qwen3_vl": "Qwen3VL", "qwen3_vl_moe": "Qwen3VLMoe",
                "qwen3_5": "Qwen3_5", "qwen3_5_moe": "Qwen3_5Moe"}[family]  # fmt: skip
        tokens = dict(image_token_id=vocab - 1, vision_start_token_id=vocab - 2, vision_end_token_id=vocab - 3)
        config = getattr(transformers, f"{name}Config")(vision_config=vision, text_config=text, **tokens)
        model = getattr(transformers, f"{name}ForConditionalGeneration")(config)
        randomize_weights(model, seed)
        model.set_attn_implementation("eager")
        return model.eval()
    if family == "gemma3":  # a SigLIP tower of 4 × 4 patches (6 × 6 of them) pooled 2 × 2 into 3 × 3 tokens
        vocab = len(SPECIAL_TOKENS) + len(WORDS) + 3  # the image token, the image's start and end
        text = transformers.Gemma3TextConfig(
            vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=256, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
            pad_token_id=PAD_ID, sliding_window=TINY_SLIDING_WINDOW + 4, final_logit_softcapping=30.0,
            layer_types=["sliding_attention", "full_attention"],
        )  # fmt: skip
        tower = transformers.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                                num_attention_heads=2, image_size=TINY_IMAGE_SIZE,
                                                patch_size=TINY_PATCH_SIZE // 2)  # fmt: skip
        config = transformers.Gemma3Config(text_config=text, vision_config=tower, mm_tokens_per_image=VLM_IMAGE_TOKENS,
                                           image_token_id=vocab - 1, boi_token_id=vocab - 2,
                                           eoi_token_id=vocab - 3)  # fmt: skip
        model = transformers.Gemma3ForConditionalGeneration(config)
        randomize_weights(model, seed)
        model.set_attn_implementation("eager")
        return model.eval()
    if family == "paligemma":  # a SigLIP tower of 8 × 8 patches (3 × 3), a Gemma decoder
        vocab = len(SPECIAL_TOKENS) + len(WORDS) + 1
        text = transformers.GemmaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                        bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)  # fmt: skip
        tower = transformers.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                                num_attention_heads=2, image_size=TINY_IMAGE_SIZE,
                                                patch_size=TINY_PATCH_SIZE, projection_dim=16)  # fmt: skip
        config = transformers.PaliGemmaConfig(text_config=text.to_dict(), vision_config=tower.to_dict(),
                                              image_token_index=vocab - 1, projection_dim=16)  # fmt: skip
        model = transformers.PaliGemmaForConditionalGeneration(config)
        randomize_weights(model, seed)
        model.set_attn_implementation("eager")
        return model.eval()
    vocab = len(SPECIAL_TOKENS) + len(WORDS) + len(VLM_MARKS.get(family, ())) + 1  # the marks, then the image token
    vision = transformers.CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=tower_layers,
                                           num_attention_heads=2, image_size=TINY_IMAGE_SIZE,
                                           patch_size=TINY_PATCH_SIZE)  # fmt: skip
    text = transformers.LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                    bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)  # fmt: skip
    if family == "internvl":  # tiles of 24 × 24 in 4 × 4 patches, 2 × 2 of them shuffled into one: 9 tokens a tile
        tower = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                     image_size=[TINY_IMAGE_SIZE] * 2, patch_size=[TINY_PATCH_SIZE // 2] * 2)  # fmt: skip
        config = transformers.InternVLConfig(vision_config=tower, text_config=text.to_dict(), image_token_id=vocab - 1,
                                             downsample_ratio=0.5, vision_feature_layer=-1)  # fmt: skip
        model = transformers.InternVLForConditionalGeneration(config)
        randomize_weights(model, seed)
        model.set_attn_implementation("eager")
        return model.eval()
    if family in ("idefics3", "smolvlm"):  # a tower of 4 × 4 patches, 2 × 2 of them shuffled into one
        name = {"idefics3": "Idefics3", "smolvlm": "SmolVLM"}[family]
        tower = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=tower_layers, num_attention_heads=2,
                     image_size=TINY_IMAGE_SIZE, patch_size=TINY_PATCH_SIZE // 2)  # fmt: skip
        config = getattr(transformers, f"{name}Config")(vision_config=tower, text_config=text.to_dict(),
                                                        image_token_id=vocab - 1, scale_factor=2)  # fmt: skip
        model = getattr(transformers, f"{name}ForConditionalGeneration")(config)
        randomize_weights(model, seed)
        model.set_attn_implementation("eager")
        return model.eval()
    common = dict(vision_config=vision, text_config=text, image_token_index=vocab - 1,
                  vision_feature_layer=feature_layer, vision_feature_select_strategy="default")  # fmt: skip
    if family == "llava":
        model = transformers.LlavaForConditionalGeneration(
            transformers.LlavaConfig(image_seq_length=VLM_IMAGE_TOKENS, **common)
        )
    else:  # tiles of the image's size or of two of its sides
        name = {"llava_next": "LlavaNext", "llava_onevision": "LlavaOnevision"}[family]
        pinpoints = [[TINY_IMAGE_SIZE, TINY_IMAGE_SIZE], [TINY_IMAGE_SIZE, 2 * TINY_IMAGE_SIZE],
                     [2 * TINY_IMAGE_SIZE, TINY_IMAGE_SIZE]]  # fmt: skip
        config = getattr(transformers, f"{name}Config")(image_grid_pinpoints=pinpoints, **common)
        model = getattr(transformers, f"{name}ForConditionalGeneration")(config)
    randomize_weights(model, seed)
    model.set_attn_implementation("eager")
    return model.eval()


def tiny_vlm_images(model: torch.nn.Module, count: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``count`` random images for a :func:`tiny_vlm`: LLaVA's pixels ``(count, 3, 24, 24)``, Qwen2-VL's flattened
    patches ``(count, 36, 96)`` (6 × 6 patches of 3 channels, 2 frames, 4 × 4 pixels: what its processor gives)."""
    kind = model.config.model_type
    if kind.startswith("qwen"):
        return torch.randn(count, 36, 3 * 2 * (TINY_PATCH_SIZE // 2) ** 2, generator=generator)
    if kind in ("idefics3", "smolvlm"):  # one image per row
        return torch.randn(count, 1, 3, TINY_IMAGE_SIZE, TINY_IMAGE_SIZE, generator=generator)
    if kind == "internvl":  # two tiles per image
        return torch.randn(count, 2, 3, TINY_IMAGE_SIZE, TINY_IMAGE_SIZE, generator=generator)
    if kind not in ("llava", "gemma3", "paligemma"):  # the whole image and one tile
        return torch.randn(count, 2, 3, TINY_IMAGE_SIZE, TINY_IMAGE_SIZE, generator=generator)
    return torch.randn(count, 3, TINY_IMAGE_SIZE, TINY_IMAGE_SIZE, generator=generator)


def tiny_vlm_inputs(model: torch.nn.Module, ids: torch.Tensor, images: torch.Tensor) -> dict:
    """The forward pass's image arguments for ``ids`` whose rows each hold one image's tokens, from that row's image
    (:func:`tiny_vlm_images`): LLaVA's ``pixel_values``; Qwen2-VL's patches, ``image_grid_thw`` and
    ``mm_token_type_ids`` (1 on the image's tokens), as its processor returns them."""
    if model.config.model_type in ("llava", "idefics3", "smolvlm"):
        return {"pixel_values": images}
    if model.config.model_type == "gemma3":  # which tokens are the image's (their block attends both ways)
        return {"pixel_values": images, "token_type_ids": (ids == model.config.image_token_id).long()}
    if model.config.model_type == "paligemma":  # the prefix (0: the image and the first words) reads itself both ways
        prefix = torch.zeros_like(ids)
        prefix[:, -2:] = 1  # the last two tokens are the suffix
        return {"pixel_values": images, "token_type_ids": prefix}
    if model.config.model_type == "internvl":  # the tiles of every image in one run
        return {"pixel_values": images.flatten(0, 1)}
    if model.config.model_type.startswith("llava"):  # each image's size, in pixels
        sizes = torch.tensor([[TINY_IMAGE_SIZE, TINY_IMAGE_SIZE]] * len(images))
        return {"pixel_values": images, "image_sizes": sizes}
    grid = torch.tensor([[1, 6, 6]] * len(images))
    return {"pixel_values": images.flatten(0, 1), "image_grid_thw": grid,
            "mm_token_type_ids": (ids == model.config.image_token_id).int()}  # fmt: skip


#: The tiny VLMs with a local processor (:func:`tiny_vlm_processor`; SmolVLM's needs ``num2words``, a test extra).
VLM_PROCESSOR_FAMILIES = ("llava", "llava_next", "llava_onevision", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5",
                          "gemma3", "paligemma", "idefics3", "smolvlm", "internvl")  # fmt: skip


def tiny_vlm_processor(family: str = "llava"):
    """A local processor for :func:`tiny_vlm` (``family`` in :data:`VLM_PROCESSOR_FAMILIES`): the word tokenizer
    with the family's image tokens added after the words (the tiny model's last ids), and the family's image
    processor at the tiny model's size (LLaVA: 24 × 24 images; LLaVA-NeXT, OneVision: tiles of 24 × 24 of the three
    tiny pinpoints; Qwen2-VL, Qwen3-VL, Qwen3.5 (Qwen3-VL's processor): images resized to 24 × 24 up to 48 × 24
    pixels, 4 × 4 patches merged 2 × 2; Gemma 3: 24 × 24 images, the placeholder ``<start_of_image>`` expanded into
    its 9 soft tokens; PaliGemma: 24 × 24 images, 9 tokens; Idefics3 and SmolVLM: one 24 × 24 image, not split,
    between its marks; InternVL: tiles of 24 × 24 and the thumbnail, 9 tokens each, between ``<img>`` and
    ``</img>``). The Qwens', SmolVLM's and InternVL's processors are built without their video processor (which needs
    torchvision): images only."""
    if family not in VLM_PROCESSOR_FAMILIES:
        raise ValueError(f"No tiny processor for {family!r}; known: {VLM_PROCESSOR_FAMILIES}")
    if family.startswith("qwen"):
        tokenizer = qwen_vl_tokenizer()
        images = transformers.Qwen2VLImageProcessorPil(
            patch_size=TINY_PATCH_SIZE // 2, merge_size=2, temporal_patch_size=2, min_pixels=TINY_IMAGE_SIZE**2,
            max_pixels=2 * TINY_IMAGE_SIZE**2,
        )  # fmt: skip
        name = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor"}.get(family, "Qwen3VLProcessor")
        return images_only(getattr(transformers, name))(images, tokenizer, video_processor=None)
    tokenizer = word_tokenizer(seq2seq=False)
    if family in VLM_MARKS:  # the marks around the image's tokens, then the image token (the tokenizer names them)
        image_token = {"internvl": ("context_image_token", "<IMG_CONTEXT>")}.get(family, ("image_token", "<image>"))
        _named_tokens(tokenizer, {**VLM_MARKS[family], image_token[0]: image_token[1]})
    if family in ("idefics3", "smolvlm"):  # one 24 × 24 image, not split: 6 × 6 patches, 2 × 2 shuffled into one
        side = {"longest_edge": TINY_IMAGE_SIZE}
        name = {"idefics3": "Idefics3", "smolvlm": "SmolVLM"}[family]
        images = getattr(transformers, f"{name}ImageProcessorPil")(do_image_splitting=False, size=side,
                                                                   max_image_size=side)  # fmt: skip
        if family == "smolvlm":  # images only (its video processor needs torchvision)
            return images_only(transformers.SmolVLMProcessor)(images, tokenizer, video_processor=None,
                                                              image_seq_len=VLM_IMAGE_TOKENS)  # fmt: skip
        return transformers.Idefics3Processor(images, tokenizer, image_seq_len=VLM_IMAGE_TOKENS)
    if family == "internvl":  # tiles of 24 × 24 (the image cropped to up to 12 of them, and its thumbnail), 9 a tile
        images = transformers.GotOcr2ImageProcessorPil(size={"height": TINY_IMAGE_SIZE, "width": TINY_IMAGE_SIZE})
        return images_only(transformers.InternVLProcessor)(images, tokenizer, video_processor=None,
                                                            image_seq_length=VLM_IMAGE_TOKENS)  # fmt: skip
    if family == "gemma3":  # the image's start, its soft tokens and its end (the tokenizer names them)
        _named_tokens(tokenizer, {"eoi_token": "<end_of_image>", "boi_token": "<start_of_image>",
                                  "image_token": "<image_soft_token>"})  # fmt: skip
        images = transformers.Gemma3ImageProcessorPil(size={"height": TINY_IMAGE_SIZE, "width": TINY_IMAGE_SIZE})
        return transformers.Gemma3Processor(image_processor=images, tokenizer=tokenizer,
                                            image_seq_length=VLM_IMAGE_TOKENS)  # fmt: skip
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    if family == "paligemma":  # 24 × 24 images, 9 tokens before the prompt (the processor puts them first)
        images = transformers.SiglipImageProcessorPil(size={"height": TINY_IMAGE_SIZE, "width": TINY_IMAGE_SIZE})
        images.image_seq_length = VLM_IMAGE_TOKENS
        return transformers.PaliGemmaProcessor(image_processor=images, tokenizer=tokenizer)
    common = dict(tokenizer=tokenizer, patch_size=TINY_PATCH_SIZE, vision_feature_select_strategy="default",
                  num_additional_image_tokens=1)  # fmt: skip
    if family == "llava":
        images = transformers.CLIPImageProcessorPil(
            size={"shortest_edge": TINY_IMAGE_SIZE}, crop_size={"height": TINY_IMAGE_SIZE, "width": TINY_IMAGE_SIZE}
        )
        return transformers.LlavaProcessor(image_processor=images, **common)
    side = TINY_IMAGE_SIZE
    pinpoints = [[side, side], [side, 2 * side], [2 * side, side]]
    if family == "llava_onevision":  # its processor counts the tokens as SigLIP's, no class token to drop ("full")
        images = transformers.LlavaOnevisionImageProcessorPil(size={"height": side, "width": side},
                                                              image_grid_pinpoints=pinpoints)  # fmt: skip
        return images_only(transformers.LlavaOnevisionProcessor)(
            image_processor=images, tokenizer=tokenizer, video_processor=None, num_image_tokens=VLM_IMAGE_TOKENS,
            vision_feature_select_strategy="full", vision_aspect_ratio="anyres_max_9",
        )  # fmt: skip
    images = transformers.LlavaNextImageProcessorPil(
        size={"shortest_edge": side}, crop_size={"height": side, "width": side}, image_grid_pinpoints=pinpoints
    )
    return transformers.LlavaNextProcessor(image_processor=images, **common)


def _named_tokens(tokenizer, marks: dict[str, str]) -> None:
    """Add ``marks`` (attribute name to token, in order) as special tokens, each named on the tokenizer with its id."""
    tokenizer.add_special_tokens({"additional_special_tokens": list(marks.values())})
    for name, token in marks.items():
        setattr(tokenizer, name, token)
        setattr(tokenizer, f"{name}_id", tokenizer.convert_tokens_to_ids(token))


#: Qwen-VL's image marks, in the order their ids follow the words: ``(vision_end, vision_start, image_pad)``.
QWEN_VL_MARKS = ("<|vision_end|>", "<|vision_start|>", "<|image_pad|>")


def qwen_vl_tokenizer():
    """The word tokenizer with Qwen-VL's image marks after the words (:data:`QWEN_VL_MARKS`: the tiny Qwen VLMs' last
    ids, the image token last)."""
    tokenizer = word_tokenizer(seq2seq=False)
    tokenizer.add_special_tokens({"additional_special_tokens": list(QWEN_VL_MARKS)})
    return tokenizer


def images_only(cls):
    """``cls`` (a processor with a video processor) built without one: images only."""

    class ImagesOnly(cls):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    ImagesOnly.__name__ = cls.__name__
    return ImagesOnly


def randomize_weights(model: torch.nn.Module, seed: int = 0, scale: float = 0.3) -> None:
    """Give every weight a random value large enough for non-trivial attention: matrices ``N(0, scale²/fan_in·16)``,
    norm gains ``1 + N(0, 0.1²)``, biases ``N(0, 0.1²)``."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            if param.dim() >= 2:
                param.copy_(noise * scale * 4 / param.shape[-1] ** 0.5)
            elif "norm" in name or name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                param.copy_(1 + 0.1 * noise)
            else:
                param.copy_(0.1 * noise)
        for name, buffer in model.named_buffers():
            if name.endswith("final_logits_bias"):
                buffer.copy_(0.1 * torch.randn(buffer.shape, generator=generator))


def tiny_model(
    family: str,
    d_model: int = 16,
    layers: int = 2,
    heads: int = 4,
    ffn: int = 32,
    vocab: int | None = None,
    seed: int = 0,
    attn_implementation: str = "eager",
    kv_heads: int | None = None,
) -> torch.nn.Module:
    """A random model of ``family`` (see :data:`ALL_FAMILIES`), in eval mode.

    Args:
        family: Family name.
        d_model, layers, heads, ffn: Dimensions (full-size models for benchmarks use the real ones).
        vocab: Vocabulary size; defaults to the word tokenizer's.
        seed: Seed of the random weights.
        attn_implementation: Attention implementation to load with (``"eager"`` or ``"sdpa"``; eager where the family
            has no sdpa).
        kv_heads: Key/value heads of Llama-style models (must divide ``heads``); default ``heads // 2``.
    """
    vocab = vocab or len(SPECIAL_TOKENS) + len(WORDS)
    torch.manual_seed(seed)
    if family in ("marian", "bart", "mbart", "m2m_100"):
        classes = {
            "marian": (transformers.MarianConfig, transformers.MarianMTModel),
            "bart": (transformers.BartConfig, transformers.BartForConditionalGeneration),
            "mbart": (transformers.MBartConfig, transformers.MBartForConditionalGeneration),
            "m2m_100": (transformers.M2M100Config, transformers.M2M100ForConditionalGeneration),
        }[family]
        extra = {"scale_embedding": True} if family != "bart" else {}
        model = _bart_like(*classes, vocab, d_model, layers, heads, ffn, **extra)
    elif family in ("t5", "t5_gated"):
        model = _t5(vocab, d_model, layers, heads, ffn, gated=family == "t5_gated")
    elif family == "mt5":
        model = _t5(
            vocab, d_model, layers, heads, ffn, True, transformers.MT5Config, transformers.MT5ForConditionalGeneration
        )
    elif family in MOE_FAMILIES:  # before the other decoders: they are among them
        model = _mixture(family, vocab, d_model, layers, heads, ffn, kv_heads)
    elif family in DECODER_FAMILIES:
        model = _decoder_only(family, vocab, d_model, layers, heads, ffn, kv_heads)
    elif family in HYBRID_FAMILIES + HYBRID_VARIANTS:
        model = _hybrid(family, vocab, d_model, layers, heads, ffn, kv_heads)
    else:
        raise ValueError(f"No builder for family {family!r}; known: {ALL_FAMILIES + HYBRID_FAMILIES}")
    randomize_weights(model, seed)
    if attn_implementation != model.config._attn_implementation:
        try:
            model.set_attn_implementation(attn_implementation)
        except ValueError:  # the family has no such implementation (Gemma 2 has no sdpa): keep eager
            pass
    return model.eval()


def is_seq2seq(family: str) -> bool:
    return family in SEQ2SEQ_FAMILIES


def load_tiny(family: str, method: str, **method_kwargs):
    """An Inseq ``AttributionModel`` around a tiny random model of ``family``, with the word tokenizer."""
    import inseq

    from inseq_mixing.frontends.patches import register

    register()  # the plugin's methods in Inseq's registry

    model = tiny_model(family)
    tokenizer = word_tokenizer(seq2seq=is_seq2seq(family))
    return inseq.load_model(model, method, tokenizer=tokenizer, **method_kwargs)


# ----- encoder-only models -----

#: Encoder-only families with a tiny builder (see :func:`tiny_encoder`).
ENCODER_FAMILIES = ("bert", "roberta", "xlm-roberta", "electra", "distilbert", "albert", "modernbert", "deberta-v2")
#: The heads of :func:`tiny_encoder`.
ENCODER_TASKS = ("masked_lm", "sequence_classification", "token_classification", "bare")
ENCODER_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
#: Labels of the tiny classifiers.
TINY_LABELS = ("negative", "neutral", "positive")


def encoder_tokenizer(words: list[str] | None = None) -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer for encoders: ``[CLS] text [SEP]`` (pairs: ``[CLS] a [SEP] b [SEP]`` with
    token types 0 and 1), a ``[MASK]`` token, right padding."""
    vocab = {token: idx for idx, token in enumerate(ENCODER_SPECIAL_TOKENS + list(words or WORDS))}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    cls_id, sep_id = vocab["[CLS]"], vocab["[SEP]"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]", model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )  # fmt: skip


def tiny_encoder(
    family: str,
    task: str = "masked_lm",
    d_model: int = 16,
    layers: int = 2,
    heads: int = 4,
    ffn: int = 32,
    vocab: int | None = None,
    seed: int = 0,
) -> torch.nn.Module:
    """A random encoder-only model of ``family`` (:data:`ENCODER_FAMILIES`) with the head of ``task``
    (:data:`ENCODER_TASKS`; ``"bare"``: the encoder alone), in eval mode, eager attention. ELECTRA and ALBERT get an
    embedding size of ``d_model // 2`` (ELECTRA's generator projection, ALBERT's factorised embeddings); ALBERT shares
    one block across its ``layers``."""
    vocab = vocab or len(ENCODER_SPECIAL_TOKENS) + len(WORDS)
    torch.manual_seed(seed)
    names = {"bert": "Bert", "roberta": "Roberta", "xlm-roberta": "XLMRoberta", "electra": "Electra",
             "distilbert": "DistilBert", "albert": "Albert", "modernbert": "ModernBert",
             "deberta-v2": "DebertaV2"}  # fmt: skip
    if family not in names:
        raise ValueError(f"No encoder builder for {family!r}; known: {ENCODER_FAMILIES}")
    labels = {"id2label": dict(enumerate(TINY_LABELS)), "label2id": {name: i for i, name in enumerate(TINY_LABELS)}}
    common = {"vocab_size": vocab, "max_position_embeddings": 64, "pad_token_id": 0, **labels}
    if family == "distilbert":
        config = transformers.DistilBertConfig(dim=d_model, n_layers=layers, n_heads=heads, hidden_dim=ffn, **common)
    elif family == "modernbert":  # every other layer global, the others a window of 4 tokens (2 each side)
        config = transformers.ModernBertConfig(
            hidden_size=d_model, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=ffn,
            global_attn_every_n_layers=2, local_attention=4, classifier_pooling="cls", cls_token_id=2,
            sep_token_id=3, bos_token_id=2, eos_token_id=3, **common,
        )  # fmt: skip
    elif family == "deberta-v2":  # relative attention with both disentangled terms, no absolute positions
        config = transformers.DebertaV2Config(
            hidden_size=d_model, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=ffn,
            relative_attention=True, pos_att_type=["p2c", "c2p"], position_biased_input=False,
            max_relative_positions=16, position_buckets=8, type_vocab_size=2, pooler_hidden_size=d_model, **common,
        )  # fmt: skip
    else:
        sizes = {"hidden_size": d_model, "num_hidden_layers": layers, "num_attention_heads": heads,
                 "intermediate_size": ffn, "type_vocab_size": 2}  # fmt: skip
        if family in ("electra", "albert"):
            sizes["embedding_size"] = d_model // 2
        config = getattr(transformers, f"{names[family]}Config")(**sizes, **common)
    suffix = {"masked_lm": "ForMaskedLM", "sequence_classification": "ForSequenceClassification",
              "token_classification": "ForTokenClassification", "bare": "Model"}[task]  # fmt: skip
    config._attn_implementation = "eager"
    model = getattr(transformers, f"{names[family]}{suffix}")(config)
    randomize_weights(model, seed)
    return model.eval()


# ----- speech models -----

#: Speech families with a tiny builder (see :func:`tiny_speech`): Whisper, wav2vec 2.0 post-LN with a layer-norm
#: feature encoder (batchable), post-LN with a group-norm one (wav2vec2-base: one utterance at a time), the stable
#: layer norm (pre-LN) variant, and HuBERT.
SPEECH_FAMILIES = ("whisper", "wav2vec2", "wav2vec2_group", "wav2vec2_stable", "hubert")
#: Sampling rate of the tiny speech models and of the synthetic audio.
SAMPLING_RATE = 16_000


@dataclass
class SpeechProcessor:
    """A processor for the tiny speech models: a transformers feature extractor and the local word tokenizer."""

    feature_extractor: object
    tokenizer: object


def speech_processor(family: str) -> SpeechProcessor:
    """The feature extractor of ``family`` (Whisper: 16 mel bins, 1 s inputs, so 50 encoder frames) and
    :func:`word_tokenizer` (CTC blank = ``<pad>``)."""
    if family == "whisper":
        extractor = transformers.WhisperFeatureExtractor(feature_size=16, chunk_length=1, sampling_rate=SAMPLING_RATE)
    else:
        extractor = transformers.Wav2Vec2FeatureExtractor(
            feature_size=1, sampling_rate=SAMPLING_RATE, padding_value=0.0, do_normalize=True,
            return_attention_mask=family != "wav2vec2_group",
        )  # fmt: skip
    return SpeechProcessor(extractor, word_tokenizer(seq2seq=False))


def tiny_speech(family: str, head: bool = True, d_model: int = 16, layers: int = 2, heads: int = 4, ffn: int = 32,
                seed: int = 0, frames: int = 50) -> torch.nn.Module:  # fmt: skip
    """A random speech model of ``family`` (:data:`SPEECH_FAMILIES`): ``WhisperForConditionalGeneration`` (``head``)
    or ``WhisperEncoder``; ``Wav2Vec2ForCTC`` / ``HubertForCTC`` (``head``) or the bare encoder. Frames are 20 ms
    (Whisper: ``frames`` encoder frames, its fixed input length); eval mode, eager attention."""
    vocab = len(SPECIAL_TOKENS) + len(WORDS)
    torch.manual_seed(seed)
    if family == "whisper":
        config = transformers.WhisperConfig(
            vocab_size=vocab, num_mel_bins=16, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
            encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn, decoder_ffn_dim=ffn,
            max_source_positions=frames, max_target_positions=32, pad_token_id=PAD_ID, eos_token_id=EOS_ID,
            bos_token_id=BOS_ID, decoder_start_token_id=BOS_ID, begin_suppress_tokens=None, suppress_tokens=None,
        )  # fmt: skip
        cls = transformers.WhisperForConditionalGeneration
    elif family in ("wav2vec2", "wav2vec2_group", "wav2vec2_stable", "hubert"):
        config = getattr(transformers, "HubertConfig" if family == "hubert" else "Wav2Vec2Config")(
            vocab_size=vocab, hidden_size=d_model, num_hidden_layers=layers, num_attention_heads=heads,
            intermediate_size=ffn, conv_dim=(8, 8, 8), conv_stride=(5, 8, 8), conv_kernel=(10, 8, 8),
            num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2, pad_token_id=PAD_ID,
            feat_extract_norm="group" if family == "wav2vec2_group" else "layer",
            do_stable_layer_norm=family == "wav2vec2_stable", mask_time_prob=0.0,
        )  # fmt: skip
        name = "Hubert" if family == "hubert" else "Wav2Vec2"
        cls = getattr(transformers, f"{name}ForCTC" if head else f"{name}Model")
    else:
        raise ValueError(f"No speech builder for {family!r}; known: {SPEECH_FAMILIES}")
    config._attn_implementation = "eager"
    model = cls(config)
    randomize_weights(model, seed)
    if family == "whisper" and not head:
        model = model.get_encoder()
    return model.eval()


def synthetic_audio(seconds: float, seed: int = 0, tone_hz: float = 220.0) -> "numpy.ndarray":  # noqa: F821
    """A float32 signal at :data:`SAMPLING_RATE`: a tone with a slow amplitude envelope, plus noise."""
    import numpy

    rng = numpy.random.default_rng(seed)
    time = numpy.arange(int(seconds * SAMPLING_RATE)) / SAMPLING_RATE
    envelope = 0.5 + 0.5 * numpy.sin(2 * numpy.pi * 1.5 * time)
    signal = 0.3 * envelope * numpy.sin(2 * numpy.pi * tone_hz * time) + 0.05 * rng.standard_normal(len(time))
    return signal.astype(numpy.float32)


VISION_FAMILIES = ("vit", "deit", "dinov2", "dinov2_with_registers", "beit", "data2vec-vision", "clip", "siglip",
                   "siglip2")  # fmt: skip
#: Tiny images: 24 pixels a side, patches of 8 (a 3 × 3 grid).
TINY_IMAGE_SIZE, TINY_PATCH_SIZE = 24, 8
#: Class-name stems of the vision families.
_VISION_NAMES = {"vit": "ViT", "deit": "DeiT", "dinov2": "Dinov2", "dinov2_with_registers": "Dinov2WithRegisters",
                 "beit": "Beit", "data2vec-vision": "Data2VecVision", "clip": "CLIP", "siglip": "Siglip",
                 "siglip2": "Siglip2"}  # fmt: skip
#: SigLIP 2's tiny images: at most 16 patches of 8, each image at its own aspect ratio.
TINY_MAX_PATCHES = 16


def image_processor(size: int = TINY_IMAGE_SIZE):
    """A local ViT image processor resizing to ``size`` pixels a side (ImageNet's mean and standard deviation)."""
    processor = getattr(transformers, "ViTImageProcessorPil", None) or transformers.ViTImageProcessor  # no torchvision
    return processor(size={"height": size, "width": size}, do_resize=True, do_normalize=True)


def vision_processor(family: str):
    """The tiny image processor of ``family``: :func:`image_processor`, or SigLIP 2's (NaFlex: at most
    :data:`TINY_MAX_PATCHES` patches of :data:`TINY_PATCH_SIZE`, the aspect ratio kept)."""
    if family != "siglip2":
        return image_processor()
    processor = getattr(transformers, "Siglip2ImageProcessorPil", None) or transformers.Siglip2ImageProcessor
    return processor(patch_size=TINY_PATCH_SIZE, max_num_patches=TINY_MAX_PATCHES)


def _vision_config(family: str, d_model: int, layers: int, heads: int, ffn: int, image_size: int, patch_size: int):
    """The config of a tiny image encoder (CLIP's and SigLIP's: their vision config)."""
    stem = _VISION_NAMES[family]
    name = f"{stem}VisionConfig" if family in ("clip", "siglip", "siglip2") else f"{stem}Config"
    size = {"num_patches": 9} if family == "siglip2" else {"image_size": image_size}  # SigLIP 2: a 3 × 3 table
    config = getattr(transformers, name)(
        hidden_size=d_model, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=ffn,
        patch_size=patch_size, **size,
    )  # fmt: skip
    if family == "dinov2_with_registers":
        config.num_register_tokens, config.use_swiglu_ffn = 2, True
    if family == "beit":  # each layer's relative position bias; Data2Vec-vision: one shared by all layers
        config.use_relative_position_bias = True
    if family == "data2vec-vision":
        config.use_shared_relative_position_bias, config.use_mean_pooling = True, False
    return config


def tiny_vision(family: str, head: bool = True, d_model: int = 16, layers: int = 2, heads: int = 4, ffn: int = 32,
                seed: int = 0, image_size: int = TINY_IMAGE_SIZE, patch_size: int = TINY_PATCH_SIZE,
                labels: int = 3) -> torch.nn.Module:  # fmt: skip
    """A random vision model of ``family`` (:data:`VISION_FAMILIES`): ``...ForImageClassification`` with ``labels``
    labels named from :data:`TINY_LABELS` (``head``), or the bare encoder (CLIP, SigLIP, SigLIP 2:
    ``...VisionModel``; SigLIP 2 reads :func:`vision_processor`'s flattened patches); eval mode, eager attention.
    Layer scales are drawn at random too; DINOv2 with registers has two registers and the SwiGLU FFN, BEiT a relative
    position bias per layer and its mean-pooling classifier, Data2Vec-vision a shared relative position bias and its
    [CLS] classifier."""
    if family not in _VISION_NAMES:
        raise ValueError(f"No vision builder for {family!r}; known: {VISION_FAMILIES}")
    torch.manual_seed(seed)
    config = _vision_config(family, d_model, layers, heads, ffn, image_size, patch_size)
    config._attn_implementation = "eager"
    stem = _VISION_NAMES[family]
    if head:
        label_names = {index: TINY_LABELS[index % len(TINY_LABELS)] + ("" if index < 3 else str(index))
                       for index in range(labels)}  # fmt: skip
        if family in ("clip", "siglip", "siglip2"):
            text = getattr(transformers, f"{stem}TextConfig")(
                hidden_size=d_model, num_hidden_layers=1, num_attention_heads=heads, intermediate_size=ffn
            )
            config = getattr(transformers, f"{stem}Config")(text_config=text.to_dict(), vision_config=config.to_dict())
            config.vision_config._attn_implementation = "eager"
        config.num_labels, config.id2label = labels, label_names
        config.label2id = {name: index for index, name in label_names.items()}
        config._attn_implementation = "eager"
        model = getattr(transformers, f"{stem}ForImageClassification")(config)
    elif family in ("clip", "siglip", "siglip2"):
        model = getattr(transformers, f"{stem}VisionModel")(config)
    elif family in ("vit", "deit"):
        model = getattr(transformers, f"{stem}Model")(config, add_pooling_layer=False)
    else:
        model = getattr(transformers, f"{stem}Model")(config)
    randomize_weights(model, seed)
    return model.eval()


def tiny_clip(d_model: int = 16, layers: int = 2, heads: int = 4, ffn: int = 32, seed: int = 0, projection: int = 8):
    """A random ``CLIPModel`` (image–text similarity) and its processor: :func:`image_processor` and the local word
    tokenizer (its vocabulary sizes the text tower; texts end in ``</s>``, where CLIP's text tower pools); eval mode,
    eager attention."""
    tokenizer = word_tokenizer(seq2seq=True)
    vision = _vision_config("clip", d_model, layers, heads, ffn, TINY_IMAGE_SIZE, TINY_PATCH_SIZE)
    text = transformers.CLIPTextConfig(
        hidden_size=d_model, num_hidden_layers=1, num_attention_heads=heads, intermediate_size=ffn,
        vocab_size=len(tokenizer), max_position_embeddings=64, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
    )  # fmt: skip
    config = transformers.CLIPConfig(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                     projection_dim=projection)  # fmt: skip
    config._attn_implementation = "eager"
    config.text_config._attn_implementation = config.vision_config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.CLIPModel(config)
    randomize_weights(model, seed)
    with torch.no_grad():
        model.logit_scale.fill_(2.0)
    return model.eval(), ImageTextProcessor(image_processor(), tokenizer)


class ImageTextProcessor:
    """An image processor and a tokenizer as one processor (what ``CLIPProcessor`` offers, for a local tokenizer of
    another class)."""

    def __init__(self, image_processor, tokenizer):
        self.image_processor, self.tokenizer = image_processor, tokenizer

    def __call__(self, images=None, text=None, **kwargs):
        out = {}
        if images is not None:
            out.update(self.image_processor(images=images, **kwargs))
        if text is not None:
            out.update(self.tokenizer(text, padding=True, **kwargs))
        return out


def synthetic_image(size: int = 32, seed: int = 0) -> "numpy.ndarray":  # noqa: F821
    """An RGB image ``(size, size, 3)`` of uint8: a colour gradient, a bright square and noise."""
    import numpy

    rng = numpy.random.default_rng(seed)
    axis = numpy.linspace(0, 1, size)
    image = numpy.stack([axis[None, :].repeat(size, 0), axis[:, None].repeat(size, 1), 0.5 * numpy.ones((size, size))],
                        axis=-1)  # fmt: skip
    start = int(rng.integers(0, size // 2))
    image[start : start + size // 3, start : start + size // 3] = 1.0
    image = image + 0.1 * rng.standard_normal(image.shape)
    return (numpy.clip(image, 0, 1) * 255).astype(numpy.uint8)

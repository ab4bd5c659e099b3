"""Token mixers that are not attention as exact mixing matrices (:mod:`inseq_mixing.methods.mixers`): each token's part
of a mixer's output, with the mixer's gates, steps and decays frozen at the pass, adds up to the Hugging Face
module's own output (its PyTorch path), is causal, and holds for a padded batch."""

import pytest
import torch
from transformers import Mamba2Config, Mamba2ForCausalLM

from inseq_mixing.methods.mixers import FrozenMixer

from .conftest import forward_hooks


def tiny_mamba2(use_bias: bool) -> Mamba2ForCausalLM:
    torch.manual_seed(0)
    config = Mamba2Config(vocab_size=64, hidden_size=16, num_heads=4, head_dim=8, expand=2, n_groups=2, state_size=8,
                          conv_kernel=4, chunk_size=4, num_hidden_layers=2, use_bias=use_bias)  # fmt: skip
    model = Mamba2ForCausalLM(config).eval()
    with torch.no_grad():  # random steps and decays of a trained model's range, not the initialisation's
        for layer in model.backbone.layers:
            layer.mixer.A_log.uniform_(-1.0, 1.5)
            layer.mixer.D.normal_()
            layer.mixer.dt_bias.normal_()
    return model


def check_parts(freeze, module, length: int = 11, padded: int = 3, alone: bool = True):
    """A left-padded row beside a full one through ``module``: the parts ``freeze(module, hidden, mask)`` gives plus
    what no token carries are the module's own output on every real position, a later token's part is exactly 0, and
    (with ``alone``) the padded row's real positions equal that row alone. Returns the parts."""
    hidden = torch.randn(2, length, module.out_proj.out_features)
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, :padded] = 0
    with torch.no_grad():
        output = module(hidden, attention_mask=mask)
        frozen = freeze(module, hidden, mask)
        parts = frozen.token_parts()
        total = parts.sum(2) + frozen.unattributed()
        torch.testing.assert_close(total[mask.bool()], output[mask.bool()], rtol=1e-4, atol=1e-5)
        assert (parts[:, torch.ones(length, length, dtype=torch.bool).triu(1)] == 0).all()
        if alone:
            single = freeze(module, hidden[1:, padded:]).token_parts()[0]
            torch.testing.assert_close(parts[1, padded:, padded:], single, rtol=1e-4, atol=1e-6)
    return parts


def mixer_calls(model, ids, mask):
    """Every mixer's input, attention mask and output in one forward pass of the model."""
    calls = []

    def record(module, args, kwargs, output):
        calls.append((module, args[0] if args else kwargs["hidden_states"], kwargs.get("attention_mask"), output))

    with forward_hooks(*[(layer.mixer, record) for layer in model.backbone.layers], with_kwargs=True), torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    return calls


@pytest.mark.parametrize("use_bias", [False, True])
def test_mamba2_token_parts_add_up_to_the_mixer_output_and_are_causal(use_bias):
    """Eleven positions in chunks of 4 (the module's inter-chunk path), a left-padded row beside a full one: on every
    real position the parts of every token plus what no token carries are the module's output; a later token's part
    is exactly 0; a padded row's real positions equal that row alone."""
    model = tiny_mamba2(use_bias)
    ids = torch.randint(1, 64, (2, 11))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    calls = mixer_calls(model, ids, mask)
    alone = mixer_calls(model, ids[1:, 3:], mask[1:, 3:])
    for (mixer, hidden, attention_mask, output), (_, hidden_alone, _, _) in zip(calls, alone, strict=True):
        with torch.no_grad():
            frozen = FrozenMixer.mamba2(mixer, hidden, attention_mask)
            parts = frozen.token_parts()  # (B, T, T, d)
            total = parts.sum(2) + frozen.unattributed()
            real = mask.bool()
            torch.testing.assert_close(total[real], output.float()[real], rtol=1e-4, atol=1e-5)
            later = torch.ones(11, 11, dtype=torch.bool).triu(1)
            assert (parts[:, later] == 0).all()
            chunks = torch.cat([frozen.token_parts(slice(start, start + 4)) for start in range(0, 11, 4)], dim=1)
            torch.testing.assert_close(chunks, parts, rtol=0, atol=0)  # rows in chunks: the same parts
            single = FrozenMixer.mamba2(mixer, hidden_alone).token_parts()[0]
            if not use_bias:  # with an in_proj bias a padded token still feeds the convolution, as in the module
                torch.testing.assert_close(parts[1, 3:, 3:], single, rtol=1e-4, atol=1e-6)


def test_gated_deltanet_token_parts_add_up_to_the_layer_output_and_are_causal():
    """Qwen3-Next's Gated DeltaNet (two value heads per key head), a left-padded row beside a full one: the parts
    through ``W = tril(QKᵀ ⊙ Γ)(I + A)⁻¹ diag(β)`` and the value convolution add up to the module's own output on every
    real position, later tokens get exactly 0, and the padded row's real positions equal that row alone."""
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    torch.manual_seed(0)
    config = Qwen3NextConfig(hidden_size=16, linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8,
                             linear_value_head_dim=6, linear_conv_kernel_dim=4, num_hidden_layers=1,
                             layer_types=["linear_attention"])  # fmt: skip
    module = Qwen3NextGatedDeltaNet(config, 0).eval()
    with torch.no_grad():
        module.norm.weight.normal_()
    check_parts(FrozenMixer.gated_deltanet, module)


@pytest.mark.parametrize("conv_bias", [False, True])
def test_lfm2_short_convolution_parts_add_up_and_reach_only_the_taps(conv_bias):
    """LFM2's gated short convolution: the parts add up to the module's own output on every real position of a
    left-padded batch (without a bias, the padded row is itself alone), and a token reaches only itself and the next
    K − 1 positions."""
    from transformers import Lfm2Config
    from transformers.models.lfm2.modeling_lfm2 import Lfm2ShortConv

    torch.manual_seed(0)
    config = Lfm2Config(hidden_size=16, conv_L_cache=3, conv_bias=conv_bias, num_hidden_layers=1, layer_types=["conv"])
    module = Lfm2ShortConv(config, 0).eval()
    parts = check_parts(FrozenMixer.lfm2, module, length=9, padded=2, alone=not conv_bias)
    distance = torch.arange(9)[:, None] - torch.arange(9)[None, :]
    assert (parts[:, (distance < 0) | (distance >= 3)] == 0).all()
    assert (parts[0, (distance >= 0) & (distance < 3)].abs().sum(-1) > 0).all()


@pytest.mark.parametrize("use_bias", [False, True])
def test_mamba_selective_scan_parts_add_up_per_channel(use_bias):
    """Mamba's selective scan (one mixing matrix per channel), a left-padded row beside a full one: the parts add up
    to the module's own output on every real position, later tokens get exactly 0, and without an input bias the
    padded row's real positions equal that row alone."""
    from transformers import MambaConfig
    from transformers.models.mamba.modeling_mamba import MambaMixer

    torch.manual_seed(0)
    config = MambaConfig(hidden_size=16, intermediate_size=32, state_size=4, conv_kernel=4, time_step_rank=4,
                         num_hidden_layers=1, use_bias=use_bias)  # fmt: skip
    module = MambaMixer(config, 0).eval()
    with torch.no_grad():  # steps and decays of a trained model's range: the initialisation's steps mix little
        module.D.normal_()
        module.A_log.uniform_(-1.0, 1.5)
        module.dt_proj.bias.normal_()
    check_parts(FrozenMixer.mamba, module, length=10, alone=not use_bias)

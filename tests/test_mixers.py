"""Token mixers that are not attention as exact mixing matrices (:mod:`inseq_mixing.methods.mixers`): each token's part
of a mixer's output, with the mixer's gates, steps and decays frozen at the pass, adds up to the Hugging Face
module's own output (its PyTorch path), is causal, and holds for a padded batch."""

import pytest
import torch
from transformers import Mamba2Config, Mamba2ForCausalLM

from inseq_mixing.methods.mixers import FrozenMamba2


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


def mixer_calls(model, ids, mask):
    """Every mixer's input, attention mask and output in one forward pass of the model."""
    calls = []

    def record(module, args, kwargs, output):
        calls.append((module, args[0] if args else kwargs["hidden_states"], kwargs.get("attention_mask"), output))

    handles = [layer.mixer.register_forward_hook(record, with_kwargs=True) for layer in model.backbone.layers]
    try:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask)
    finally:
        for handle in handles:
            handle.remove()
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
            frozen = FrozenMamba2.freeze(mixer, hidden, attention_mask)
            parts = frozen.token_parts()  # (B, T, T, d)
            total = parts.sum(2) + frozen.unattributed()
            real = mask.bool()
            torch.testing.assert_close(total[real], output.float()[real], rtol=1e-4, atol=1e-5)
            later = torch.ones(11, 11, dtype=torch.bool).triu(1)
            assert (parts[:, later] == 0).all()
            chunks = torch.cat([frozen.token_parts(slice(start, start + 4)) for start in range(0, 11, 4)], dim=1)
            torch.testing.assert_close(chunks, parts, rtol=0, atol=0)  # rows in chunks: the same parts
            single = FrozenMamba2.freeze(mixer, hidden_alone).token_parts()[0]
            if not use_bias:  # with an in_proj bias a padded token still feeds the convolution, as in the module
                torch.testing.assert_close(parts[1, 3:, 3:], single, rtol=1e-4, atol=1e-6)

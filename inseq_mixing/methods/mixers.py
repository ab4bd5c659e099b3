"""Token mixers that are not attention, written as exact data-controlled mixing matrices.

Mamba-2 (Dao & Gu, ICML 2024, *Transformers are SSMs: Generalized Models and Efficient Algorithms Through Structured
State Space Duality*). A Mamba-2 mixer maps the block's normed input ``h`` to::

    z, ξ, δ = in_proj(h)                        (gate, conv input, raw step: each token's own)
    u_s = b + Σ_{d<K} w_{K−1−d} ⊙ ξ_{s−d}       (causal depthwise convolution, K taps per channel)
    x_s, B_s, C_s = silu(u_s)                   (split over channels)
    y_t = Σ_{s≤t} M^h_{ts} x_s + D_h x_t,       M^h_{ts} = (C_t · B_s) · exp(A_h Σ_{r=s+1..t} Δ_{r,h}) · Δ_{s,h}
    out_t = W_out (γ ⊙ (y_t ⊙ silu(z_t)) / rms_g(y_t ⊙ silu(z_t)))

with ``Δ = clamp(softplus(δ + Δ_bias))`` one step per head (the SSD form: one scalar decay per head, so ``M^h`` is a
``T × T`` lower-triangular matrix per head, attention-like). Freezing at the traced pass what attention methods freeze
there (the probabilities) and what a norm's statistics are (:class:`~.norms.FrozenNorm`), namely ``M^h`` (from
``B``, ``C`` and ``Δ``), the activation's ratio ``silu(u)/u`` of the ``x`` channels, the gate ``silu(z)`` and the
group RMS, the mixer is linear in the tokens' conv inputs ``ξ_j``, and token ``j``'s exact part of ``out_t`` is::

    part_t(j) = W_out (γ ⊙ silu(z_t) / rms_t ⊙ (κ_{t,j} ⊙ ξ_j)),
    κ_{t,j,c} = Σ_{d<K} M̃^{h(c)}_{t,j+d} ρ_{j+d,c} w_{c,K−1−d}

(``M̃ = M + D·I``, ``ρ = silu(u)/u``): the convolution makes a token reach the SSD through the ``K`` positions after it.
What no token carries: the convolution's bias ``b`` (through the same path) and ``out_proj``'s bias. The parts add up
to the mixer's own output (the tests check it against the Hugging Face module's PyTorch path).

**Our extension** throughout: the SSD paper reads ``M^h`` as attention-like but defines no token attribution through
the convolution, the gate and the norm.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class FrozenMamba2:
    """One Mamba-2 mixer's data-dependent quantities frozen at a traced pass (batch ``B``, positions ``T``).

    Attributes:
        conv_input: ``ξ`` ``(B, T, I)``: each token's conv input of the ``x`` channels (its own ``in_proj`` output).
        ratio: ``ρ = silu(u)/u`` of the ``x`` channels ``(B, T, I)`` (0 on padding: the module zeroes it there).
        mixing: ``M̃`` ``(B, H, T, T)``: the SSD matrix per head, ``D`` on its diagonal.
        conv_weight: ``(I, K)`` taps of the ``x`` channels; ``conv_bias``: ``(I,)`` or None.
        scale: ``γ ⊙ silu(z_t) / rms_t`` per channel ``(B, T, I)``: the gate and the frozen group norm.
        out_proj: The module's output projection.
    """

    conv_input: torch.Tensor
    ratio: torch.Tensor
    mixing: torch.Tensor
    conv_weight: torch.Tensor
    conv_bias: torch.Tensor | None
    scale: torch.Tensor
    out_proj: torch.nn.Linear

    @classmethod
    def freeze(cls, mixer, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None) -> FrozenMamba2:
        """Freeze ``mixer`` (a transformers ``Mamba2Mixer``) at its input ``hidden`` ``(B, T, d)``, recomputing every
        quantity on the module's PyTorch path (the CUDA kernels, where installed, run the model's own forward)."""
        mask = torch.ones(hidden.shape[:2], dtype=hidden.dtype, device=hidden.device)
        if attention_mask is not None:
            mask = attention_mask.to(hidden.dtype)
        hidden = hidden * mask[..., None]
        inner, heads, groups, state = mixer.intermediate_size, mixer.num_heads, mixer.n_groups, mixer.ssm_state_size
        gate, xbc, step = mixer.in_proj(hidden).split([inner, mixer.conv_dim, heads], dim=-1)
        taps = mixer.conv1d.weight.squeeze(1)  # (channels, K)
        length = hidden.shape[1]
        convolved = F.conv1d(xbc.transpose(1, 2), mixer.conv1d.weight, mixer.conv1d.bias, padding=taps.shape[1] - 1,
                             groups=mixer.conv_dim)[..., :length].transpose(1, 2)  # fmt: skip
        activated = F.silu(convolved) * mask[..., None]
        x_pre = convolved[..., :inner].float()
        ratio = torch.where(x_pre == 0, torch.full_like(x_pre, 0.5), F.silu(x_pre) / x_pre) * mask[..., None]
        b, c = activated[..., inner:].float().split([groups * state, groups * state], dim=-1)
        b = b.unflatten(-1, (groups, state)).repeat_interleave(heads // groups, dim=2)  # (B, T, H, N)
        c = c.unflatten(-1, (groups, state)).repeat_interleave(heads // groups, dim=2)
        dt = F.softplus(step.float() + mixer.dt_bias.float())
        dt = dt.clamp(*mixer.time_step_limit)  # (B, T, H)
        decay = -torch.exp(mixer.A_log.float()) * dt  # (B, T, H): A_h Δ_{r,h}
        total = decay.cumsum(1).transpose(1, 2)  # (B, H, T)
        causal = torch.ones(length, length, dtype=torch.bool, device=hidden.device).tril()
        exponent = (total[..., :, None] - total[..., None, :]).masked_fill(~causal, -torch.inf)
        mixing = torch.einsum("bthn,bshn->bhts", c, b) * exponent.exp() * dt.transpose(1, 2)[:, :, None, :]
        mixing = mixing + torch.diag_embed(mixer.D.float()[None, :, None].expand(*mixing.shape[:2], length))
        y = _ssd(mixing, activated[..., :inner].float(), heads)
        gated = y * F.silu(gate.float())
        grouped = gated.unflatten(-1, (groups, inner // groups))
        rms = torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + mixer.norm.variance_epsilon)
        scale = (rms.expand_as(grouped).flatten(-2) * F.silu(gate.float())) * mixer.norm.weight.float()
        bias = None if mixer.conv1d.bias is None else mixer.conv1d.bias[:inner].float()
        return cls(xbc[..., :inner].float(), ratio, mixing, taps[:inner].float(), bias, scale, mixer.out_proj)

    def kernel(self, rows: slice = slice(None)) -> torch.Tensor:
        """``κ`` ``(B, R, T, I)``: how much of token ``j``'s conv input (column) reaches position ``t``'s SSD output
        (row), per channel, through the convolution's taps and the SSD matrix, for the positions ``rows`` picks (a
        chunk of rows holds ``R × T × I`` elements: chunk the rows to bound memory)."""
        batch, length, inner = self.conv_input.shape
        heads = self.mixing.shape[1]
        mixing = self.mixing[:, :, rows]
        per_channel = mixing.repeat_interleave(inner // heads, dim=1).permute(0, 2, 3, 1)  # (B, R, S, I)
        taps = self.conv_weight.shape[1]
        kernel = per_channel.new_zeros(batch, mixing.shape[2], length, inner)
        for offset in range(min(taps, length)):  # s = j + offset reads token j through tap K − 1 − offset
            reached = per_channel[:, :, offset:, :] * self.ratio[:, None, offset:, :]  # (B, R, T − offset, I)
            kernel[:, :, : length - offset, :] += reached * self.conv_weight[:, taps - 1 - offset]
        return kernel

    def token_parts(self, rows: slice = slice(None)) -> torch.Tensor:
        """Each token's part of the mixer output of the positions ``rows`` picks ``(B, R, T, d)`` (row: position,
        column: token); 0 for later tokens."""
        parts = self.kernel(rows) * self.conv_input[:, None, :, :] * self.scale[:, rows, None, :]
        return F.linear(parts, self.out_proj.weight.float())

    def unattributed(self) -> torch.Tensor:
        """What no token carries ``(B, T, d)``: the convolution's bias through the SSD, gate and norm, and the output
        projection's bias."""
        batch, length, inner = self.conv_input.shape
        heads = self.mixing.shape[1]
        rest = torch.zeros(batch, length, inner, dtype=self.scale.dtype, device=self.scale.device)
        if self.conv_bias is not None:
            rest = _ssd(self.mixing, self.ratio * self.conv_bias, heads)
        rest = F.linear(rest * self.scale, self.out_proj.weight.float())
        if self.out_proj.bias is not None:
            rest = rest + self.out_proj.bias.float()
        return rest


def _ssd(mixing: torch.Tensor, inputs: torch.Tensor, heads: int) -> torch.Tensor:
    """``y_t = Σ_s M̃^h_{ts} x_s`` per head: ``mixing`` ``(B, H, T, T)``, ``inputs`` ``(B, T, I)`` → ``(B, T, I)``."""
    per_head = inputs.unflatten(-1, (heads, -1))  # (B, T, H, P)
    return torch.einsum("bhts,bshp->bthp", mixing, per_head).flatten(-2)

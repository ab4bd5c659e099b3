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

Gated DeltaNet (Yang, Kautz & Hatamizadeh, ICLR 2025, *Gated Delta Networks: Improving Mamba2 with Delta Rule*;
Qwen3-Next's linear-attention layers): the state ``S_t = α_t S_{t−1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ`` read by
``o_t = S_t q_t`` is, unrolled, ``o_t = Σ_s W_ts v_s`` with one scalar per (position, token, head)::

    W = tril(Q Kᵀ ⊙ Γ) (I + A)⁻¹ diag(β),   Γ_ts = Π_{r=s+1..t} α_r,   A_ts = β_t (k_t · k_s) Γ_ts  (s < t)

(the delta rule's pseudo-values ``u = (I + A)⁻¹ diag(β) v``, after Yang et al., NeurIPS 2024, *Parallelizing Linear
Transformers with the Delta Rule over Sequence Length*; not the state products: computed chunk by chunk, a small
triangular solve per chunk and the earlier tokens' key traces carried across, :func:`delta_rule_mixing`). With
``q``, ``k``, ``β`` and ``α`` frozen (they come through the convolution too: frozen as attention's queries and keys
are), the values' path is Mamba-2's: a convolution, ``silu``, ``W``, a gated per-head RMS norm, ``out_proj``.

Gated attention (Qwen3-Next, Qwen3.5; Qiu et al., 2025, *Gated Attention for Large Language Models*): softmax
attention whose output is gated per query position and channel, ``o_proj(σ(g_t) ⊙ Σ_h α^h_tj v^h_j)``. The gate
depends on the row, so token ``j``'s part is no longer its value through ``o_proj`` times a probability; frozen as
the probabilities are, ``σ(g_t)`` is the per-row scale of the layout below, with no convolution (one tap of 1) and no
activation: each token's part is exact, rollout's map the head-averaged probabilities.

LFM2's short convolutions (Liquid AI, LFM2 technical report, 2025): ``out_proj(C_t ⊙ conv(B ⊙ x)_t)``, a gated
depthwise convolution of ``K`` taps: with the gates frozen, token ``j``'s part of position ``t`` is its own
``B_j ⊙ x_j`` through tap ``K − 1 − (t − j)``, then ``C_t`` and ``out_proj``: exact, and zero beyond ``K − 1``
positions.

**Our extension** throughout: the papers read ``M^h`` (and the delta rule's ``W``) as attention-like but define no
token attribution through the convolution, the gate and the norm; no method's paper treats an output-gated attention.

**How the methods read a mixer** (:func:`frozen_mixer`, one layer's frozen mixer held at a time): the decomposition
methods (ALTI, ALTI-logit, GlobEnc, the attention norms) take token ``j``'s part of position ``t`` where they take
attention's ``Σ_h α^h_tj v^h_j W^h_O`` (:meth:`FrozenMixer.token_parts`, per head :meth:`FrozenMixer.head_parts`),
and what no token carries where they take attention's output bias (:meth:`FrozenMixer.unattributed`). Rollout and
attention flow read a map in attention's place (:meth:`FrozenMixer.map_rows`): per channel, the absolute kernel
``|κ_{t,j,c}|`` (the mixing matrix through the convolution's taps and the frozen activation) normalised over the
tokens ``j``, averaged over the channels, so that each row sums to 1 like a head-averaged attention row. Ali,
Zimerman & Wolf (2024, *The Hidden Attention of Mamba Models*) roll out Mamba's hidden attention matrices averaged
over channels; reading them through the convolution, and every mixer kind here, is our extension. Value zeroing
zeroes a token's value input and re-runs what follows the frozen mixing (:meth:`FrozenMixer.zeroed_outputs`).
Mixers a block runs side by side on the same input (Falcon-H1's Mamba-2 mixer and softmax attention,
:class:`ParallelMixing`) are read through the same interface, each branch frozen alone and their parts added; rollout's
map is then the branches' maps weighted by their channels (our extension). A block whose Mamba-2 mixer reads its input
plus what a shared attention block made of it and of the token embeddings (Zamba 2, :class:`SharedAttentionMixing`) is
read through the same interface too: with that block's norms, probabilities and FFN gate frozen, a token's part of the
mixer's input is exact, and goes through the frozen mixer (our extension).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from .norms import freeze_norm

if TYPE_CHECKING:
    from ..specs.base import MixerSpec
    from ..trace import MixerTrace


@dataclass
class ValueReadout:
    """What a mixer computes past its mixing, for value zeroing's re-run: the value channels' activation
    pre-values, the mixing's output before the gate and norm, the gate, and the norm.

    Attributes:
        pre: The activation's pre-values of the value channels ``(B, T, I)`` (``silu``); None: no activation (LFM2).
        y: The mixing's output ``Σ_s W_ts act(u_s)`` before the gate and norm ``(B, T, I)``.
        gate: The output gate per channel ``(B, T, I)``.
        norm: The gated RMS norm's ``(weight (I,), eps, channels per group)``, or None.
        gate_first: The gate multiplies before the norm (Mamba-2), else after it (Gated DeltaNet).
    """

    pre: torch.Tensor | None
    y: torch.Tensor
    gate: torch.Tensor
    norm: tuple[torch.Tensor, float, int] | None
    gate_first: bool = True


@dataclass
class FrozenMixer:
    """One mixer's data-dependent quantities frozen at a traced pass (batch ``B``, positions ``T``), for a mixer that
    is ``out_proj(scale ⊙ Σ_s W^h_{ts} act(conv(ξ))_s)``: built by the constructor named as its spec's kind
    (:meth:`mamba2`, :meth:`mamba`, :meth:`mamba_heads`, :meth:`gated_deltanet`, :meth:`lfm2`,
    :meth:`gated_attention`).

    Attributes:
        conv_input: ``ξ`` ``(B, T, I)``: each token's conv input of the mixed channels (its own ``in_proj`` output).
        ratio: ``ρ = silu(u)/u`` of those channels ``(B, T, I)`` (0 where the module zeroes them: padding).
        mixing: ``W`` ``(B, H, T, T)``: the mixing matrix per head (Mamba-2: the SSD's ``M̃``, ``D`` on its diagonal).
        conv_weight: ``(I, K)`` taps of the mixed channels; ``conv_bias``: ``(I,)`` or None.
        scale: ``γ ⊙ silu(z_t) / rms_t`` per channel ``(B, T, I)``: the gate and the frozen norm.
        out_proj: The module's output projection.
        mask: ``(B, T)``, 1 on real tokens (None: all real). A padding position's conv input (an input bias, its
            zeroed hidden state's projection) still reaches the real positions through the taps, as in the module:
            no token's part, it is among what no token carries (:meth:`unattributed`), and padding columns get no
            part and no map.
        readout: What value zeroing re-runs past the mixing (:class:`ValueReadout`); None where zeroing a token's
            value input changes the mixing itself (Mamba: its steps and state projections read the same channels).
        value_weight: ``(I, d)``: the conv input of the mixed channels as a linear map of the mixer's input (its
            rows of the input projection, bias left out), for DecompX's components.
        value_gate: ``(B, T, I)``: a gate held at its true value on that map (LFM2's ``B``), or None.
        per_head: The kernel is the mixing itself for every channel of a head (no convolution, no activation: gated
            attention, a missing mixer), so the maps are read per head, not per channel.
        unscaled: Besides, the scale is 1 on every channel (plain attention): token ``j``'s part of row ``t`` is
            ``Σ_h W^h_tj (W^h_out v^h_j)``, each token's values projected once per head (``T × H × d``) instead of
            every pair's channels (``T² × I × d``).
    """

    conv_input: torch.Tensor
    ratio: torch.Tensor
    mixing: torch.Tensor
    conv_weight: torch.Tensor
    conv_bias: torch.Tensor | None
    scale: torch.Tensor
    out_proj: torch.nn.Linear | Projection
    mask: torch.Tensor | None = None
    readout: ValueReadout | None = None
    value_weight: torch.Tensor | None = None
    value_gate: torch.Tensor | None = None
    per_head: bool = False
    unscaled: bool = False

    @classmethod
    def mamba2(cls, mixer, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None,
               position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None) -> FrozenMixer:  # fmt: skip
        """Freeze ``mixer`` (a transformers ``Mamba2Mixer``) at its input ``hidden`` ``(B, T, d)``, recomputing every
        quantity on the module's PyTorch path (the CUDA kernels, where installed, run the model's own forward).
        ``position_embeddings``: unread (Zamba 2's blocks pass their rotary embeddings on to the mixer's call)."""
        mask = padding_mask(hidden, attention_mask)
        hidden = hidden * mask[..., None]
        inner, heads, groups, state = mixer.intermediate_size, mixer.num_heads, mixer.n_groups, mixer.ssm_state_size
        gate, xbc, step = mamba2_projected(mixer, hidden).split([inner, mixer.conv_dim, heads], dim=-1)
        taps = mixer.conv1d.weight.squeeze(1)  # (channels, K)
        convolved = _causal_conv(mixer.conv1d, xbc)
        activated = F.silu(convolved) * mask[..., None]
        x_pre = convolved[..., :inner].float()
        ratio = _silu_ratio(x_pre) * mask[..., None]
        b, c = activated[..., inner:].float().split([groups * state, groups * state], dim=-1)
        b = b.unflatten(-1, (groups, state)).repeat_interleave(heads // groups, dim=2)  # (B, T, H, N)
        c = c.unflatten(-1, (groups, state)).repeat_interleave(heads // groups, dim=2)
        dt = F.softplus(step.float() + mixer.dt_bias.float())
        dt = dt.clamp(*mixer.time_step_limit)  # (B, T, H)
        decay = -torch.exp(mixer.A_log.float()) * dt  # (B, T, H): A_h Δ_{r,h}
        elapsed, causal = _elapsed(decay.cumsum(1).transpose(1, 2))  # (B, H, T, T)
        mixing = torch.einsum("bthn,bshn->bhts", c, b) * (elapsed.exp() * causal) * dt.transpose(1, 2)[:, :, None, :]
        mixing = _with_skip(mixing, mixer.D)
        y = mix_heads(mixing, activated[..., :inner].float(), heads)
        silu_gate = F.silu(gate.float())
        norm, gate_first = None, True
        if hasattr(mixer.norm, "weight"):  # a gated RMS norm over groups of channels (Falcon-H1's may be absent)
            norm = (mixer.norm.weight.float(), mixer.norm.variance_epsilon, inner // groups)
            gate_first = not getattr(mixer.norm, "norm_before_gate", False)  # Falcon-H1's option: norm, then gate
        scale = silu_gate
        if norm is not None:
            scale = scale * inverse_rms(y * silu_gate if gate_first else y, norm[1], norm[2]) * norm[0]
        bias = None if mixer.conv1d.bias is None else mixer.conv1d.bias[:inner].float()
        readout = ValueReadout(x_pre, y, silu_gate, norm, gate_first=gate_first)
        values = mixer.in_proj.weight[inner : 2 * inner].float() * getattr(mixer, "ssm_in_multiplier", 1.0)
        multipliers = getattr(mixer, "mup_vector", None)
        if multipliers is not None:  # Falcon-H1's per-channel multipliers on the input projection's outputs
            values = values * multipliers.flatten()[inner : 2 * inner, None].float()
        return cls(xbc[..., :inner].float(), ratio, mixing, taps[:inner].float(), bias, scale, mixer.out_proj,
                   mask.float(), readout, values)  # fmt: skip

    @classmethod
    def mamba(cls, mixer, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None) -> FrozenMixer:
        """Freeze ``mixer`` (a transformers ``MambaMixer``: Mamba's selective scan) at its input ``hidden``
        ``(B, T, d)`` on the module's PyTorch path. Its state matrix is diagonal per channel, so the mixing is one
        ``T × T`` matrix per channel (every channel a head of one):
        ``M^c_{ts} = Δ_{s,c} Σ_n C_{t,n} B_{s,n} exp(A_{c,n} Σ_{r=s+1..t} Δ_{r,c})``, ``D_c`` on its diagonal; the gate
        ``silu(z)`` scales it (no norm). ``B``, ``C`` and ``Δ`` come from the convolved tokens: frozen (Jamba's norms
        on them, where the module has them, applied first)."""
        mask = padding_mask(hidden, attention_mask)
        xi, gate = scan_values_and_gate(mixer.in_proj(hidden * mask[..., None]), interleaved=False)
        rank, state = mixer.time_step_rank, mixer.ssm_state_size
        taps = mixer.conv1d.weight.squeeze(1)
        convolved = _causal_conv(mixer.conv1d, xi)
        activated = F.silu(convolved) * mask[..., None]
        parts = list(mixer.x_proj(activated).split([rank, state, state], dim=-1))
        for index, name in enumerate(("dt_layernorm", "b_layernorm", "c_layernorm")):  # Jamba's, where present
            norm = getattr(mixer, name, None)
            if norm is not None:
                parts[index] = norm(parts[index])
        step, b, c = (part.float() for part in parts)
        dt = F.softplus(step @ mixer.dt_proj.weight.float().T + mixer.dt_proj.bias.float())
        dt = dt.transpose(1, 2)  # (B, I, T)
        elapsed, causal = _elapsed(dt.cumsum(-1))  # (B, I, T, T)
        rates = -torch.exp(mixer.A_log.float())  # A (I, N)
        inner = rates.shape[0]
        mixing = elapsed.new_zeros(elapsed.shape)
        step_channels = max(1, 2**26 // max(1, elapsed[0, 0].numel() * state * elapsed.shape[0]))
        for start in range(0, inner, step_channels):  # the (channels, T, T, N) decays a block of channels at a time
            channels = slice(start, min(start + step_channels, inner))
            decay = torch.exp(rates[None, channels, None, None, :] * elapsed[:, channels, ..., None])
            mixing[:, channels] = torch.einsum("btn,bsn,bctsn->bcts", c, b, decay)
        mixing = _with_skip(mixing * dt[:, :, None, :] * causal, mixer.D)
        x_pre = convolved.float()
        ratio = _silu_ratio(x_pre) * mask[..., None]
        bias = None if mixer.conv1d.bias is None else mixer.conv1d.bias.float()
        values = mixer.in_proj.weight[:inner].float()
        return cls(xi.float(), ratio, mixing, taps.float(), bias, F.silu(gate.float()), mixer.out_proj, mask.float(),
                   None, values)  # fmt: skip

    @classmethod
    def mamba_heads(cls, mixer, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None,
                    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None) -> FrozenMixer:  # fmt: skip
        """Freeze ``mixer`` (Zamba's ``ZambaMambaMixer``: Mamba's selective scan split into heads, each with its own
        step and state projections ``x_proj``, ``dt_proj``) at its input ``hidden`` ``(B, T, d)`` on the module's
        PyTorch path: :meth:`mamba`'s mixing, one ``T × T`` matrix per channel,
        ``M^c_{ts} = Δ_{s,c} Σ_n C^h_{t,n} B^h_{s,n} exp(A_{c,n} Σ_{r=s+1..t} Δ_{r,c})`` with ``B``, ``C`` those of the
        channel's head ``h``, ``D_c`` on its diagonal, the gate ``silu(z)`` (its input projection interleaves each
        channel's value and gate rows). ``position_embeddings``: unread."""
        mask = padding_mask(hidden, attention_mask)
        xi, gate = scan_values_and_gate(mixer.in_proj(hidden * mask[..., None]), interleaved=True)  # (B, T, I) each
        heads, width = mixer.n_mamba_heads, mixer.mamba_head_dim
        rank, state = mixer.time_step_rank, mixer.ssm_state_size
        taps = mixer.conv1d.weight.squeeze(1)
        convolved = _causal_conv(mixer.conv1d, xi)
        activated = (F.silu(convolved) * mask[..., None]).float().unflatten(-1, (heads, width))  # (B, T, H, P)
        parameters = torch.einsum("hrp,bthp->bthr", mixer.x_proj_weight.float(), activated)
        step, b, c = parameters.split([rank, state, state], dim=-1)  # (B, T, H, ·)
        dt = torch.einsum("hpr,bthr->bthp", mixer.dt_proj_weight.float(), step)
        if mixer.dt_proj_bias is not None:
            dt = dt + mixer.dt_proj_bias.float()
        dt = F.softplus(dt).flatten(2).transpose(1, 2)  # (B, I, T)
        elapsed, causal = _elapsed(dt.cumsum(-1))  # (B, I, T, T)
        rates = -torch.exp(mixer.A_log.float()).flatten(0, 1)  # A (I, N)
        inner = rates.shape[0]
        head_of = torch.arange(inner, device=rates.device) // width
        pairs = torch.einsum("bthn,bshn->bhtsn", c, b)  # (B, H, T, T, N): C^h_t · B^h_s, once for every channel
        mixing = elapsed.new_zeros(elapsed.shape)
        step_channels = max(1, 2**26 // max(1, elapsed[0, 0].numel() * state * elapsed.shape[0]))
        for start in range(0, inner, step_channels):  # the (channels, T, T, N) decays a block of channels at a time
            channels = slice(start, min(start + step_channels, inner))
            decay = torch.exp(rates[None, channels, None, None, :] * elapsed[:, channels, ..., None])
            mixing[:, channels] = (pairs[:, head_of[channels]] * decay).sum(-1)
        mixing = _with_skip(mixing * dt[:, :, None, :] * causal, mixer.D.flatten())
        x_pre = convolved.float()
        ratio = _silu_ratio(x_pre) * mask[..., None]
        bias = None if mixer.conv1d.bias is None else mixer.conv1d.bias.float()
        values = mixer.in_proj.weight[0::2].float()
        return cls(xi.float(), ratio, mixing, taps.float(), bias, F.silu(gate.float()), mixer.out_proj, mask.float(),
                   None, values)  # fmt: skip

    @classmethod
    def gated_deltanet(cls, mixer, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None) -> FrozenMixer:
        """Freeze ``mixer`` (a transformers Gated DeltaNet layer: ``Qwen3NextGatedDeltaNet`` and its copies) at its
        input ``hidden`` ``(B, T, d)`` on the module's PyTorch path. Its mixing per value head is
        ``W = tril(Q Kᵀ ⊙ Γ) (I + A)⁻¹ diag(β)`` with ``Γ_ts = Π_{r=s+1..t} α_r`` and
        ``A_ts = β_t (k_t · k_s) Γ_ts`` for ``s < t`` (the delta rule's pseudo-values ``u = (I + A)⁻¹ diag(β) v``), so
        ``o_t = Σ_s W_ts v_s``: one scalar per (position, token, head), ``q``, ``k``, ``β`` and ``α`` frozen."""
        mask = padding_mask(hidden, attention_mask)
        hidden = hidden * mask[..., None]
        query, key, value, gate, b, a = deltanet_projections(mixer, hidden)
        xi = torch.cat([part.flatten(2) for part in (query, key, value)], dim=-1)  # (B, T, conv channels)
        keys, heads = mixer.key_dim, mixer.num_v_heads
        taps = mixer.conv1d.weight.squeeze(1)
        convolved = _causal_conv(mixer.conv1d, xi).float()
        q, k, _ = F.silu(convolved).split([keys, keys, mixer.value_dim], dim=-1)
        v_pre = convolved[..., 2 * keys :]
        q, k = (x.unflatten(-1, (mixer.num_k_heads, mixer.head_k_dim)) for x in (q, k))
        q, k = (x.repeat_interleave(heads // mixer.num_k_heads, dim=2) for x in (q, k))  # (B, T, H, dk)
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) / mixer.head_k_dim**0.5
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        beta = b.float().sigmoid().transpose(1, 2)  # (B, H, T)
        log_decay = -mixer.A_log.float().exp() * F.softplus(a.float() + mixer.dt_bias.float())  # (B, T, H)
        mixing = delta_rule_mixing(q.transpose(1, 2), k.transpose(1, 2), beta, log_decay.transpose(1, 2),
                                   DELTA_RULE_CHUNK)  # fmt: skip
        ratio = _silu_ratio(v_pre)
        out = mix_heads(mixing, F.silu(v_pre), heads).unflatten(-1, (heads, mixer.head_v_dim))
        rms = torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + mixer.norm.variance_epsilon)
        scale = (rms * mixer.norm.weight.float() * F.silu(gate.float())).flatten(-2)
        bias = None if mixer.conv1d.bias is None else mixer.conv1d.bias[2 * keys :].float()
        norm = (mixer.norm.weight.float().repeat(heads), mixer.norm.variance_epsilon, mixer.head_v_dim)
        readout = ValueReadout(v_pre, out.flatten(-2), F.silu(gate.float()).flatten(-2), norm, gate_first=False)
        return cls(xi[..., 2 * keys :].float(), ratio, mixing, taps[2 * keys :].float(), bias, scale, mixer.out_proj,
                   mask.float(), readout, deltanet_value_weight(mixer).float())  # fmt: skip

    @classmethod
    def gated_attention(
        cls, attention, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> FrozenMixer:  # fmt: skip
        """Freeze ``attention`` (Qwen3-Next's and Qwen3.5's gated softmax attention,
        ``o_proj(σ(g_t) ⊙ Σ_h α^h_tj v^h_j)``, the gate ``g`` per query position and channel from the query
        projection's second half) at its input ``hidden`` ``(B, T, d)`` and the mask and rotary embeddings it was
        given: the probabilities ``α`` recomputed and frozen (as every attention method freezes them), ``σ(g_t)`` the
        per-row scale, each token's value ``v_j`` (a key-value head's copied to its query heads) what is mixed. No
        convolution: one tap of 1, the activation's ratio 1; token ``j``'s part of row ``t`` is then exactly
        ``o_proj(σ(g_t) ⊙ Σ_h α^h_tj v^h_j)``. The mask is the module's own: a key is real where its own row may
        see it."""
        return cls._softmax(attention, hidden, attention_mask, position_embeddings, gated=True)

    @classmethod
    def attention(
        cls, attention, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> FrozenMixer:  # fmt: skip
        """Freeze plain softmax attention (a Llama-layout module: ``q_proj``, ``k_proj`` (times its
        ``key_multiplier`` where it has one: Falcon-H1's), ``v_proj``, ``o_proj``, rotary embeddings) read as a mixer
        where it is one branch of parallel mixers (:class:`ParallelMixing`): :meth:`gated_attention` with the gate
        1, so token ``j``'s part of row ``t`` is ``o_proj(Σ_h α^h_tj v^h_j)``, attention's own decomposition."""
        return cls._softmax(attention, hidden, attention_mask, position_embeddings, gated=False)

    @classmethod
    def _softmax(
        cls, attention, hidden: torch.Tensor, attention_mask: torch.Tensor | None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None, gated: bool,
    ) -> FrozenMixer:  # fmt: skip
        """Softmax attention, gated (:meth:`gated_attention`) or not (:meth:`attention`), frozen at a pass."""
        query, key, value, gate = attention_inputs(attention, hidden, position_embeddings, gated)
        probs, allowed = attention_probs(attention, query, key, attention_mask)
        groups = attention.num_key_value_groups
        values = value.float().repeat_interleave(groups, dim=2).flatten(2)  # (B, T, H·P): a query head's channels
        mask = allowed.diagonal(dim1=-2, dim2=-1)[:, 0].expand(hidden.shape[:2]).float()
        heads, inner = probs.shape[1], values.shape[-1]
        scale = torch.sigmoid(gate.float()) if gated else torch.ones_like(values)
        taps = torch.ones(inner, 1, dtype=values.dtype, device=values.device)
        readout = ValueReadout(None, mix_heads(probs, values, heads), scale, None)
        weight = attention.v_proj.weight.float().unflatten(0, (-1, attention.head_dim))
        value_weight = weight.repeat_interleave(groups, dim=0).flatten(0, 1)  # (H·P, d)
        return cls(values, torch.ones_like(values), probs, taps, None, scale, attention.o_proj, mask, readout,
                   value_weight, per_head=True, unscaled=not gated)  # fmt: skip

    @classmethod
    def parallel(cls, mixers, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 branches: tuple[tuple, ...] = ()) -> ParallelMixing:  # fmt: skip
        """Freeze parallel mixers (:class:`~inseq_mixing.specs.base.ParallelMixers`: Falcon-H1's Mamba-2 mixer and
        attention) from each branch's recorded ``(input, mask, rotary embeddings)``: each branch frozen as it is
        alone, its output projection times its output factor, its value map times its input factor (the branches
        read ``m_i · x̂``, the mixer's input is ``x̂``)."""
        frozen = []
        for branch, (inputs, mask, rotary) in zip(mixers.branches, branches, strict=True):
            call = {} if rotary is None else {"position_embeddings": rotary}
            one = getattr(cls, branch.spec.kind)(branch.spec.module, inputs, mask, **call)
            one.out_proj = Projection.scaled(one.out_proj, branch.out_scale)
            if one.value_weight is not None:
                one.value_weight = one.value_weight * branch.in_scale
            frozen.append(one)
        return ParallelMixing(frozen)

    @classmethod
    def shared_attention(cls, module, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None,
                         position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None, *,
                         embeddings: torch.Tensor, shared_mask: torch.Tensor | None = None,
                         layer_idx: int | None = None) -> SharedAttentionMixing:  # fmt: skip
        """Freeze a block whose mixer reads a shared attention block (:class:`~..specs.base.SharedAttention`, Zamba
        2's) at the block's input ``hidden`` ``(B, T, d)``, the embeddings, the masks and rotary embeddings of its
        call (``layer_idx``: the call's adapters, already in the spec's projections):
        :class:`SharedAttentionMixing`."""
        return SharedAttentionMixing.freeze(module, hidden, attention_mask, position_embeddings, embeddings,
                                            shared_mask)  # fmt: skip

    @classmethod
    def lfm2(cls, mixer, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None) -> FrozenMixer:
        """Freeze ``mixer`` (a transformers ``Lfm2ShortConv``: ``out_proj(C_t ⊙ conv(B ⊙ x)_t)``) at its input
        ``hidden`` ``(B, T, d)``: token ``j`` enters with its own gated input ``B_j ⊙ x_j``, the convolution's taps
        carry it to the next ``K − 1`` positions, and the output gate ``C_t`` is frozen (the mixing is the identity,
        one head over every channel: the taps are the whole token mixing)."""
        mask = padding_mask(hidden, attention_mask)
        gate_in, gate_out, inputs = mixer.in_proj(hidden * mask[..., None]).float().chunk(3, dim=-1)
        batch, length, _ = inputs.shape
        identity = torch.eye(length, dtype=inputs.dtype, device=inputs.device).expand(batch, 1, length, length)
        bias = None if mixer.conv.bias is None else mixer.conv.bias.float()
        taps = mixer.conv.weight.squeeze(1).float()
        readout = ValueReadout(None, causal_taps(gate_in * inputs, taps, bias), gate_out, None)
        values = mixer.in_proj.weight[2 * inputs.shape[-1] :].float()
        return cls(gate_in * inputs, torch.ones_like(inputs), identity, taps, bias, gate_out, mixer.out_proj,
                   mask.float(), readout, values, gate_in)  # fmt: skip

    @classmethod
    def none(cls, mixer, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None) -> FrozenMixer:
        """A block's missing token mixer (:class:`~inseq_mixing.specs.base.NoMixer`): one channel of zeros, the
        identity as its mixing (rollout's map: each position its own), no part for any token."""
        batch, length = hidden.shape[:2]
        zeros = hidden.new_zeros(batch, length, 1, dtype=torch.float32)
        identity = torch.eye(length, dtype=zeros.dtype, device=zeros.device).expand(batch, 1, length, length)
        readout = ValueReadout(None, zeros, zeros, None)
        return cls(zeros, torch.ones_like(zeros), identity, zeros.new_ones(1, 1), None, zeros, mixer.out_proj,
                   padding_mask(zeros, attention_mask), readout, zeros.new_zeros(1, hidden.shape[-1]),
                   per_head=True)  # fmt: skip

    @property
    def heads(self) -> int:
        """The mixing matrices per pair of positions."""
        return self.mixing.shape[1]

    @property
    def positions(self) -> int:
        """The positions it mixes (``T``)."""
        return self.conv_input.shape[1]

    def kernel(self, rows: slice = slice(None), keys: slice = slice(None)) -> torch.Tensor:
        """``κ`` ``(B, R, K, I)``: how much of token ``j``'s conv input (column) reaches position ``t``'s SSD output
        (row), per channel, through the convolution's taps and the SSD matrix, for the positions ``rows`` and the
        tokens ``keys`` pick (a chunk holds ``R × K × I`` elements: chunk the rows to bound memory). A token reaches
        the SSD through its own position and the ``taps − 1`` after it: only those columns of the mixing are read."""
        length = self.ratio.shape[1]
        first, stop, _ = keys.indices(length)
        window = slice(first, min(length, stop + self.conv_weight.shape[1] - 1))
        found = through_taps(self.mixing[:, :, rows, window], self.ratio[:, window], self.conv_weight)
        return found[:, :, : stop - first]

    @property
    def token_input(self) -> torch.Tensor:
        """The conv input of the real tokens ``(B, T, I)`` (padding's zeroed)."""
        return self.conv_input if self.mask is None else self.conv_input * self.mask[..., None]

    def _scaled(self, rows: slice, keys: slice) -> torch.Tensor:
        """Each token's part before the output projection ``(B, R, K, I)``."""
        found = self.kernel(rows, keys)  # a fresh tensor: scaled in place
        return found.mul_(self.token_input[:, None, keys, :]).mul_(self.scale[:, rows, None, :])

    def _projected(self, keys: slice) -> torch.Tensor:
        """Each token's values through each head's rows of the output projection ``(B, K, H, d)`` (:attr:`unscaled`
        mixers)."""
        cached = vars(self).get("_projected_values")  # once per frozen mixer: every tile reads it
        if cached is None:
            values = self.token_input.unflatten(-1, (self.heads, -1))  # (B, T, H, P)
            weight = self.out_proj.weight.float().unflatten(-1, (self.heads, -1))  # (d, H, P)
            cached = self._projected_values = torch.einsum("bkhp,dhp->bkhd", values, weight)
        return cached[:, keys]

    def token_parts(self, rows: slice = slice(None), keys: slice = slice(None)) -> torch.Tensor:
        """Each token's part of the mixer output of the positions ``rows`` picks ``(B, R, K, d)`` (row: position,
        column: token of ``keys``); 0 for later tokens."""
        if self.unscaled:
            return torch.einsum("bhrk,bkhd->brkd", self.mixing[:, :, rows, keys], self._projected(keys))
        return F.linear(self._scaled(rows, keys), self.out_proj.weight.float())

    def head_parts(self, rows: slice = slice(None), keys: slice = slice(None)) -> torch.Tensor:
        """Each head's part of each token ``(B, R, H, K, d)``: the channels of head ``h`` alone through the output
        projection (they add up to :meth:`token_parts` over the heads)."""
        if self.unscaled:
            return torch.einsum("bhrk,bkhd->brhkd", self.mixing[:, :, rows, keys], self._projected(keys))
        scaled = self._scaled(rows, keys).unflatten(-1, (self.heads, -1))  # (B, R, K, H, P)
        weight = self.out_proj.weight.float().unflatten(-1, (self.heads, -1))  # (d, H, P)
        return torch.einsum("brkhp,dhp->brhkd", scaled, weight)

    def row_blocks(self, rows: slice = slice(None), block_elements: int = 2**24) -> list[slice]:
        """The positions ``rows`` in consecutive blocks whose kernel ``(B, r, T, I)`` holds at most ``block_elements``
        (one empty block for no rows)."""
        return row_blocks(rows, *self.conv_input.shape, block_elements)

    def logit_parts(self, direction: torch.Tensor, rows: slice = slice(None), per_head: bool = False,
                    block_elements: int = 2**24) -> torch.Tensor:  # fmt: skip
        """``g_t · part_t(j)`` ``(B, R, T)`` for directions ``g`` of the positions ``rows`` ``(B, R, d)`` (per head
        ``(B, H, R, T)``): the direction through the output projection and the frozen scale (``r_t``), then, tap by
        tap, ``Σ_h W^h_{t,j+d} (r^h_t · z^h_{j,d})`` with ``z_{j,d} = ρ_{j+d} ⊙ w_{K−1−d} ⊙ ξ_j`` (one matrix product
        per head and tap: the kernel ``κ`` is never formed), a block of rows at a time."""
        batch, length, inner = self.conv_input.shape
        first = rows.indices(length)[0]
        heads, size = self.heads, self.conv_weight.shape[1]
        read = (direction.to(self.scale.dtype) @ self.out_proj.weight.float()) * self.scale[:, rows]  # (B, R, I)
        read = read.unflatten(-1, (heads, -1)).transpose(1, 2)  # (B, H, R, P)
        tokens, offsets = self.token_input, range(min(size, length))  # s = j + d reads token j through tap K − 1 − d

        def tap_inputs(offset: int) -> torch.Tensor:  # z_{j,d} (B, H, P, T − d), once for every block of rows
            found = self.ratio[:, offset:] * self.conv_weight[:, size - 1 - offset] * tokens[:, : length - offset]
            return found.unflatten(-1, (heads, -1)).permute(0, 2, 3, 1)

        reached = [tap_inputs(offset) for offset in offsets]
        blocks = []
        for block in self.row_blocks(rows, block_elements):
            weights = read[:, :, block.start - first : block.stop - first]
            found = weights.new_zeros(batch, heads, weights.shape[2], length)
            for offset, inputs in zip(offsets, reached, strict=True):
                found[..., : length - offset] += self.mixing[:, :, block, offset:] * (weights @ inputs)  # (B, H, r, ·)
            blocks.append(found if per_head else found.sum(1))
        return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=-2)

    def map_rows(self, rows: slice = slice(None)) -> torch.Tensor:
        """The map rollout and attention flow read in attention's place ``(B, 1, R, T)``: per channel,
        ``|κ_{t,j,c}|`` normalised over the tokens ``j``, averaged over the channels (each real row sums to 1)."""
        if self.per_head:  # each channel of a head has the head's kernel: the channels' mean is the heads'
            kernel = self.mixing[:, :, rows].abs()  # (B, H, R, T)
            if self.mask is not None:
                kernel = kernel * self.mask[:, None, None, :]
            shares = kernel / kernel.sum(-1, keepdim=True).clamp(min=torch.finfo(kernel.dtype).tiny)
            return shares.mean(1)[:, None]
        kernel = self.kernel(rows).abs_()  # a fresh tensor: normalised in place
        if self.mask is not None:  # no share for padding
            kernel.mul_(self.mask[:, None, :, None])
        total = kernel.sum(2, keepdim=True)
        return kernel.div_(total.clamp_(min=torch.finfo(kernel.dtype).tiny)).mean(-1)[:, None]

    def totals(self, rows: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor]:
        """``(Σ_j part_t(j), part_t(t))`` of the positions ``rows`` ``(B, R, d)`` each: the mixer's output without
        what no token carries, and each position's own part. The mixing is linear in the conv inputs, so the sum is
        the tokens' inputs through the taps, the frozen activation and the mixing (``T² × channels``, not a part per
        pair); a token reaches its own position through its last tap alone."""
        inputs = self.ratio * causal_taps(self.token_input, self.conv_weight)
        total = mix_heads(self.mixing[:, :, rows], inputs, self.heads)  # (B, R, I)
        diagonal = self.mixing[:, :, rows].diagonal(offset=rows.indices(self.ratio.shape[1])[0], dim1=-2, dim2=-1)
        own = diagonal.repeat_interleave(inputs.shape[-1] // self.heads, dim=1).transpose(1, 2)  # (B, R, I)
        own = own * self.ratio[:, rows] * self.conv_weight[:, -1] * self.token_input[:, rows]
        weight = self.out_proj.weight.float()
        return F.linear(total * self.scale[:, rows], weight), F.linear(own * self.scale[:, rows], weight)

    def finish(self, y: torch.Tensor, rows: slice = slice(None)) -> torch.Tensor:
        """The mixer's output ``(..., R, d)`` from mixing outputs ``y`` ``(..., R, I)`` of the positions ``rows``:
        the gate and the gated norm recomputed on ``y`` (their statistics its own), then ``out_proj``."""
        readout = self.readout
        gate = readout.gate[:, rows]
        gate = gate.reshape(gate.shape[0], *[1] * (y.dim() - 3), *gate.shape[1:])  # broadcast over y's extra axes
        hidden = y * gate if readout.gate_first or readout.norm is None else y
        if readout.norm is not None:
            weight, eps, group = readout.norm
            hidden = hidden * inverse_rms(hidden, eps, group) * weight
            if not readout.gate_first:
                hidden = hidden * gate
        bias = None if self.out_proj.bias is None else self.out_proj.bias.float()
        return F.linear(hidden, self.out_proj.weight.float(), bias)

    def zeroed_outputs(self, keys: slice, rows: slice = slice(None)) -> torch.Tensor:
        """The mixer's outputs at the positions ``rows`` when each token of ``keys`` has its value input zeroed
        ``(B, K, R, d)``, with the mixing frozen and what follows it re-run (value zeroing, our extension): token
        ``j``'s value reaches position ``s = j + d`` through tap ``K − 1 − d``, so the activation there changes by
        ``act(u_s) − act(u_s − w_{K−1−d} ξ_j)``, carried by the mixing to every row, then the gate, the gated norm
        (its statistics recomputed) and ``out_proj``.

        Raises:
            ValueError: A mixer whose mixing reads the value channels too (Mamba), where no such closed form holds.
        """
        if self.readout is None:
            raise ValueError("Value zeroing needs the mixing to stay as it was when a token's value input is zeroed; "
                             "in Mamba its steps and state projections read the same channels, so it cannot be "
                             "written in closed form: use alti, alti_logit, globenc, attention_norm or "
                             "attention_rollout.")  # fmt: skip
        batch, length, inner = self.conv_input.shape
        first, stop, _ = keys.indices(length)
        start, end, _ = rows.indices(length)
        size, per_head = self.conv_weight.shape[1], inner // self.heads
        values = self.conv_input[:, first:stop]  # (B, K, I)
        change = values.new_zeros(batch, stop - first, end - start, inner)
        for offset in range(size):
            positions = torch.arange(first, stop, device=values.device) + offset
            inside = positions < length
            positions = positions.clamp(max=length - 1)
            shift = values * self.conv_weight[:, size - 1 - offset]
            if self.readout.pre is None:
                moved = shift
            else:
                before = self.readout.pre[:, positions]
                moved = F.silu(before) - F.silu(before - shift)
            moved = moved * inside[None, :, None]
            if self.mask is not None:
                moved = moved * self.mask[:, positions, None]
            weights = self.mixing[:, :, start:end, positions].repeat_interleave(per_head, dim=1)  # (B, I, R, K)
            change += weights.permute(0, 3, 2, 1) * moved[:, :, None, :]
        return self.finish(self.readout.y[:, None, start:end] - change, rows)

    def component_outputs(self, components: torch.Tensor, per_head: bool = False, first: int = 0) -> torch.Tensor:
        """DecompX through the mixer: the output's components ``(B, T, K, d)`` from components of its input
        ``(B, T, K, d)`` (after the branch's norm), each through the value map (a gate held at its true value), the
        taps, the frozen activation slope, the mixing, the frozen gate and norm and ``out_proj``; the biases' paths
        are left out (they are the output minus the components' sum). ``per_head``: each head's channels alone
        through the output projection ``(B, T, K, H, d)``. ``first``: the components are 0 at the positions before
        it, so those positions' outputs are 0 (the mixer is causal) and only the later ones are computed.

        Raises:
            ValueError: A mixer whose value map is not written.
        """
        if self.value_weight is None:
            raise ValueError("DecompX needs the mixer's value input as a linear map of its input; it is not written "
                             "for this kind of mixer yet.")  # fmt: skip
        later = slice(first, None)
        values = components[:, later] @ self.value_weight.T  # (B, T', K, I)
        if self.mask is not None:  # the module zeroes padding's inputs
            values = values * self.mask[:, later, None, None]
        if self.value_gate is not None:
            values = values * self.value_gate[:, later, None]
        tapped = causal_taps(values.transpose(1, 2), self.conv_weight).transpose(1, 2)  # along the positions
        activated = (tapped * self.ratio[:, later, None]).unflatten(-1, (self.heads, -1))  # (B, T', K, H, P)
        mixed = torch.einsum("bhts,bskhp->btkhp", self.mixing[:, :, later, later], activated)
        if per_head:
            scaled = mixed * self.scale[:, later].unflatten(-1, (self.heads, -1))[:, :, None]
            weight = self.out_proj.weight.float().unflatten(-1, (self.heads, -1))
            found = torch.einsum("btkhp,dhp->btkhd", scaled, weight)
        else:
            found = F.linear(mixed.flatten(-2) * self.scale[:, later, None], self.out_proj.weight.float())
        if not first:
            return found
        return torch.cat([found.new_zeros(found.shape[0], first, *found.shape[2:]), found], dim=1)

    def unattributed(self) -> torch.Tensor:
        """What no token carries ``(B, T, d)``: the convolution's bias and the padding positions' conv inputs through
        the taps, the SSD, gate and norm, and the output projection's bias."""
        batch, length, inner = self.conv_input.shape
        heads = self.mixing.shape[1]
        rest = torch.zeros(batch, length, inner, dtype=self.scale.dtype, device=self.scale.device)
        if self.conv_bias is not None:
            rest = rest + self.conv_bias
        if self.mask is not None:  # padding's conv inputs through the taps
            rest = rest + causal_taps(self.conv_input * (1 - self.mask[..., None]), self.conv_weight)
        rest = mix_heads(self.mixing, self.ratio * rest, heads)
        rest = F.linear(rest * self.scale, self.out_proj.weight.float())
        if self.out_proj.bias is not None:
            rest = rest + self.out_proj.bias.float()
        return rest


#: Positions per chunk of the delta rule's chunked mixing (:func:`delta_rule_mixing`).
DELTA_RULE_CHUNK = 64


def delta_rule_mixing(query: torch.Tensor, key: torch.Tensor, beta: torch.Tensor, log_decay: torch.Tensor,
                      chunk: int = DELTA_RULE_CHUNK) -> torch.Tensor:  # fmt: skip
    """The gated delta rule's mixing ``W`` ``(B, H, T, T)`` (``o_t = Σ_s W_ts v_s``) from its queries and keys
    ``(B, H, T, dk)``, steps ``β`` ``(B, H, T)`` and log decays ``log α`` ``(B, H, T)``, chunk by chunk of ``chunk``
    positions, as the chunked kernels run the recurrence (after Yang et al., NeurIPS 2024), instead of one ``T × T``
    triangular solve (``T³`` per head).

    Within a chunk (``γ_t = Π α`` from its start, ``Γ_ts = γ_t / γ_s``) the delta rule's pseudo-values
    ``ũ = Tm (V − diag(γ) K S_inᵀ)``, ``Tm = (I + A)⁻¹ diag(β)``, ``A_ts = β_t Γ_ts (k_t · k_s)`` (``s < t``), give the
    chunk's own block ``L Tm`` (``L = tril(Q Kᵀ ⊙ Γ)``) and, for the state ``S_in = Σ_s v_s m_sᵀ`` the earlier tokens
    left (``m_s``: token ``s``'s key trace, ``dk``), the rows' effective queries ``E = diag(γ) Q − L Tm diag(γ) K``:
    ``W_ts = m_s · e_t``. The traces then move through the chunk, ``m ← P m`` with
    ``P = γ_end I − (diag(γ_end/γ) K)ᵀ Tm diag(γ) K``, and the chunk's tokens add theirs, ``(diag(γ_end/γ) K)ᵀ Tm``.
    Per chunk: one ``C × C`` solve, ``C × dk × T`` for the earlier columns and ``dk² × T`` for the traces: ``T² dk``
    overall instead of ``T³``; equal to the whole solve to rounding (``tests/test_hybrids.py``). Decays enter only as
    ratios ``≤ 1`` or as ``γ ≤ 1``, never divided."""
    batch, heads, length, width = query.shape
    mixing = query.new_zeros(batch, heads, length, length)
    traces = query.new_zeros(batch, heads, width, length)  # column s: token s's key trace at the chunk's start
    identity = torch.eye(width, dtype=query.dtype, device=query.device)
    for start in range(0, length, chunk):
        rows = slice(start, min(start + chunk, length))
        q, k, b, g = query[:, :, rows], key[:, :, rows], beta[:, :, rows], log_decay[:, :, rows].cumsum(-1)
        size = g.shape[-1]
        causal = torch.ones(size, size, dtype=torch.bool, device=query.device).tril()
        ratio = (g[..., :, None] - g[..., None, :]).masked_fill(~causal, float("-inf")).exp()  # Γ, 0 above
        overlap = (k @ k.transpose(-1, -2)) * ratio * b[..., :, None]
        unit = overlap.tril(-1) + torch.eye(size, dtype=query.dtype, device=query.device)
        pseudo = torch.linalg.solve_triangular(unit, torch.diag_embed(b), upper=False, unitriangular=True)  # Tm
        local = ((q @ k.transpose(-1, -2)) * ratio) @ pseudo  # L Tm
        gamma = g.exp()[..., None]  # (B, H, C, 1)
        mixing[:, :, rows, rows] = local
        carried = ((g[..., -1:] - g).exp()[..., None] * k).transpose(-1, -2) @ pseudo  # the chunk's traces
        if start:  # the earlier tokens: read by the chunk's rows, then carried through it
            effective = gamma * q - local @ (gamma * k)  # E (B, H, C, dk)
            mixing[:, :, rows, :start] = effective @ traces[..., :start]
            through = gamma[..., -1:, :] * identity - carried @ (gamma * k)  # P (B, H, dk, dk)
            traces[..., :start] = through @ traces[..., :start]
        traces[..., rows] = carried
    return mixing


def scan_values_and_gate(projected: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A selective scan's input projection split into its value and gate channels: Mamba's two halves, or Zamba's
    rows interleaved channel by channel (``interleaved``: value ``2c``, gate ``2c + 1``)."""
    return (projected[..., 0::2], projected[..., 1::2]) if interleaved else projected.chunk(2, dim=-1)


def causal_taps(values: torch.Tensor, taps: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """A causal depthwise convolution of ``(..., T, C)`` by ``taps`` ``(C, K)`` (and ``bias`` ``(C,)``): padded by
    ``K − 1``, cut to ``T``; position ``t`` reads the value of ``t − d`` through tap ``K − 1 − d``."""
    length, channels = values.shape[-2:]
    flat = values.reshape(-1, length, channels).transpose(1, 2)
    out = F.conv1d(flat, taps[:, None], bias, padding=taps.shape[-1] - 1, groups=channels)[..., :length]
    return out.transpose(1, 2).reshape(values.shape)


def _causal_conv(conv: torch.nn.Conv1d, inputs: torch.Tensor) -> torch.Tensor:
    """A module's causal depthwise convolution of ``(B, T, C)`` (:func:`causal_taps` with its taps and bias)."""
    return causal_taps(inputs, conv.weight.squeeze(1), conv.bias)


def _silu_ratio(pre: torch.Tensor) -> torch.Tensor:
    """``silu(u) / u``, the activation frozen as a slope at the true pre-activation (its limit 0.5 at ``u = 0``)."""
    return torch.where(pre == 0, torch.full_like(pre, 0.5), F.silu(pre) / pre)


def _elapsed(total: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``total_t − total_s`` ``(..., T, T)`` of running sums ``total`` ``(..., T)`` (the sum over ``r = s+1..t``), 0
    above the diagonal, and the causal mask ``s ≤ t``."""
    length = total.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=total.device).tril()
    return (total[..., :, None] - total[..., None, :]).masked_fill(~causal, 0.0), causal


def _with_skip(mixing: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
    """A mixing ``(B, H, T, T)`` with a per-head (or per-channel) skip ``D`` ``(H,)`` added on its diagonal."""
    batch, heads, length, _ = mixing.shape
    return mixing + torch.diag_embed(skip.float()[None, :, None].expand(batch, heads, length))


def inverse_rms(hidden: torch.Tensor, eps: float, group: int) -> torch.Tensor:
    """``1 / rms`` of each group of ``group`` consecutive channels of ``hidden`` ``(..., I)``, per channel: a gated
    RMS norm's statistics."""
    grouped = hidden.unflatten(-1, (-1, group))
    return torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + eps).expand_as(grouped).flatten(-2)


def padding_mask(hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """The padding mask ``(B, T)`` in ``hidden``'s dtype (all ones without one): the modules zero padded inputs."""
    if attention_mask is None:
        return torch.ones(hidden.shape[:2], dtype=hidden.dtype, device=hidden.device)
    return attention_mask.to(hidden.dtype)


def through_taps(mixing: torch.Tensor, ratio: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
    """``κ_{t,j,c} = Σ_{d<K} W^{h(c)}_{t,j+d} ρ_{j+d,c} w_{c,K−1−d}`` ``(B, R, T, I)``: a per-head mixing
    ``(B, H, R, T)`` (rows ``R`` of it) read through a causal depthwise convolution's taps ``(I, K)`` and the frozen
    activation ratio ``(B, T, I)``, the channels of a head consecutive. Each tap adds its term in place, the head's
    mixing broadcast over its channels (no copy of it per channel, no temporary of the kernel's size)."""
    batch, length, inner = ratio.shape
    heads, size = mixing.shape[1], taps.shape[1]
    kernel = ratio.new_zeros(batch, mixing.shape[2], length, heads, inner // heads)
    per_head = mixing.permute(0, 2, 3, 1)[..., None]  # (B, R, S, H, 1)
    for offset in range(min(size, length)):  # s = j + offset reads token j through tap K − 1 − offset
        factor = (ratio[:, offset:] * taps[:, size - 1 - offset]).unflatten(-1, (heads, -1))  # (B, T − offset, H, P)
        kernel[:, :, : length - offset].addcmul_(per_head[:, :, offset:], factor[:, None])
    return kernel.flatten(-2)


def deltanet_projections(mixer, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A Gated DeltaNet layer's ``query, key, value`` ``(B, T, heads, dim)``, gate ``z`` ``(B, T, H, dv)``, ``b`` and
    ``a`` ``(B, T, H)`` from its input, whichever way it lays out its projections (Qwen3-Next's fused and interleaved
    ``in_proj_qkvz`` / ``in_proj_ba``, Qwen3.5's four)."""
    if hasattr(mixer, "in_proj_qkvz"):
        return mixer.fix_query_key_value_ordering(mixer.in_proj_qkvz(hidden), mixer.in_proj_ba(hidden))
    query, key, value = mixer.in_proj_qkv(hidden).split([mixer.key_dim, mixer.key_dim, mixer.value_dim], dim=-1)
    parts, sizes = (query, key, value, mixer.in_proj_z(hidden)), (mixer.head_k_dim,) * 2 + (mixer.head_v_dim,) * 2
    split = [x.unflatten(-1, (-1, size)) for x, size in zip(parts, sizes, strict=True)]
    return (*split, mixer.in_proj_b(hidden), mixer.in_proj_a(hidden))


def deltanet_value_weight(mixer) -> torch.Tensor:
    """A Gated DeltaNet layer's value rows of its input projection ``(value channels, d)``, in the order
    :func:`deltanet_projections` gives the values: Qwen3.5's after its queries' and keys'; Qwen3-Next's interleaved per
    key head, found by its own reordering run on the output channels' indices."""
    if not hasattr(mixer, "in_proj_qkvz"):
        return mixer.in_proj_qkv.weight[2 * mixer.key_dim :]
    fused = mixer.in_proj_qkvz.weight
    index = torch.arange(fused.shape[0], dtype=torch.float64, device=fused.device)[None, None]
    ba = index.new_zeros(1, 1, mixer.in_proj_ba.out_features)
    return fused[mixer.fix_query_key_value_ordering(index, ba)[2].flatten().long()]


def attention_inputs(attention, hidden: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor],
                     gated: bool = False) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """Softmax attention's queries ``(B, H, T, D)`` and keys ``(B, H_kv, T, D)`` (after their norms, a key multiplier
    where the module has one, and the rotary embedding), values ``(B, T, H_kv, D)`` and, ``gated`` (Qwen3-Next's),
    the output gate's logits ``g`` ``(B, T, H·D)`` from the query projection's second half (else None), as its module
    computes them (with the graph: AttnLRP's rules run on them)."""
    rows, size = hidden.shape[:-1], attention.head_dim
    query = attention.q_proj(hidden).view(*rows, -1, 2 * size if gated else size)
    query, gate = query.chunk(2, dim=-1) if gated else (query, None)
    key = attention.k_proj(hidden).view(*rows, -1, size)
    if hasattr(attention, "q_norm"):
        query, key = attention.q_norm(query), attention.k_norm(key)
    query, key = query.transpose(1, 2), key.transpose(1, 2) * getattr(attention, "key_multiplier", 1.0)
    value = attention.v_proj(hidden).view(*rows, -1, size)
    rotate = sys.modules[type(attention).__module__].apply_rotary_pos_emb  # the family's own (partial rotary)
    query, key = rotate(query, key, *position_embeddings)
    return query, key, value, None if gate is None else gate.reshape(*rows, -1)


def mamba2_projected(mixer, hidden: torch.Tensor) -> torch.Tensor:
    """A Mamba-2 mixer's input projection of ``hidden`` (gate, conv input, raw steps), with Falcon-H1's multipliers
    where the mixer has them (``ssm_in_multiplier`` on its input, ``mup_vector`` on the projection's channels)."""
    projected = mixer.in_proj(hidden * getattr(mixer, "ssm_in_multiplier", 1.0))
    multipliers = getattr(mixer, "mup_vector", None)
    return projected if multipliers is None else projected * multipliers


def row_blocks(rows: slice, batch: int, length: int, inner: int, block_elements: int) -> list[slice]:
    """The positions ``rows`` of ``length`` in consecutive blocks whose kernel ``(batch, r, length, inner)`` holds
    at most ``block_elements`` (one empty block for no rows)."""
    first, stop, _ = rows.indices(length)
    step = max(1, block_elements // max(1, batch * length * inner))
    return [slice(start, min(start + step, stop)) for start in range(first, stop, step)] or [slice(first, first)]


@dataclass
class Projection:
    """A linear map as its ``weight`` ``(out, in)`` and ``bias`` (float32): a branch's output projection times the
    number its block multiplies the branch's output by."""

    weight: torch.Tensor
    bias: torch.Tensor | None

    @classmethod
    def scaled(cls, linear: torch.nn.Module, factor: float) -> Projection:
        bias = None if linear.bias is None else linear.bias.float() * factor
        return cls(linear.weight.float() * factor, bias)


@dataclass
class ParallelMixing:
    """Parallel mixers frozen at a traced pass (:meth:`FrozenMixer.parallel`), read through :class:`FrozenMixer`'s
    interface: a token's part is the sum of its parts in the branches (each branch exact, so the sum is), its head
    parts every branch's heads in turn, what no token carries and value zeroing's re-run the branches' sums (a
    token's value input zeroed in every branch). Rollout's and flow's map (**our extension**): the branches' maps
    averaged with each branch's channels as its weight, so that it is the mean over every channel of the block's
    mixers (a row still sums to 1).

    Attributes:
        branches: Each branch frozen (its output factor in its projection, its input factor in its value map).
    """

    branches: list[FrozenMixer]
    per_head: bool = False

    @property
    def heads(self) -> int:
        return sum(branch.heads for branch in self.branches)

    @property
    def positions(self) -> int:
        return self.branches[0].positions

    def token_parts(self, rows: slice = slice(None), keys: slice = slice(None)) -> torch.Tensor:
        return sum(branch.token_parts(rows, keys) for branch in self.branches)

    def head_parts(self, rows: slice = slice(None), keys: slice = slice(None)) -> torch.Tensor:
        return torch.cat([branch.head_parts(rows, keys) for branch in self.branches], dim=2)

    def row_blocks(self, rows: slice = slice(None), block_elements: int = 2**24) -> list[slice]:
        batch, length = self.branches[0].conv_input.shape[:2]
        inner = sum(branch.conv_input.shape[-1] for branch in self.branches)
        return row_blocks(rows, batch, length, inner, block_elements)

    def logit_parts(self, direction: torch.Tensor, rows: slice = slice(None), per_head: bool = False,
                    block_elements: int = 2**24) -> torch.Tensor:  # fmt: skip
        found = [branch.logit_parts(direction, rows, per_head, block_elements) for branch in self.branches]
        return torch.cat(found, dim=1) if per_head else sum(found)

    def map_rows(self, rows: slice = slice(None)) -> torch.Tensor:
        channels = [branch.conv_input.shape[-1] for branch in self.branches]
        maps = [branch.map_rows(rows) * count for branch, count in zip(self.branches, channels, strict=True)]
        return sum(maps) / sum(channels)

    def totals(self, rows: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor]:
        found = [branch.totals(rows) for branch in self.branches]
        return sum(total for total, _ in found), sum(own for _, own in found)

    def zeroed_outputs(self, keys: slice, rows: slice = slice(None)) -> torch.Tensor:
        return sum(branch.zeroed_outputs(keys, rows) for branch in self.branches)

    def component_outputs(self, components: torch.Tensor) -> torch.Tensor:
        return sum(branch.component_outputs(components) for branch in self.branches)

    def unattributed(self) -> torch.Tensor:
        return sum(branch.unattributed() for branch in self.branches)


@dataclass
class SharedAttentionMixing:
    r"""A block whose mixer reads a shared attention block's output (Zamba 2's and Zamba's hybrid blocks,
    :class:`~..specs.base.SharedAttention`) frozen at a traced pass, read through :class:`FrozenMixer`'s interface
    (**our extension** throughout: neither Zamba paper nor any method's paper treats it). With the three norms'
    statistics, the attention probabilities, the FFN's gate ``act(x W_g)`` and the mixer frozen, the block's mixer
    output is linear in its input ``x`` and the embeddings ``e``, so token ``j``'s part is exact::

        a_k(j) = Σ_h α^h_kj W^h_O v^h_j,      v_j = W_V (s₁_j ⊙ [x_j; e_j])
        s_k(j) = P W_down (G_k ⊙ W_up (s₂_k ⊙ a_k(j)))                 (G_k: the gate, frozen)
        part_t(j) = mixer_t(s₃ ⊙ (δ_kj x_j + s_k(j)) over k)           (the frozen mixer on those inputs)

    The embeddings' path is credited to the token, as a block input's own embedding is (the first block's input is
    the embeddings: DecompX reads ``e``'s components there). Forming a part costs a sum over the positions between
    the token and the row (``T³`` a layer): short inputs. Rollout's and flow's map is the mixer's map times the
    shared attention's head-averaged probabilities with the residual as rollout treats one, ``(I + Ā)/2`` (the
    mixer's input is ``x`` plus the attention's path). Value zeroing is refused: zeroing a token's value in the
    shared attention changes the mixer's own input, and with it its steps and state projections.

    Attributes:
        mixer: The mixer frozen at its normed input.
        probs: The shared attention's probabilities ``(B, H, T, T)``.
        up_heads: Each token's values through each head's rows of the attention's output projection and the
            FFN's gained up-projection, ``U diag(γ₂) W^h_O v^h_j`` ``(B, T, H, F)`` (the norm's per-position scale
            ``ffn_rms`` ``(B, T, 1)`` apart): a token's part of the FFN's hidden units at row ``k`` is
            ``r_k Σ_h α^h_kj u^h_j``, ``H × F`` a pair instead of ``d × F``.
        value_weight: ``W_V`` ``(H·P, 2d)`` (the call's adapter in it); ``out_weight``: ``W_O`` ``(d, H·P)``.
        in_scale: ``s₁`` ``(B, T, 2d)``: the attention norm's weight over each position's RMS.
        ffn_scale: ``s₂`` ``(B, T, d)``; ``gate``: ``G`` ``(B, T, F)``; ``up``, ``down``, ``projection``: the
            weights ``(F, d)``, ``(d, F)``, ``(d, d)``.
        mixer_scale: ``s₃`` ``(B, T, d)``: the mixer's norm's weight over the RMS of ``x + s``.
        bias: What no token carries in the mixer's input before its norm, ``(B, T, d)`` (the FFN's biases through
            the frozen gate and the projection).
        hidden: The block's input ``x`` ``(B, T, d)``; ``embeddings``: ``e`` ``(B, T, d)``.
    """

    mixer: FrozenMixer
    probs: torch.Tensor
    up_heads: torch.Tensor
    ffn_rms: torch.Tensor
    value_weight: torch.Tensor
    out_weight: torch.Tensor
    in_scale: torch.Tensor
    ffn_scale: torch.Tensor
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    projection: torch.Tensor
    mixer_scale: torch.Tensor
    bias: torch.Tensor
    hidden: torch.Tensor
    embeddings: torch.Tensor
    per_head: bool = False

    @classmethod
    def freeze(cls, module, hidden: torch.Tensor, mixer_mask: torch.Tensor | None,
               position_embeddings: tuple[torch.Tensor, torch.Tensor] | None, embeddings: torch.Tensor,
               attention_mask: torch.Tensor | None) -> SharedAttentionMixing:  # fmt: skip
        attention, ffn = module.attention, module.ffn
        joined = torch.cat([hidden, embeddings], dim=-1)
        normed = module.attention_norm(joined)
        rows, size = hidden.shape[:-1], attention.head_dim
        query = module.query(normed).view(*rows, -1, size).transpose(1, 2)
        key = module.key(normed).view(*rows, -1, size).transpose(1, 2)
        if module.rotary:
            rotate = sys.modules[type(attention).__module__].apply_rotary_pos_emb
            query, key = rotate(query, key, *position_embeddings)
        probs, _ = attention_probs(attention, query, key, attention_mask)
        value_weight = module.value.weight.float()
        out_weight = attention.o_proj.weight.float()
        heads = probs.shape[1]
        in_scale = freeze_norm(module.attention_norm, joined).factor()
        values = (joined.float() * in_scale) @ value_weight.T  # (B, T, H_kv·P)
        values = values.unflatten(-1, (-1, size)).repeat_interleave(attention.num_key_value_groups, dim=2)
        values = torch.einsum("bkhp,dhp->bkhd", values, out_weight.unflatten(-1, (heads, size)))
        attended = torch.einsum("bhqk,bkhd->bqd", probs, values)
        ffn_norm = freeze_norm(ffn.norm, attended)
        ffn_scale = ffn_norm.factor()
        normed_attended = attended * ffn_scale
        gate = ffn.activation(ffn.w_gate(normed_attended.to(hidden.dtype))).float()
        up, down = ffn.w_in.weight.float(), ffn.w_out.weight.float()
        projection = module.projection.weight.float()
        bias = torch.zeros_like(attended)
        if ffn.w_in.bias is not None:
            bias = bias + (gate * ffn.w_in.bias.float()) @ down.T @ projection.T
        if ffn.w_out.bias is not None:
            bias = bias + ffn.w_out.bias.float() @ projection.T
        side = through_gated_ffn(normed_attended, gate, up, down, projection) + bias
        mixed_input = hidden.float() + side
        mixer_spec = module.mixer
        mixer_scale = freeze_norm(mixer_spec.norm, mixed_input).factor()
        frozen = getattr(FrozenMixer, mixer_spec.kind)(mixer_spec.module, (mixed_input * mixer_scale).to(hidden.dtype),
                                                       mixer_mask)  # fmt: skip
        up_heads = values @ (up * ffn_norm.gain(up.shape[1])).T  # (B, T, H, F): U diag(γ₂) W^h_O v^h_j
        return cls(frozen, probs, up_heads, ffn_norm.inv_scale, value_weight, out_weight, in_scale, ffn_scale,
                   gate, up, down, projection, mixer_scale, bias, hidden.float(), embeddings.float())  # fmt: skip

    @property
    def heads(self) -> int:
        return self.mixer.heads

    @property
    def positions(self) -> int:
        return self.mixer.positions

    def _mixer_inputs(self, hidden: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        """The mixer's normed inputs ``(B, T, K, d)`` from components ``(B, T, K, d)`` of the block input (which also
        reaches the mixer directly) and of the embeddings."""
        joined = torch.cat([hidden, embeddings], dim=-1) * self.in_scale[:, :, None]
        values = (joined @ self.value_weight.T).unflatten(-1, (-1, self.out_weight.shape[1] // self.heads_attn))
        values = values.repeat_interleave(self.heads_attn // values.shape[-2], dim=-2)  # (B, T, K, H, P)
        heads = torch.einsum("btkhp,dhp->btkhd", values, self.out_weight.unflatten(-1, (self.heads_attn, -1)))
        attended = torch.einsum("bhqt,btkhd->bqkd", self.probs, heads)
        side = through_gated_ffn(attended * self.ffn_scale[:, :, None], self.gate[:, :, None], self.up, self.down,
                                 self.projection)  # fmt: skip
        return (hidden + side) * self.mixer_scale[:, :, None]

    @property
    def heads_attn(self) -> int:
        """The shared attention's query heads."""
        return self.probs.shape[1]

    def _token_inputs(self, keys: slice) -> torch.Tensor:
        """Each token of ``keys``'s part of the mixer's normed input ``(B, T, K, d)``: its own input at its
        position, and its value through the shared block at every later position (token ``j``'s values reach row
        ``k`` as ``α_kj`` times them: no product over the other tokens)."""
        batch, length, width = self.hidden.shape
        first, stop, _ = keys.indices(length)
        count = stop - first
        found = self.hidden.new_zeros(batch, length, count, width)
        hidden = torch.einsum("bhqk,bkhf->bqkf", self.probs[:, :, first:, first:stop], self.up_heads[:, first:stop])
        hidden.mul_((self.ffn_rms[:, first:] * self.gate[:, first:])[:, :, None])
        found[:, first:] = (hidden @ self.down.T) @ self.projection.T
        columns = torch.arange(count, device=found.device)
        found[:, first + columns, columns] += self.hidden[:, first:stop]
        return found.mul_(self.mixer_scale[:, :, None])

    def _all_parts(self) -> torch.Tensor:
        """Every token's part of every position's output ``(B, T, T, d)``, computed once per frozen block (by blocks
        of tokens whose intermediates hold at most 2²⁶ elements) and read by every tile."""
        cached = vars(self).get("_parts")
        if cached is None:
            batch, length, width = self.hidden.shape
            widest = max(self.gate.shape[-1], self.mixer.conv_input.shape[-1], width)
            step = max(1, 2**26 // max(1, batch * length * widest))
            cached = self.hidden.new_empty(batch, length, length, width)
            for start in range(0, length, step):
                keys = slice(start, min(start + step, length))
                cached[:, :, keys] = self.mixer.component_outputs(self._token_inputs(keys), first=start)
            self._parts = cached
        return cached

    def token_parts(self, rows: slice = slice(None), keys: slice = slice(None)) -> torch.Tensor:
        return self._all_parts()[:, rows, keys].clone()

    def head_parts(self, rows: slice = slice(None), keys: slice = slice(None)) -> torch.Tensor:
        first = keys.indices(self.positions)[0]
        found = self.mixer.component_outputs(self._token_inputs(keys), per_head=True, first=first)
        return found[:, rows].transpose(2, 3)

    def row_blocks(self, rows: slice = slice(None), block_elements: int = 2**24) -> list[slice]:
        return self.mixer.row_blocks(rows, block_elements)

    def logit_parts(self, direction: torch.Tensor, rows: slice = slice(None), per_head: bool = False,
                    block_elements: int = 2**24) -> torch.Tensor:  # fmt: skip
        direction = direction.to(self.hidden.dtype)
        if per_head:
            return torch.einsum("brd,brhkd->bhrk", direction, self.head_parts(rows))
        return torch.einsum("brd,brkd->brk", direction, self._all_parts()[:, rows])

    def map_rows(self, rows: slice = slice(None)) -> torch.Tensor:
        averaged = self.probs.mean(1)  # (B, T, T)
        eye = torch.eye(averaged.shape[-1], dtype=averaged.dtype, device=averaged.device)
        return self.mixer.map_rows(rows) @ ((eye + averaged) / 2)[:, None]

    def totals(self, rows: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor]:
        parts = self._all_parts()[:, rows]
        first, stop, _ = rows.indices(self.positions)
        positions = torch.arange(first, stop, device=parts.device)
        return parts.sum(2), parts[:, positions - first, positions]

    def zeroed_outputs(self, keys: slice, rows: slice = slice(None)) -> torch.Tensor:
        raise ValueError("Value zeroing of a block whose mixer reads a shared attention block (Zamba, Zamba 2) has no "
                         "closed form: zeroing a token's value changes the mixer's own input, and with it its steps "
                         "and state projections. Use alti, alti_logit, decompx, globenc, attention_norm, "
                         "attention_rollout or attn_lrp.")  # fmt: skip

    def component_outputs(self, components: torch.Tensor, embedded: torch.Tensor | None = None) -> torch.Tensor:
        """DecompX through the block's mixer: the output's components ``(B, T, K, d)`` from components of its input
        ``(B, T, K, d)`` and of the embeddings ``embedded`` (the first block's input's).

        Raises:
            ValueError: No components of the embeddings.
        """
        if embedded is None:
            raise ValueError("A block whose mixer reads a shared attention block needs the embeddings' components.")
        components = components.float()
        return self.mixer.component_outputs(self._mixer_inputs(components, embedded.float()))

    def unattributed(self) -> torch.Tensor:
        """What no token carries: the mixer's own (its biases, padding's inputs) and the shared block's biases
        through the mixer."""
        return (
            self.mixer.unattributed()
            + self.mixer.component_outputs((self.bias * self.mixer_scale)[:, :, None])[:, :, 0]
        )


def through_gated_ffn(normed: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor,
                      projection: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """``P W_down (G ⊙ W_up x)``: (parts of) a shared attention block's normed output through its gated FFN, its gate
    ``G`` held, and the projection into the mixer's input (weights ``(out, in)``)."""
    return ((normed @ up.T) * gate) @ down.T @ projection.T


def attention_probs(attention, query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Softmax attention's probabilities ``(B, H, T, T)`` in float32 from queries and keys (grouped keys shared by
    their query heads) under the mask the module was given (additive, boolean, or None: causal), and where a query
    may look ``(B or 1, 1, T, T)``. A row that may look nowhere gets no probabilities."""
    key = key.repeat_interleave(attention.num_key_value_groups, dim=1)
    scores = (query.float() @ key.float().transpose(-1, -2)) * attention.scaling
    length = scores.shape[-1]
    if attention_mask is None:
        allowed = torch.ones(length, length, dtype=torch.bool, device=scores.device).tril()[None, None]
    elif attention_mask.dtype == torch.bool:
        allowed = attention_mask[..., -length:]
    else:
        scores = scores + attention_mask[..., -length:].float()
        allowed = attention_mask[..., -length:] > torch.finfo(attention_mask.dtype).min / 2
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return probs.nan_to_num(0.0), allowed


def mix_heads(mixing: torch.Tensor, inputs: torch.Tensor, heads: int) -> torch.Tensor:
    """``y_t = Σ_s M̃^h_{ts} x_s`` per head: ``mixing`` ``(B, H, T, T)``, ``inputs`` ``(B, T, I)`` → ``(B, T, I)``."""
    per_head = inputs.unflatten(-1, (heads, -1))  # (B, T, H, P)
    return torch.einsum("bhts,bshp->bthp", mixing, per_head).flatten(-2)


def frozen_mixer(spec: MixerSpec, record: MixerTrace) -> FrozenMixer | ParallelMixing:
    """The token mixer of one traced layer frozen at its pass (:class:`FrozenMixer`, by ``spec.kind``), held in the
    trace's one slot: reading the layers one after another holds one layer's mixing matrices at a time."""
    slot = record.slot
    if slot.get("owner") is not record:
        slot.clear()  # the previous layer's are freed before this one's are computed
        with torch.no_grad():
            frozen = getattr(FrozenMixer, spec.kind)(spec.module, record.input, record.mask, **record.call)
        slot.update(owner=record, frozen=frozen)
    return slot["frozen"]

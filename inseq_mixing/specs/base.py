"""Architecture specs: where the pieces of a Transformer block live in each supported model family.

A spec holds references to the model's own submodules, so that the method math can read weights and re-apply the
position-wise parts of a block (norms, FFN) exactly as the architecture computes them.
"""

import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
from torch import nn


class UnsupportedModelError(ValueError):
    """Raised when a model's architecture has no spec."""


class BranchLayout:
    """Where the norms of a residual branch sit, as data: ``y = post_norm(x + out_norm(f(in_norm(x))))``, each norm
    the identity when absent.

    Pre-LN blocks have an ``in_norm``, post-LN blocks a ``post_norm``; sandwich blocks (Gemma 2 / 3) add an
    ``out_norm`` to the pre-LN layout, and OLMo-2 has an ``out_norm`` only. Norms inside the branch's module (q/k
    norms) touch queries and keys only, so they shape the recorded attention and are no part of the layout. Parallel
    branches (GPT-NeoX) are flagged on the FFN (:attr:`FFNSpec.parallel`). Every method reads the layout through
    these properties.
    """

    norm: nn.Module | None
    pre_norm: bool
    out_norm: nn.Module | None

    @property
    def in_norm(self) -> nn.Module | None:
        """The norm on the branch input, or None."""
        return self.norm if self.pre_norm else None

    @property
    def post_norm(self) -> nn.Module | None:
        """The norm after the residual sum, or None."""
        return None if self.pre_norm else self.norm


@dataclass(frozen=True)
class LatentValues:
    """Values decompressed from a per-token latent (DeepSeek's multi-head latent attention): the latent
    ``c_j = norm(x̂_j W_down)`` (an RMSNorm on a down-projection of the normalised block input), each head's value
    ``v^h_j = c_j W^h_up`` read from the attention's ``value_proj`` (the up-projection, values at ``value_slice``).

    Attributes:
        down: The down-projection to the latent (the latent's outputs of a fused projection: a :class:`SlicedLinear`).
        norm: The latent's norm; the trace records its input, and the methods freeze its statistics there.
    """

    down: nn.Module
    norm: nn.Module


@dataclass(frozen=True)
class AttentionSpec(BranchLayout):
    """One multi-head attention sub-block (self- or cross-attention) and its residual branch.

    Attributes:
        module: The attention module. Its forward returns a tuple whose first element is the attention output (after
            the output projection) and whose element ``probs_index`` holds the attention probabilities.
        value_proj: The module whose output holds the value vectors ``v_j = x̂_j W_V + b_V``.
        value_slice: Slice (or index tensor, for per-head interleaved layouts) of ``value_proj``'s last output
            dimension holding the values (fused QKV projections).
        out_proj: The output projection module (its weight and bias read from it at every use, :attr:`out_weight`,
            :attr:`out_bias`: a dispatched model's offloaded weights are other tensors when loaded).
        num_heads: Number of query heads.
        num_kv_heads: Number of key/value heads (GQA: query head ``h`` reads KV head ``h // (H / H_kv)``).
        head_dim: Size of one head.
        norm: The layer norm of this sub-block, or None (OLMo-2: the attention reads the residual stream itself).
        pre_norm: True when the norm is applied to the sub-block input (pre-LN), False when it is applied after the
            residual sum (post-LN).
        probs_index: Index of the attention probabilities in the module's output tuple.
        out_norm: A norm applied to the attention output before the residual sum (Gemma 2's sandwich, OLMo-2), or
            None. The residual branch is ``y = x + out_norm(attn(norm(x)))`` (pre-LN) or
            ``y = norm(x + out_norm(attn(x)))`` (post-LN).
        output_module: Where the attention output is read when ``module``'s own first output is not it (BERT's and
            ALBERT's attention modules add the residual and normalise inside): the output projection, whose output
            is the attention output. None: ``module``'s first output.
        latent: Where values are decompressed from a latent (multi-head latent attention): ``value_proj`` then reads
            the latent, not the normalised block input. None: ``value_proj`` reads the normalised block input.
    """

    module: nn.Module
    value_proj: nn.Module
    value_slice: slice | torch.Tensor
    out_proj: nn.Module
    num_heads: int
    num_kv_heads: int
    head_dim: int
    norm: nn.Module | None
    pre_norm: bool
    probs_index: int = 1
    out_norm: nn.Module | None = None
    output_module: nn.Module | None = None
    latent: LatentValues | None = None

    @property
    def out_weight(self) -> torch.Tensor:
        """The output projection as an ``(in_features, out_features)`` matrix, ``in = num_heads * head_dim``."""
        return linear_in_out(self.out_proj)[0]

    @property
    def out_bias(self) -> torch.Tensor | None:
        """The output projection's bias, or None."""
        return linear_in_out(self.out_proj)[1]

    def value_weight(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The value projection as an ``(in_features, H_kv * head_dim)`` matrix and its bias."""
        return _as_in_out_matrix(self.value_proj, self.value_slice)

    def out_weight_per_head(self) -> torch.Tensor:
        """W_O split per head: ``(num_heads, head_dim, d_model)``."""
        return self.out_weight.reshape(self.num_heads, self.head_dim, -1)

    def kv_head_of_query_head(self) -> torch.Tensor:
        """Index of the KV head read by each query head."""
        group = self.num_heads // self.num_kv_heads
        return torch.arange(self.num_heads) // group


@dataclass(frozen=True)
class FFNSpec(BranchLayout):
    """The position-wise feed-forward sub-block.

    Plain FFNs compute ``w_out(activation(w_in(x)))``; gated ones (SwiGLU, gated-GELU) compute
    ``w_out(activation(w_gate(x)) * w_in(x))``.

    Attributes:
        forward: The FFN on its (normalised, for pre-LN) input, without the residual.
        norm: The layer norm of this sub-block, or None.
        pre_norm: Placement of ``norm`` (see :class:`AttentionSpec`).
        w_in: The first linear map (the linear branch of a gated FFN).
        w_out: The second linear map.
        activation: The element-wise activation.
        w_gate: The branch that goes through the activation in a gated FFN, else None.
        parallel: The FFN reads the block input, like the attention, instead of the attention sub-block's output;
            both branches add to the residual (GPT-NeoX's parallel residual: ``x + attn(ln₁ x) + ffn(ln₂ x)``).
        out_norm: A norm applied to the FFN output before the residual sum (see :class:`AttentionSpec`), or None.
        linear_activation: An element-wise map on a gated FFN's linear branch (zero at 0), or None (the identity);
            the branch is ``linear_activation(x W_in) + linear_offset`` (GPT-OSS's experts: ``clamp(·) + 1``).
        linear_offset: A constant added to the linear branch (split over the components like a bias).
    """

    forward: Callable[[torch.Tensor], torch.Tensor]
    norm: nn.Module | None
    pre_norm: bool
    w_in: nn.Module
    w_out: nn.Module
    activation: Callable[[torch.Tensor], torch.Tensor]
    w_gate: nn.Module | None = None
    parallel: bool = False
    out_norm: nn.Module | None = None
    linear_activation: Callable[[torch.Tensor], torch.Tensor] | None = None
    linear_offset: float = 0.0

    @property
    def is_gated(self) -> bool:
        return self.w_gate is not None

    @property
    def activations(self) -> tuple[Callable[[torch.Tensor], torch.Tensor], ...]:
        """The element-wise activations inside the sub-block."""
        return (self.activation,) + ((self.linear_activation,) if self.linear_activation is not None else ())

    def linear_branch(self, hidden: torch.Tensor) -> torch.Tensor:
        """A gated FFN's linear branch on ``x W_in`` (its map and offset applied)."""
        return linear_branch(hidden, self.linear_activation, self.linear_offset)

    @property
    def product_inputs(self) -> tuple[nn.Module, ...]:
        """Modules whose first input feeds both factors of a product (a gated FFN's ``activation(x W_g) ⊙ x W_in``)."""
        return (self.forward,) if self.is_gated else ()

    @property
    def constants(self) -> tuple[nn.Module, ...]:
        """Modules whose outputs the sub-block uses as per-token constants (a mixture's routing): none here."""
        return ()

    @property
    def own_gates(self) -> tuple[tuple[nn.Module, Callable[[torch.Tensor], torch.Tensor]], ...]:
        """Experts modules whose own gate function (``_apply_gate``) the spec writes with its modules (so that a
        method can hook them), with that function: none here."""
        return ()

    @property
    def routers(self) -> tuple[nn.Module, ...]:
        """Modules whose outputs the trace records as the sub-block's routing: none here."""
        return ()

    @property
    def dtype(self) -> torch.dtype:
        return self.w_out.weight.dtype

    def hidden_width(self, d_model: int) -> int:
        """Hidden units per position (the FFN's inner width)."""
        return self.w_out.weight.numel() // d_model


class NoFFN(nn.Module):
    """The FFN of a block that has none (Mamba's, Mamba-2's: the mixer's residual sum is the block's output), as the
    methods read it: it adds nothing. The model never calls it; the trace takes the block's output as its input."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(hidden)


def placed_like(module: nn.Module) -> dict:
    """The dtype and device of ``module``'s weight, for a map the spec adds beside it: where accelerate offloaded the
    weight (on the ``meta`` device between forward passes), its hook's execution device. A map left on ``meta`` would
    be read as garbage: ``F.linear`` of an input by an empty ``meta`` weight returns uninitialised memory."""
    weight = next(module.parameters())
    device = weight.device
    if device.type == "meta":
        device = torch.device(getattr(getattr(module, "_hf_hook", None), "execution_device", None) or "cpu")
    return {"dtype": weight.dtype, "device": device}


def no_ffn(width: int, like: nn.Module) -> FFNSpec:
    """The FFN sub-block of a block of ``width`` channels without one: :class:`NoFFN`, of no hidden units (its empty
    maps in the dtype of ``like``'s weight, on the device it runs on: :func:`placed_like`)."""
    place = placed_like(like)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # initialising an empty weight does nothing, and says so
        w_in, w_out = nn.Linear(width, 0, bias=False, **place), nn.Linear(0, width, bias=False, **place)
    return FFNSpec(forward=NoFFN(), norm=None, pre_norm=True, w_in=w_in, w_out=w_out, activation=nn.Identity())


def linear_branch(hidden: torch.Tensor, activation: Callable | None, offset: float) -> torch.Tensor:
    """``activation(hidden) + offset``, each where given: a gated FFN's linear branch on ``x W_in``."""
    if activation is not None:
        hidden = activation(hidden)
    return hidden + offset if offset else hidden


class ExpertLinear(nn.Module):
    """One expert's linear map in a mixture-of-experts module whose experts' weights are stacked in one parameter
    (transformers' fused experts: ``(experts, out, in)``, or ``(experts, in, out)`` where ``transposed``), as an
    ``nn.Linear`` of its own (``weight`` ``(out, in)``, a view of the stacked parameter read at every use).

    Args:
        experts: The module holding the stacked parameter.
        name: The parameter's name (``"gate_up_proj"``, ``"down_proj"``).
        expert: Which expert.
        outputs: Which of its outputs (the gate's or the linear branch's half of a fused ``gate_up_proj``).
        transposed: The parameter is stored ``(experts, in, out)``.
        bias: The name of the stacked biases ``(experts, out)``, or None.
    """

    def __init__(self, experts: nn.Module, name: str, expert: int, outputs: slice = slice(None),
                 transposed: bool = False, bias: str | None = None):  # fmt: skip
        super().__init__()
        self.experts = [experts]  # in a list: not a submodule of this view
        self.name, self.expert, self.outputs, self.transposed, self.bias_name = name, expert, outputs, transposed, bias

    @property
    def weight(self) -> torch.Tensor:
        stacked = getattr(self.experts[0], self.name)[self.expert]
        return stacked[:, self.outputs].T if self.transposed else stacked[self.outputs]

    @property
    def bias(self) -> torch.Tensor | None:
        if self.bias_name is None:
            return None
        return getattr(self.experts[0], self.bias_name)[self.expert][self.outputs]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(hidden, self.weight, self.bias)


@dataclass(frozen=True)
class MoESpec(BranchLayout):
    r"""A mixture-of-experts FFN sub-block (transformers' fused experts):
    :math:`y = \sum_{e \in \mathrm{top}_k(x)} g_e(x)\, \mathrm{FFN}_e(x) + \sigma(x w_s)\, \mathrm{FFN}_s(x)`, each
    expert a gated FFN ``down(act(gate(x)) ⊙ up(x))``, the shared expert (if any) a dense FFN, with a sigmoid gate
    where the family has one (Qwen2-MoE).

    The methods freeze the routing at the traced pass, as they freeze a norm's statistics: the trace records the
    router's weights and selected experts (:attr:`routers`), and each expert's FFN is decomposed as a dense FFN is
    (DecompX), its routing weight a per-token constant (DecompX, AttnLRP); value zeroing re-runs the whole block, so
    the routing of a corrupted pass is the model's own on that pass.

    Attributes:
        forward: The block's module ``(batch, positions, D) → (batch, positions, D)``.
        norm, pre_norm, out_norm: As in :class:`FFNSpec`.
        router: The router module: ``(N, D) → (logits, weights (N, k), experts (N, k))``.
        experts: The fused experts module (``gate_up_proj``, ``down_proj``, ``act_fn``; transformers' layout flags
            ``is_transposed`` and ``is_concatenated``).
        shared: The shared expert as a dense FFN (its norms None), or None.
        shared_gate: A linear map to one output whose sigmoid scales the shared expert, or None.
        activation: The experts' gate activation where they apply a gate of their own (GPT-OSS), as a module; None:
            ``experts.act_fn``.
        linear_activation, linear_offset: The experts' map and offset on the linear branch (see :class:`FFNSpec`).
    """

    forward: nn.Module
    norm: nn.Module | None
    pre_norm: bool
    router: nn.Module
    experts: nn.Module
    shared: FFNSpec | None = None
    shared_gate: nn.Module | None = None
    out_norm: nn.Module | None = None
    parallel: bool = False
    activation: nn.Module | None = None
    linear_activation: nn.Module | None = None
    linear_offset: float = 0.0

    @property
    def num_experts(self) -> int:
        return self.experts.gate_up_proj.shape[0]

    @property
    def top_k(self) -> int:
        return self.router.top_k

    @property
    def expert_width(self) -> int:
        """Hidden units of one expert (``down_proj``'s inputs)."""
        return self.experts.down_proj.shape[1 if getattr(self.experts, "is_transposed", False) else 2]

    @property
    def gate_slices(self) -> tuple[slice, slice]:
        """Where the gate and the linear branch lie in ``gate_up_proj``'s outputs: concatenated (the gate's half,
        then the linear branch's) or interleaved (``gate₀, up₀, gate₁, up₁, ...``)."""
        width = self.expert_width
        if getattr(self.experts, "is_concatenated", True):
            return slice(0, width), slice(width, 2 * width)
        return slice(0, None, 2), slice(1, None, 2)

    def expert(self, index: int) -> FFNSpec:
        """Expert ``index`` as a dense gated FFN whose linear maps are views of the stacked weights (and biases)."""
        experts = self.experts
        transposed = getattr(experts, "is_transposed", False)
        biased = getattr(experts, "has_bias", False)
        gate, linear = self.gate_slices

        def view(name: str, outputs: slice) -> ExpertLinear:
            return ExpertLinear(experts, name, index, outputs, transposed, f"{name}_bias" if biased else None)

        return FFNSpec(
            forward=experts,
            norm=None,
            pre_norm=True,
            w_in=view("gate_up_proj", linear),
            w_out=view("down_proj", slice(None)),
            activation=self.expert_activation,
            w_gate=view("gate_up_proj", gate),
            linear_activation=self.linear_activation,
            linear_offset=self.linear_offset,
        )

    @property
    def expert_activation(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return self.activation if self.activation is not None else self.experts.act_fn

    @property
    def activations(self) -> tuple[Callable[[torch.Tensor], torch.Tensor], ...]:
        own = (self.expert_activation,) + ((self.linear_activation,) if self.linear_activation is not None else ())
        return (*own, *(self.shared.activations if self.shared is not None else ()))

    @property
    def product_inputs(self) -> tuple[nn.Module, ...]:
        return (self.experts, *(self.shared.product_inputs if self.shared is not None else ()))

    @property
    def constants(self) -> tuple[nn.Module, ...]:
        return (self.router, *((self.shared_gate,) if self.shared_gate is not None else ()))

    @property
    def own_gates(self) -> tuple[tuple[nn.Module, Callable[[torch.Tensor], torch.Tensor]], ...]:
        return ((self.experts, self.apply_gate),) if self.activation is not None else ()

    def apply_gate(self, gate_up: torch.Tensor) -> torch.Tensor:
        """The experts' gate on ``gate_up_proj``'s outputs, from the spec's modules:
        ``activation(gate) ⊙ (linear_activation(up) + linear_offset)``."""
        gate, linear = self.gate_slices
        branch = linear_branch(gate_up[..., linear], self.linear_activation, self.linear_offset)
        return self.expert_activation(gate_up[..., gate]) * branch

    @property
    def routers(self) -> tuple[nn.Module, ...]:
        return (self.router,)

    @property
    def dtype(self) -> torch.dtype:
        return self.experts.down_proj.dtype

    def hidden_width(self, d_model: int) -> int:
        """Hidden units one position runs through: its ``k`` experts' and the shared expert's."""
        return self.expert_width * self.top_k + (self.shared.hidden_width(d_model) if self.shared is not None else 0)


def check_experts(block: nn.Module, own_gate: bool = False) -> None:
    """Refuse a mixture whose fused experts are outside :class:`MoESpec`'s reading; ``own_gate``: the spec names the
    experts' own gate function (:attr:`MoESpec.activation`).

    Raises:
        UnsupportedModelError: Naming the block and what is outside the reading.
    """
    experts = block.experts
    default_gate = getattr(getattr(type(experts), "_apply_gate", None), "__name__", None) == "_default_apply_gate"
    problem = None
    if not getattr(experts, "has_gate", True):
        problem = "its experts are not gated"
    elif not default_gate and not own_gate:
        problem = "its experts apply a gate function of their own, which no spec names"
    if problem is not None:
        raise UnsupportedModelError(f"{type(block).__name__} cannot be decomposed here: {problem}.")


class FirstOutput(nn.Module):
    """A module whose forward returns a tuple (GPT-OSS's MLP: its output and the router's scores), seen through its
    first output."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.wrapped = [module]  # in a list: not a submodule

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.wrapped[0](hidden)[0]


#: The token mixers a :class:`MixerSpec` can name, each written as a mixing matrix by
#: :class:`~inseq_mixing.methods.mixers.FrozenMixer`'s constructor of that name.
MIXER_KINDS = ("mamba", "mamba_heads", "mamba2", "gated_deltanet", "lfm2", "gated_attention", "attention", "parallel",
               "shared_attention", "none")  # fmt: skip


@dataclass(frozen=True)
class MixerSpec(BranchLayout):
    """A token mixer that is not attention (a state-space or linear-attention layer, a short convolution), or softmax
    attention whose output is gated per position (Qwen3-Next's: a token's part is no longer a probability times its
    value's projection, so it is read as a mixer), in the place of a block's self-attention
    (``y = x + module(in_norm(x))`` in a pre-norm block).

    Attributes:
        module: The mixer; the trace records its input, its ``attention_mask``, its ``position_embeddings`` (where it
            is given them: attention's rotary ones) and its output.
        kind: How it is written as an exact mixing matrix (:data:`MIXER_KINDS`).
        num_heads: Its mixing matrices per pair of positions: Mamba-2's and Gated DeltaNet's heads, Mamba's channels,
            1 for a short convolution, the query heads of gated attention.
        norm: The branch's norm; ``pre_norm``: on its input (else after the residual sum).
        out_norm: A norm on the mixer's output, or None.
    """

    module: nn.Module
    kind: str
    num_heads: int
    norm: nn.Module | None
    pre_norm: bool
    out_norm: nn.Module | None = None

    def __post_init__(self):
        if self.kind not in MIXER_KINDS:
            raise ValueError(f"MixerSpec kind={self.kind!r}: give one of {MIXER_KINDS}.")
        for kind, module in (("parallel", ParallelMixers), ("shared_attention", SharedAttention)):
            if (self.kind == kind) != isinstance(self.module, module):
                raise ValueError(f"A MixerSpec of kind {kind!r} takes a {module.__name__} module, and only it does.")

    @property
    def branch_specs(self) -> tuple["MixerSpec", ...]:
        """The mixers it runs: each branch's where it is several in parallel (:class:`ParallelMixers`), the mixer
        after a shared attention block (:class:`SharedAttention`), else itself."""
        if isinstance(self.module, ParallelMixers):
            return tuple(branch.spec for branch in self.module.branches)
        if isinstance(self.module, SharedAttention):
            return (self.module.mixer,)
        return (self,)

    @property
    def pair_elements(self) -> int:
        """The elements per pair of positions its frozen reading holds at once: its mixing matrices' (one per head),
        or, for a shared attention block's mixer, the widest of the parts it carries per pair
        (:attr:`SharedAttention.pair_elements`)."""
        if isinstance(self.module, SharedAttention):
            return max(self.num_heads, self.module.pair_elements)
        return self.num_heads

    @property
    def reads_embeddings(self) -> bool:
        """It reads the stack's input (the token embeddings) besides its block's input (:class:`SharedAttention`)."""
        return isinstance(self.module, SharedAttention)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds of mixer it runs (:attr:`branch_specs`', and its own where it is not one of them)."""
        kinds = tuple(spec.kind for spec in self.branch_specs)
        return kinds if self.kind in kinds or self.kind == "parallel" else (self.kind, *kinds)


@dataclass(frozen=True)
class MixerBranch:
    """One of several token mixers a block runs side by side on the same normed input (:class:`ParallelMixers`), with
    the numbers the block multiplies its input and its output by (Falcon-H1's ``attention_in_multiplier``,
    ``ssm_out_multiplier``, ...).

    Attributes:
        spec: The mixer (its own ``norm`` None: the block's norm is the parallel mixer's).
        in_scale: The factor on the block's normed input before this mixer reads it.
        out_scale: The factor on this mixer's output before the branches are added.
    """

    spec: MixerSpec
    in_scale: float = 1.0
    out_scale: float = 1.0


class ParallelMixers(nn.Module):
    """Token mixers a block runs side by side on the same normed input and adds up (Falcon-H1: a Mamba-2 mixer and
    softmax attention), ``Σ_i s_i · mixer_i(m_i · x̂)``, as one mixer the methods read (``kind="parallel"``): each
    branch frozen as it is alone, a token's part the sum of its parts in the branches. The model never calls it: the
    trace records each branch's call and adds their outputs, scaled, in the branches' order (the block's).

    Args:
        branches: The mixers, in the order the block adds their outputs.
    """

    def __init__(self, *branches: MixerBranch):
        super().__init__()
        self.branches = list(branches)  # their modules the model's: not submodules of this one

    @property
    def out_proj(self) -> nn.Module:
        """The first branch's output projection (its width is the block's)."""
        first = self.branches[0].spec.module
        return first.out_proj if hasattr(first, "out_proj") else first.o_proj

    def forward(self, hidden: torch.Tensor, *_args, **_kwargs) -> torch.Tensor:
        raise TypeError("ParallelMixers is read by the methods from the trace; the model runs its branches itself.")


class AdaptedLinear(nn.Module):
    """A linear map plus a low-rank adapter on the same input (Zamba 2's per-call adapters on a shared block's
    projections: ``W x + B A x``), some of its outputs (``outputs``), as one linear map: ``weight`` ``W + B A``
    (``(out, in)``, as ``nn.Linear`` stores them), its forward the sum as the model computes it.

    Args:
        linear: The shared projection.
        adapter: ``nn.Sequential(A, B)`` of two bias-free ``nn.Linear``, or None (no adapter).
        outputs: The outputs kept (a fused projection's part).
    """

    def __init__(self, linear: nn.Linear, adapter: nn.Sequential | None, outputs: slice = slice(None)):
        super().__init__()
        self.wrapped, self.outputs = [linear, adapter], outputs  # in a list: not submodules

    @property
    def weight(self) -> torch.Tensor:
        linear, adapter = self.wrapped
        weight = linear.weight if adapter is None else linear.weight + adapter[1].weight @ adapter[0].weight
        return weight[self.outputs]

    @property
    def bias(self) -> torch.Tensor | None:
        bias = self.wrapped[0].bias
        return None if bias is None else bias[self.outputs]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        linear, adapter = self.wrapped
        found = linear(hidden) if adapter is None else linear(hidden) + adapter(hidden)
        return found[..., self.outputs]


class SharedAttention(nn.Module):
    r"""A block whose token mixer reads, besides the block's input, what a shared attention block made of it (Zamba 2's
    hybrid blocks, as one mixer the methods read, ``kind="shared_attention"``)::

        a = attention(norm₁([x; e]))                     (e: the first block's input, the token embeddings)
        s = projection(ffn(norm₂(a)))                     (no residual sum inside the shared block)
        y = x + mixer(norm₃(x + s))

    The attention reads the block's input concatenated with the embeddings, with the projections of the call (shared
    weights plus the adapters of this block, :class:`AdaptedLinear`); its FFN is gated; ``mixer`` (a Mamba-2 mixer)
    reads the block's input plus the projected side output. The model never calls this module: the trace records the
    block's call and the mixer's output.

    Args:
        block: The block module, whose call the trace records.
        attention: The shared attention module (its ``scaling``, ``num_key_value_groups``, ``head_dim``,
            ``o_proj``; the rotary embedding of its module file).
        query, key, value: The call's projections (:class:`AdaptedLinear`).
        attention_norm: The norm on the concatenated input.
        ffn: The shared block's gated FFN (its ``norm`` the norm on the attention output, pre-norm, no residual).
        projection: The linear map from the FFN's output to the mixer's input.
        mixer: The mixer (its ``norm`` the norm on ``x + s``).
        embeddings: The block call's argument that holds the embeddings ``e``.
        rotary: The attention applies the rotary embedding it is given.
    """

    def __init__(self, block: nn.Module, attention: nn.Module, query: nn.Module, key: nn.Module, value: nn.Module,
                 attention_norm: nn.Module, ffn: "FFNSpec", projection: nn.Module, mixer: "MixerSpec",
                 embeddings: str, rotary: bool):  # fmt: skip
        super().__init__()
        self.wrapped = [block, attention, query, key, value, attention_norm, projection]  # not submodules
        self.ffn, self.mixer, self.embeddings, self.rotary = ffn, mixer, embeddings, rotary

    block = property(lambda self: self.wrapped[0])
    attention = property(lambda self: self.wrapped[1])
    query = property(lambda self: self.wrapped[2])
    key = property(lambda self: self.wrapped[3])
    value = property(lambda self: self.wrapped[4])
    attention_norm = property(lambda self: self.wrapped[5])
    projection = property(lambda self: self.wrapped[6])

    @property
    def out_proj(self) -> nn.Module:
        """The mixer's output projection (its width is the block's)."""
        return self.mixer.module.out_proj

    @property
    def pair_elements(self) -> int:
        """The widest part a token carries to a position through the block (the FFN's hidden units, the mixer's
        channels, the concatenated input): a part per pair is formed (:mod:`inseq_mixing.methods.mixers`)."""
        return max(self.ffn.w_in.weight.shape[0], self.mixer.module.out_proj.in_features,
                   self.attention_norm.weight.shape[0])  # fmt: skip

    def forward(self, hidden: torch.Tensor, *_args, **_kwargs) -> torch.Tensor:
        raise TypeError("SharedAttention is read by the methods from the trace; the model runs its block itself.")


class NoMixer(nn.Module):
    """The token mixer of a block that has none (Nemotron-H's FFN blocks), as the methods read it
    (``kind="none"``): it mixes nothing and adds nothing (its map the identity). The model never calls it; the trace
    records nothing for it.

    Args:
        width: The block's channels.
        like: A linear map of the model, whose weight's dtype and device its zero output projection takes
            (:func:`placed_like`).
    """

    def __init__(self, width: int, like: nn.Module):
        super().__init__()
        self.out_proj = nn.Linear(1, width, bias=False, **placed_like(like))
        with torch.no_grad():
            self.out_proj.weight.zero_()

    def forward(self, hidden: torch.Tensor, *_args, **_kwargs) -> torch.Tensor:
        return torch.zeros_like(hidden)


def no_mixer(width: int, like: nn.Module) -> MixerSpec:
    """The token-mixing sub-block of a block of ``width`` channels without one: :class:`NoMixer`."""
    return MixerSpec(module=NoMixer(width, like), kind="none", num_heads=1, norm=None, pre_norm=True)


@dataclass(frozen=True)
class LayerSpec:
    """One block: self-attention (or a token mixer that is not attention, :class:`MixerSpec`), optional
    cross-attention, FFN, in this order."""

    module: nn.Module
    self_attn: AttentionSpec | MixerSpec
    ffn: FFNSpec | MoESpec
    cross_attn: AttentionSpec | None = None


@dataclass(frozen=True)
class InjectedInputs:
    """Vectors a stack adds to some positions' hidden states between its blocks, from outside the stack: Qwen3-VL's
    DeepStack (the vision tower's features of earlier layers added to the image tokens' states after each of the
    decoder's first blocks). The stack's module gets them as keyword arguments of its forward call: ``vectors``, a
    list whose entry ``l`` ``(marked positions, d_model)`` is added after block ``l``, at the positions ``mask``
    ``(batch, positions)`` marks, in order.

    The methods credit an added vector to the position it is added at, as they credit a block input's own
    embedding (:meth:`dense`; our extension: no method's paper treats inputs between blocks).

    Attributes:
        module: The module whose forward gets the vectors (the language model).
        vectors: The keyword of the list of vectors.
        mask: The keyword of the positions' mask.
    """

    module: nn.Module
    vectors: str
    mask: str

    def dense(self, kwargs: dict) -> list[torch.Tensor]:
        """The vectors of a forward call's keyword arguments as ``(batch, positions, d_model)`` tensors, zero where
        nothing is added (none: the call added none)."""
        vectors, mask = kwargs.get(self.vectors), kwargs.get(self.mask)
        if vectors is None or mask is None:
            return []
        return [self.scattered(vector, mask) for vector in vectors]

    @staticmethod
    def scattered(vector: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``vector`` ``(marked, ...)`` placed at ``mask``'s true positions of a zero ``(*mask.shape, ...)``."""
        mask = mask.to(vector.device)
        dense = vector.new_zeros(*mask.shape, *vector.shape[1:])
        dense[mask] = vector
        return dense


@dataclass(frozen=True)
class StackSpec:
    """An encoder or decoder stack; ``injected``: vectors it adds between its blocks (:class:`InjectedInputs`)."""

    layers: list[LayerSpec]
    final_norm: nn.Module | None = None
    injected: InjectedInputs | None = None


#: What an encoder-only model's head explains (see :class:`HeadSpec`).
HEAD_TASKS = ("masked_lm", "sequence_classification", "token_classification", "ctc")


@dataclass(frozen=True)
class HeadSpec:
    """The read-out of an encoder-only model: position-wise steps from the final hidden state to the logits.

    Each step is an ``nn.Linear``, a norm, or an element-wise activation (a module or a function), applied in order to
    the final hidden state of one position; dropout is left out (eval mode). A sequence classifier reads its first
    token (BERT's pooler, RoBERTa's and ELECTRA's classification heads, DistilBERT's pre-classifier): its logits are
    the steps at position 0. The last step is the linear map whose rows are the explained vocabulary or labels.

    A pooled read-out (an image classifier reading the mean of the patches, DINOv2's [CLS] beside that mean, DeiT's
    [CLS] and distillation heads) first concatenates, in the order of ``pooling``, the final states of given
    positions (an ``int``) and the mean of the final states from ``pool_from`` on (``"mean"``), and applies the steps
    to that one vector: its logits are position 0's.

    Attributes:
        task: One of :data:`HEAD_TASKS`.
        steps: The steps, in order.
        pooling: ``()`` (position-wise), or the vectors concatenated into what the steps read.
        pool_from: The first position the mean reads (after [CLS] and the registers).
    """

    task: str
    steps: tuple
    pooling: tuple[int | str, ...] = ()
    pool_from: int = 1

    @property
    def out_proj(self) -> nn.Linear:
        """The last linear map (unembedding or classifier)."""
        return self.steps[-1]

    def pooled(self, hidden: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """What a pooled read-out's steps read, ``(B, 1, D · len(pooling))``, from the final states ``(B, T, D)``
        (the model's own computation; the mean over the real positions of ``mask`` ``(B, T)`` where the batch is
        padded, as SigLIP 2's classifier reads its patches); ``hidden`` itself for a position-wise head."""
        if not self.pooling:
            return hidden
        weights = self.mean_weights(hidden.shape[:2], mask, hidden.device).to(hidden.dtype)
        parts = [(weights[..., None] * hidden).sum(1, keepdim=True) if part == "mean" else hidden[:, part : part + 1]
                 for part in self.pooling]  # fmt: skip
        return torch.cat(parts, dim=-1)

    def mean_weights(self, shape, mask: torch.Tensor | None, device) -> torch.Tensor:
        """Each position's weight ``(B, T)`` in a pooled read-out's mean: ``1/n`` on the ``n`` real positions from
        ``pool_from`` on, 0 elsewhere."""
        weights = torch.ones(shape, device=device) if mask is None else mask.to(device=device, dtype=torch.float32)
        weights = weights.clone()
        weights[:, : self.pool_from] = 0
        return weights / weights.sum(1, keepdim=True)


@dataclass(frozen=True)
class PatchMerge:
    r"""A projector that folds groups of the tower's patches into one image token, from their concatenation
    :math:`z = [x_{g_{k1}}; \ldots; x_{g_{kn}}]` (``pool="concat"``) or their mean (``pool="mean"``): a linear map
    (Idefics3's and SmolVLM's pixel shuffle, bias-free: the embedding is exactly :math:`\sum_j W_j x_{g_{kj}}`), a
    norm then a linear map (Gemma 3's average pooling, its RMSNorm, its projection), or an MLP (InternVL's: a
    LayerNorm on :math:`z`, a linear map, an activation, a second linear map).

    Attributes:
        groups: ``(tokens, n)`` the tower patches each image token reads, in the order the projector concatenates them;
            or ``n``: each ``n`` patches in a row fold into a token, however many the image has (the packed towers').
        projection: The linear map on the (normalised) concatenation or mean: an ``nn.Linear``, or a weight ``(in,
            out)`` the projector multiplies by.
        norm: A norm on the concatenation or mean before it, or None.
        activation: The activation after it, or None (then no ``out`` either).
        out: The linear map after the activation, or None.
        pool: ``"concat"`` or ``"mean"``.
        patch_norm: ``norm`` is applied to each patch's state before they are folded (Qwen2-VL's merger), not to the
            concatenation or mean.
    """

    groups: torch.Tensor | int
    projection: nn.Module | torch.Tensor
    norm: nn.Module | None = None
    activation: Callable | None = None
    out: nn.Module | None = None
    pool: str = "concat"
    patch_norm: bool = False

    def groups_of(self, patches: int) -> torch.Tensor:
        """The ``(tokens, n)`` patches each token folds, for an image of ``patches`` patches."""
        if isinstance(self.groups, torch.Tensor):
            return self.groups
        return torch.arange(patches).reshape(-1, self.groups)


@dataclass(frozen=True)
class TowerRun:
    """One traced run of a vision tower: its keyword inputs, its padding mask ``(images, tokens)`` (every token
    real), the labels of one image's tokens (None: :attr:`TowerSpec.tokens`'), and a check: ``read_out`` (the
    model's merger) on the traced run's final states of one image must give ``expected``, the embeddings the model
    gave that image's tokens (None: no check). ``layout``: where the image tokens' embeddings come from, when not
    from each tower image's tokens in turn (LLaVA-NeXT's tiles laid out on the image's grid): per image of the
    model's input, ``(tokens, 2)``: the tower image (counted over the run) and the token read in it (after
    ``first_feature``), or ``(-1, -1)`` for a token no tower token gave (a learned newline)."""

    inputs: dict
    mask: torch.Tensor
    labels: list[str] | None = None
    expected: torch.Tensor | None = None
    read_out: nn.Module | None = None
    layout: list[torch.Tensor] | None = None


@dataclass(frozen=True)
class TowerSpec:
    """A vision-language model's vision tower as far as its image tokens read it, where the projector between them
    mixes no tokens (LLaVA's) or folds patches by a linear map (Idefics3's pixel shuffle, :class:`PatchMerge`): the
    decoder's image-token scores continue through it (:mod:`inseq_mixing.methods.tower`).

    Attributes:
        module: The tower (a vision encoder this package reads: CLIP's, SigLIP's).
        spec: The tower's own spec.
        layers: How many of its blocks the image tokens' features went through (``vision_feature_layer``).
        first_feature: The tower token the first image token was read from (1 where the class token is dropped).
        tokens: The tower's tokens per image (its class token, then its patches).
        merge: A projector that folds patches into tokens (:class:`PatchMerge`), or None (one token each).
        inputs: The tower's keyword inputs from the model's (default: its ``pixel_values``), or None.
        runs: The tower's runs from the model's keyword inputs and what ``recorder`` read (None without one): one per
            image (the packed towers of Qwen2-VL and its successors, whose images differ in size:
            :mod:`.packed_tower`), LLaVA-NeXT's tiles laid out; or None: one run of every image (:meth:`tower_runs`).
        recorder: A context manager that reads what ``runs`` needs from the model's own forward pass while the
            method runs it (yielding a dict), or None: ``runs`` is called before the method.
    """

    module: nn.Module
    spec: "ModelSpec"
    layers: int
    first_feature: int
    tokens: int
    merge: PatchMerge | None = None
    inputs: Callable[[dict], dict] | None = None
    runs: Callable[[dict, dict | None], list[TowerRun]] | None = None
    recorder: Callable[[], AbstractContextManager[dict]] | None = None

    def tower_runs(self, kwargs: dict, seen: dict | None = None) -> list[TowerRun]:
        """The tower's traced runs for the model's keyword inputs ``kwargs`` (``seen``: what :attr:`recorder` read),
        each image in one of them, in order."""
        if self.runs is not None:
            return self.runs(kwargs, seen)
        inputs = {"pixel_values": kwargs["pixel_values"]} if self.inputs is None else self.inputs(kwargs)
        pixels = inputs["pixel_values"]
        return [TowerRun(inputs, torch.ones(pixels.shape[0], self.tokens, dtype=torch.long, device=pixels.device))]


@dataclass(frozen=True)
class ModelSpec:
    """A whole model: its family name, its stacks and its LM head.

    Attributes:
        family: Family name (see :data:`inseq_mixing.specs.SUPPORTED_FAMILIES`).
        decoder: The decoder stack (the only stack of decoder-only models).
        encoder: The encoder stack of encoder–decoder models.
        lm_head: The unembedding module.
        logits_scale: Factor applied to the final hidden state before the LM head (T5 with tied embeddings), or to
            the logits after it (``scale_after_head``; the same map: the head is linear).
        scale_after_head: The model multiplies its logits by ``logits_scale`` after the LM head (Granite's divisor,
            Falcon-H1's multiplier), so what the head is given lacks it.
        logits_bias: Bias added to the logits outside the LM head module (BART's ``final_logits_bias``), or None.
        max_positions: Longest sequence a fixed-size table of absolute position embeddings covers (less than its
            size where position ids start after an offset, as in RoBERTa's family), or None where positions are
            relative, rotary or computed on the fly.
        readout_proj: A bias-free linear map between the decoder's final norm and the LM head (OPT's
            ``project_out``), or None.
        logit_softcap: The cap ``c`` of a final logit soft-cap ``c·tanh(z/c)`` applied after the LM head (Gemma 2),
            or None. The cap is not linear: the logit methods explain ``z``, the logit before it.
        causal: Whether the decoder stack's self-attention is causal. Encoder-only models keep their one stack in
            ``decoder`` (the stack whose positions are explained) with ``causal=False``.
        head: The read-out of an encoder-only model (masked LM or classifier), or None (then ``lm_head`` is the
            read-out, or the model is a bare encoder that explains no logit).
        output_attentions: The model's attention returns its probabilities only when the forward pass is called
            with ``output_attentions=True`` (DeBERTa-v2's own argument).
        float64_padding_nan: In float64, transformers' masking of a padded batch gives NaN that reaches the real
            tokens (ModernBERT): the front ends then run texts one at a time in float64.
        attention_sinks: Each head's softmax also runs over a learned logit without a value (GPT-OSS), so the
            recorded rows sum to less than 1 over the tokens: attention rollout keeps the rest as the sink's share.
        image_token_id: A vision-language decoder's image placeholder token (its embedding replaced by the
            projector's output when the images are given), or None: ids holding it need ``pixel_values``.
        own_positions: The model computes its positions from the ids and the padding mask itself (Qwen2-VL's
            multimodal rotary positions: an image's tokens get their row and column), so the trace passes none.
        bidirectional_images: A decoder whose image tokens attend to each other both ways (Gemma 3): its stack is
            traced as not causal (each row read over every key its attention saw), its logits read as a decoder's.
        tower: A vision-language decoder's vision tower where its scores continue through it (:class:`TowerSpec`),
            or None.
        answer_inputs: A vision-language decoder's inputs laid out like the ids whose value at the answer's tokens is
            not 0, as ``(name, value)`` pairs: PaliGemma's ``token_type_ids`` are 1 there (the suffix, read causally,
            as generation reads it; 0 would put the answer in the prefix, read both ways).
        image_tiles: Where a vision-language decoder's tiles of one image are not each a run of its tokens (LLaVA-NeXT
            packs them on the image's grid): from the model's keyword inputs, per image, each image token's tile
            (``-1``: a token of no tile, a learned newline), read from the model's own packing; or None: the front
            end reads the tiles from the tokens (:mod:`inseq_mixing.frontends.vlm`).
    """

    family: str
    decoder: StackSpec
    encoder: StackSpec | None = None
    lm_head: nn.Module | None = None
    logits_scale: float = 1.0
    scale_after_head: bool = False
    logits_bias: torch.Tensor | None = None
    max_positions: int | None = None
    readout_proj: nn.Module | None = None
    logit_softcap: float | None = None
    causal: bool = True
    head: HeadSpec | None = None
    output_attentions: bool = False
    float64_padding_nan: bool = False
    attention_sinks: bool = False
    image_token_id: int | None = None
    own_positions: bool = False
    bidirectional_images: bool = False
    tower: TowerSpec | None = None
    answer_inputs: tuple[tuple[str, int], ...] = ()
    image_tiles: Callable[[dict], list[torch.Tensor]] | None = None

    @property
    def is_encoder_only(self) -> bool:
        return not self.causal and self.encoder is None

    @property
    def explains_logits(self) -> bool:
        """Whether the model has a read-out whose logits the logit methods can explain."""
        return self.lm_head is not None or self.head is not None

    @property
    def is_encoder_decoder(self) -> bool:
        return self.encoder is not None

    @property
    def stacks(self) -> dict[str, StackSpec]:
        """The model's stacks by name: ``"decoder"``, then ``"encoder"`` for encoder–decoders."""
        return {"decoder": self.decoder} | ({"encoder": self.encoder} if self.encoder is not None else {})

    def mixers(self) -> list[MixerSpec]:
        """The token mixers that are not attention, in order (none in a Transformer)."""
        return [layer.self_attn for stack in self.stacks.values() for layer in stack.layers
                if isinstance(layer.self_attn, MixerSpec)]  # fmt: skip

    def block_modules(self) -> list[nn.Module]:
        """Every stack's block modules, each once (a module shared by two layer specs is listed once)."""
        blocks = {id(layer.module): layer.module for stack in self.stacks.values() for layer in stack.layers}
        return list(blocks.values())


@dataclass(frozen=True)
class NormParams:
    """What a layer norm computes, so that the methods can apply it with statistics frozen at the forward pass.

    Attributes:
        kind: ``"layer"`` (LayerNorm: ``γ ⊙ (z − mean z) / σ + β``), ``"rms"`` (RMSNorm: ``γ ⊙ z / rms(z)``) or
            ``"scale"`` (a layer scale, DINOv2's: ``γ ⊙ z``, no statistics; linear, so "frozen" it is itself).
        weight: The gain ``γ``, or None.
        bias: The shift ``β``, or None.
        eps: The epsilon added to the variance.
    """

    kind: str
    weight: torch.Tensor | None
    bias: torch.Tensor | None
    eps: float


#: RMSNorm classes that scale by ``1 + weight`` (Gemma); their spec files register them here.
UNIT_OFFSET_RMS_NORMS: set[type] = set()


def norm_params(module: nn.Module) -> NormParams:
    """Describe a norm module: ``nn.LayerNorm``, an RMSNorm (T5, Llama-style; Gemma's with gain ``1 + weight``), or a
    layer scale (DINOv2's ``lambda1``: a per-channel factor on a branch's output, handled as a norm without
    statistics, where the sandwich norms of Gemma 2 sit).

    Raises:
        UnsupportedModelError: The module is neither.
    """
    if isinstance(module, nn.LayerNorm):
        return NormParams("layer", module.weight, module.bias, module.eps)
    if type(module) in UNIT_OFFSET_RMS_NORMS:
        return NormParams("rms", 1 + module.weight, None, module.eps)
    if isinstance(getattr(module, "lambda1", None), nn.Parameter):  # DINOv2's layer scale, or a LayerScale's
        return NormParams("scale", module.lambda1, None, 0.0)
    eps = getattr(module, "variance_epsilon", None)  # the RMSNorms of T5/mT5/umT5 and Llama-style models
    if eps is not None:
        return NormParams("rms", module.weight, None, eps)
    raise UnsupportedModelError(
        f"Unknown norm module {type(module).__name__}: inseq-mixing handles nn.LayerNorm and RMSNorm (T5, Llama)."
    )


class LayerScale(nn.Module):
    """A layer scale its block holds as a bare parameter (BEiT's ``lambda_1`` / ``lambda_2``) or a number (Granite 4's
    residual multiplier, every channel's), as a module the methods apply: ``γ ⊙ z``. The model never calls it, so the
    trace records its input at ``input_module``'s output (the module whose output the block multiplies by ``γ``; the
    sum of several modules' outputs where it is a tuple of them).

    Args:
        scale: The block's per-channel factor ``γ`` (the model's own parameter, not a copy, or a frozen one).
        input_module: The module (or modules, outputs summed) whose output is scaled, or None where the trace has
            that input already (an attention's or a mixer's output).
    """

    def __init__(self, scale: nn.Parameter, input_module: nn.Module | tuple[nn.Module, ...] | None = None):
        super().__init__()
        self.lambda1 = scale
        modules = input_module if isinstance(input_module, tuple) else (input_module,)
        self.input_module = list(modules)  # in a list: not submodules of this one

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lambda1 * hidden


class SummedModules(nn.Module):
    """Modules a block calls on the same input and adds up (Granite 4's experts and its shared FFN), as one module the
    methods call: the sum of their outputs."""

    def __init__(self, *modules: nn.Module):
        super().__init__()
        self.wrapped = list(modules)  # in a list: not submodules

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return sum(module(hidden) for module in self.wrapped)


def multiplier(value: float, width: int, like: nn.Module, input_module=None) -> LayerScale:
    """A number every channel of a branch's output is multiplied by before the residual sum (Granite 4's
    ``residual_multiplier``), as a :class:`LayerScale` (``like``: a module whose weight's dtype and device it takes,
    :func:`placed_like`)."""
    scale = nn.Parameter(torch.full((width,), float(value), **placed_like(like)), requires_grad=False)
    return LayerScale(scale, input_module)


def is_norm(module) -> bool:
    """Whether ``module`` is a norm :func:`norm_params` describes (a LayerNorm or an RMSNorm)."""
    try:
        norm_params(module)
    except UnsupportedModelError:
        return False
    return True


def _as_in_out_matrix(module: nn.Module, out_slice: slice) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Weight of a linear map as ``(in, out)``.

    ``nn.Linear`` stores ``(out, in)``, GPT-2's ``Conv1D`` stores ``(in, out)``.
    """
    weight = module.weight
    if isinstance(module, nn.Linear | SlicedLinear | ExpertLinear | ScaledLinear):
        weight = weight.T
    bias = module.bias[out_slice] if getattr(module, "bias", None) is not None else None
    return weight[:, out_slice], bias


class SlicedLinear(nn.Module):
    """Some outputs of a fused ``nn.Linear`` (Phi-3's ``gate_up_proj``) as a linear map of their own.

    ``weight`` and ``bias`` are views of the fused module's (``(out, in)``, as ``nn.Linear`` stores them).
    """

    def __init__(self, fused: nn.Linear, outputs: slice):
        super().__init__()
        self.fused, self.outputs = fused, outputs

    @property
    def weight(self) -> torch.Tensor:
        return self.fused.weight[self.outputs]

    @property
    def bias(self) -> torch.Tensor | None:
        return None if self.fused.bias is None else self.fused.bias[self.outputs]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(hidden, self.weight, self.bias)


class ScaledLinear(nn.Module):
    """A linear map whose output the model multiplies by a number (Falcon-H1's ``mlp_multipliers``), as a linear map
    of its own: ``weight`` and ``bias`` the module's times ``factor`` (``(out, in)``, as ``nn.Linear`` stores them),
    its forward the module's output times ``factor``, as the model computes it."""

    def __init__(self, linear: nn.Linear, factor: float):
        super().__init__()
        self.wrapped, self.factor = [linear], float(factor)  # in a list: not a submodule

    @property
    def weight(self) -> torch.Tensor:
        return self.wrapped[0].weight * self.factor

    @property
    def bias(self) -> torch.Tensor | None:
        bias = self.wrapped[0].bias
        return None if bias is None else bias * self.factor

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.wrapped[0](hidden) * self.factor


def attention(
    module: nn.Module,
    value_proj: nn.Module,
    out_proj: nn.Module,
    heads: tuple[int, int, int],
    norm: nn.Module | None,
    pre_norm: bool,
    value_slice: slice = slice(None),
    out_norm: nn.Module | None = None,
    output_module: nn.Module | None = None,
) -> AttentionSpec:
    """An :class:`AttentionSpec` whose output projection is read from ``out_proj``; ``heads`` is
    ``(num_heads, num_kv_heads, head_dim)``; ``output_module`` as in :class:`AttentionSpec`."""
    num_heads, num_kv_heads, head_dim = heads
    return AttentionSpec(
        module=module,
        value_proj=value_proj,
        value_slice=value_slice,
        out_proj=out_proj,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        norm=norm,
        pre_norm=pre_norm,
        out_norm=out_norm,
        output_module=output_module,
    )


def linear_in_out(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Weight ``(in, out)`` and bias of an ``nn.Linear`` or GPT-2 ``Conv1D``."""
    return _as_in_out_matrix(module, slice(None))

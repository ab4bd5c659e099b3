"""The authors' AttnLRP library, ``lxt`` (2.1), run on our tiny models as a reference for ``attn_lrp`` (tests only).

lxt's own entry point does not run with transformers 5: ``import lxt.efficient`` fails (its BERT patch imports
``find_pruneable_heads_and_indices``, which transformers removed, and its ViT patch imports torchvision), and its
``patch_attention`` replaces transformers' ``ALL_ATTENTION_FUNCTIONS`` registry by a plain dict, on which every
attention call then fails (``'dict' object has no attribute 'get_interface'``). It also patches classes, so every
model in the process would change. So this module loads lxt's rule and patch modules without the package's
``__init__``, reads lxt's own per-family patch table (``attnLRP``: which module class gets which of its forwards) and
applies those forwards to the instances of one model, and lxt's attention wrapper to the family's eager attention
function, undoing all of it afterwards. The rules (the patched forwards, the gradient factors, the ε of its identity
rule) are lxt's; only where they are installed is ours.

Relevance is gradient × input at the first block's input :math:`h^0`, where ``attn_lrp`` reads it. lxt's examples
read it at ``inputs_embeds``: the gradient there is the same (the position embedding of GPT-2 is added), so this only
also credits the position embedding to its token, as ``attn_lrp`` does.
"""

import importlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

#: Our family name -> lxt's module under ``lxt.efficient.models`` (the decoder-only families lxt 2.1 supports).
LXT_FAMILIES = {"gpt2": "gpt2", "llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3"}


def lxt_available() -> bool:
    return importlib.util.find_spec("lxt") is not None


def _lxt_module(name: str) -> types.ModuleType:
    """``lxt.efficient.<name>``, imported without running ``lxt.efficient``'s and ``lxt.efficient.models``' inits."""
    root = Path(importlib.util.find_spec("lxt").submodule_search_locations[0])
    for package in ("lxt.efficient", "lxt.efficient.models"):
        if package not in sys.modules:
            stub = types.ModuleType(package)
            stub.__path__ = [str(root.joinpath(*package.split(".")[1:]))]
            sys.modules[package] = stub
    return importlib.import_module(f"lxt.efficient.{name}")


@contextmanager
def lxt_attn_lrp_rules(model: torch.nn.Module, family: str) -> Iterator[None]:
    """Within the block, ``model`` runs with lxt's AttnLRP forwards (its ``attnLRP`` table for ``family``)."""
    patches = _lxt_module("patches")
    table = _lxt_module(f"models.{LXT_FAMILIES[family]}").attnLRP
    patched, attention = [], None
    try:
        for target, patch in table.items():
            if isinstance(target, types.ModuleType):  # lxt's attention patch: wrap the eager attention function
                assert patch is patches.patch_attention, f"lxt's {family} table uses {patch}, expected patch_attention"
                attention = (target, target.eager_attention_forward)
                target.eager_attention_forward = patches.wrap_attention_forward(target.eager_attention_forward)
                continue
            forward, method = patch.args[0], patch.keywords.get("method_name", "forward")
            for module in model.modules():
                if isinstance(module, target):
                    setattr(module, method, types.MethodType(forward, module))
                    patched.append((module, method))
        assert attention is not None and patched, f"lxt's {family} table patched nothing"
        yield
    finally:
        for module, method in patched:
            delattr(module, method)
        if attention is not None:
            attention[0].eager_attention_forward = attention[1]


def lxt_relevance(
    model: torch.nn.Module, family: str, input_ids: torch.Tensor, targets: torch.Tensor, rules: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """lxt's AttnLRP relevance of every token for the logit of ``targets[t]`` at each position ``t``.

    Args:
        model: A decoder-only model of ``family`` loaded with eager attention.
        input_ids: ``(T,)`` one sentence.
        targets: ``(T,)`` the token whose logit is explained at each position.
        rules: ``False`` for plain gradient × input (no lxt patch), to check that the rules change something.

    Returns:
        ``(relevance, logits)``: ``(T, T)`` relevance of token ``j`` for position ``t`` (gradient × input at
        :math:`h^0`, one backward pass per position), and the ``(T,)`` explained logits.
    """
    assert model.config._attn_implementation == "eager", "lxt's attention wrapper is installed on the eager function"
    relevance, logits = [], []
    with lxt_attn_lrp_rules(model, family) if rules else nullcontext():
        for position, target in enumerate(targets.tolist()):
            output = model(input_ids=input_ids[None], output_hidden_states=True, use_cache=False)
            first_block_input = output.hidden_states[0]
            first_block_input.retain_grad()
            logit = output.logits[0, position, target]
            logit.backward()
            relevance.append((first_block_input * first_block_input.grad)[0].sum(-1).detach())
            logits.append(logit.detach())
    model.zero_grad(set_to_none=True)
    return torch.stack(relevance), torch.stack(logits)

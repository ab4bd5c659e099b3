"""The one Inseq adapter: an Inseq method class generated from each method declaration.

For a declaration (:mod:`inseq_mixing.declarations`) it builds a :class:`~.base.ContextMixingAttribution` subclass
whose ``method_name`` is the declaration's name, whose docstring is the declaration's (summary, description, options),
and whose method call has an ``attribute`` signature generated from the options dataclass (Inseq routes
``model.attribute(..., option=value)`` by that signature). The call reads Inseq's step, asks for the foil tokens of a
contrastive explanation, runs the declaration's ``compute`` on a :class:`~inseq_mixing.declarations.Request` whose
trace is the one forward pass, and lays the result out as Inseq's source, target and sequence scores. No math here.
"""

import inspect

from ...declarations import DECLARATIONS, Declaration, Request
from ...methods.results import LogitScores
from ..sequences import MixingStepOutput
from .base import ContextMixingAttribution, MethodCall, own_pass_step_scores, read_step_inputs

_FIXED = ("self", "inputs", "additional_forward_args")


def run_declared(owner: ContextMixingAttribution, inputs, additional_forward_args, values: dict) -> MixingStepOutput:
    """One final step of a declared method: Inseq's step → request → ``compute`` → Inseq's layout."""
    declaration = owner.declaration
    options = declaration.make_options(values)
    steps = read_step_inputs(inputs, additional_forward_args, owner.spec.is_encoder_decoder)
    foils = None
    if declaration.explains_logit:
        foils = owner.contrast_ids(steps, options.contrast_targets, options.contrast_targets_alignments)
    request = Request(
        spec=owner.spec,
        model=owner.attribution_model.model,
        attention_mask=steps.attention_mask,
        target_ids=steps.target_ids,
        target_mask=steps.target_mask,
        predicted_ids=steps.predicted_ids,
        foil_ids=foils,
        positions=owner.explained_positions(steps),
        tracer=lambda: owner.trace(steps),
        caller=lambda: owner.model_call(steps),
    )
    result = declaration.run(request, options)
    owner.keep_axis(result.axis)
    dimensions = 0 if result.axis is None else 1
    requested = {}
    if owner.call.own_pass_step_scores:
        logits = request.trace.logits
        requested = own_pass_step_scores(
            owner.attribution_model, owner.call.own_pass_step_scores, logits, steps.predicted_ids
        )
    if isinstance(result, LogitScores):
        terms = {**requested, **result.terms}
        return owner.logit_step_output(steps, request.decoder_mask, result, foils is not None, terms, dimensions)
    if requested:
        owner.keep_step_scores(requested, request.decoder_mask)
    if result.positions:
        owner.keep_sequence_scores(result.positions, request.decoder_mask)
    return owner.maps_step_output(result, steps, num_dimensions=dimensions)


def method_call_class(declaration: Declaration) -> type[MethodCall]:
    """A :class:`MethodCall` whose ``attribute(inputs, additional_forward_args, **options)`` has the declared options
    as its signature and their documentation as its docstring."""

    def attribute(self, inputs, additional_forward_args, **options) -> MixingStepOutput:
        return run_declared(self.owner, inputs, additional_forward_args, options)

    parameters = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in _FIXED]
    parameters += [
        inspect.Parameter(item.name, inspect.Parameter.KEYWORD_ONLY, default=item.default, annotation=item.type)
        for item in declaration.option_fields()
    ]
    attribute.__signature__ = inspect.Signature(parameters, return_annotation=MixingStepOutput)
    attribute.__doc__ = f"{declaration.summary}\n\nArgs:\n{declaration.options_doc()}\n"
    attribute.__name__ = attribute.__qualname__ = "attribute"
    return type(f"_{declaration.class_name}Call", (MethodCall,), {"attribute": attribute})


def attribution_class(declaration: Declaration) -> type[ContextMixingAttribution]:
    """The Inseq method class of ``declaration`` (registered in Inseq when created)."""
    namespace = {
        "__doc__": declaration.docstring,
        "__module__": __name__,
        "method_name": declaration.name,
        "declaration": declaration,
        "method_call": method_call_class(declaration),
        "explains_logit": declaration.explains_logit,
    }
    return type(declaration.class_name, (ContextMixingAttribution,), namespace)


#: Method name → its generated Inseq class, in the registry's order.
ATTRIBUTION_CLASSES = {name: attribution_class(declaration) for name, declaration in DECLARATIONS.items()}

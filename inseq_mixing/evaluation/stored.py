"""Evaluating a stored run (the store of :func:`~inseq_mixing.attribute_dataset`) without attributing again.

The faithfulness protocol needs only the attributions and the model: each stored example's scores rank its context
tokens, and the model is read on the texts with the top of the ranking removed or kept (AOPC, as
:func:`~.evaluate.evaluate` computes it from the model: generation models replace tokens, every generated token
scored; encoder-only models delete them, each explained entry scored; speech models silence units, every explained
entry scored, the audio read again from the file the row names and cut into the units the run cut it into). The
run's method and rows are the store's; the model is the one the run names (or the one given), refused if its weights
are not the run's. The evidence, cue and alignment protocols (and the speech study's cue and blankout) explain
targets built from annotation columns the store does not hold: those are evaluated from the model.
"""

from dataclasses import replace

from ..frontends import as_front_end, identify
from .explain import explanations
from .items import EvaluationInputError
from .protocols import stored
from .scores import Evaluation, faithfulness_baseline, faithfulness_result


def evaluate_run(
    run,
    protocol: str = "faithfulness",
    *,
    model=None,
    tokenizer=None,
    processor=None,
    device: str | None = None,
    draws: int = 1000,
    seed: int = 0,
    examples: int = 2,
    random_draws: int = 3,
    show_progress: bool = False,
) -> Evaluation:
    """Evaluate the method of a stored run on its stored attributions (nothing is attributed again).

    Args:
        run: A run folder, or a run loaded with :func:`~inseq_mixing.load_run` (every valid shard is read).
        protocol: ``"faithfulness"`` (the only protocol a store holds what it needs for).
        model: The run's model (default: the name or folder its manifest records); refused if its weights are not
            the ones the run was made with.
        tokenizer: The model's tokenizer, for a model object.
        processor: A speech model object's processor.
        device: Where the model reads the perturbed texts.
        draws: Bootstrap resamples of the statistics.
        seed: Seed of the resampling and of the random rankings.
        examples: How many stored examples to keep for the report.
        random_draws: Random rankings per explained token (the baseline).
        show_progress: Show a progress bar.

    Returns:
        An :class:`~.scores.Evaluation` with one method, the run's.

    Raises:
        EvaluationInputError: Another protocol, an empty run, a model whose weights are not the run's, or a speech
            run whose audio files cannot be read or no longer give the stored units.
    """
    from ..runs import Run, load_run
    from ..runs.runner import weights_fingerprint

    run = run if isinstance(run, Run) else load_run(run)
    if protocol != "faithfulness":
        raise EvaluationInputError(
            f"A stored run is evaluated with the faithfulness protocol, not {protocol!r}: the {protocol} protocol "
            "explains targets built from annotation columns the store does not hold; evaluate it from the model."
        )
    if not len(run):
        raise EvaluationInputError(f"The run in {run.store.root} holds no example yet: run attribute_dataset first.")
    method = run.manifest["method"]
    model = run.manifest["model"]["name"] if model is None else model
    found = identify(model)
    front = as_front_end(model, method, found, tokenizer=tokenizer, processor=processor, device=device)
    if weights_fingerprint(front.model) != run.manifest["model"]["weights_sha"]:
        raise EvaluationInputError(
            f"The model's weights are not the ones the run in {run.store.root} was made with: pass model= (and "
            "tokenizer=) for the run's own model."
        )
    ids = run.ids()
    sequences = [run[example_id] for example_id in ids]
    tokens, images = stored(found)(front, run, ids, sequences, random_draws, seed, show_progress)
    evaluation = Evaluation(protocol, draws=draws, seed=seed)
    evaluation.results[method] = faithfulness_result(tokens)
    evaluation.baseline = faithfulness_baseline(tokens)
    evaluation.examples[method] = explanations(sequences[:examples])
    if images is not None:  # the report draws the scores over each image
        evaluation.examples[method] = [replace(shown, image=image) for shown, image in
                                       zip(evaluation.examples[method], images, strict=False)]  # fmt: skip
    return evaluation

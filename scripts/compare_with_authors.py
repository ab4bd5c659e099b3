"""Compare our Value Zeroing and ALTI on BERT with the authors' released code, on a tiny random BERT.

- Value Zeroing (hmohebbi/ValueZeroing): their patched ``modeling_bert`` of transformers 4.15 (a ``zero_value_index``
  argument that zeroes one token's value vectors inside a layer); each layer scored with scikit-learn's cosine distance
  between the layer's output with and without that token's values, rows normalised, then rolled out. Their scoring
  script reads a fine-tuned checkpoint and a dataset from fixed paths, so the loop over their layer API is ours.
- ALTI (mt-upc/transformer-contributions): their ``ModelWrapper`` (hooks on the HF model) gives the contributions,
  their ``normalize_contributions(..., scaling="min_sum")`` and ``compute_joint_attention`` normalise and roll them out
  (their ``utils_contributions`` module imports notebook and dataset packages at the top, so only those two functions
  are read from it).
- GlobEnc and the norm analysis of Kobayashi et al. (mohsenfayyaz/GlobEnc, whose patched ``modeling_bert`` extends
  Kobayashi et al.'s ``output_norms``): per layer N, N-Res, N-ResLN and the encoder-level N-Enc (GlobEnc's layer map),
  with the context-mixing ratios, and their ``AttentionRollout`` of the row-normalised N-Enc maps (GlobEnc).
- DecompX (mohsenfayyaz/DecompX): their patched ``BertForSequenceClassification`` with a ``DecompXConfig`` (vector
  aggregation through the pooler and classifier, GeLU and tanh at their zero-origin slopes) gives each token's
  contribution to each class logit. Their modelling file needs transformers 4.26 (``pip install --no-deps --target
  /tmp/tf426 transformers==4.26.1 huggingface_hub==0.13.4``), put first on the path for that stage only, as for
  GlobEnc's.

Both run in one virtual environment with transformers 4.15:

    python3 -m venv /tmp/vz-venv && . /tmp/vz-venv/bin/activate
    pip install torch==2.13.0 numpy scikit-learn filelock packaging regex requests tqdm pyyaml sacremoses \\
        matplotlib pandas pyaml-env
    pip install --no-deps transformers==4.15.0 huggingface_hub==0.2.1 captum==0.7.0
    git clone https://github.com/hmohebbi/ValueZeroing /tmp/ValueZeroing
    git clone https://github.com/mt-upc/transformer-contributions /tmp/transformer-contributions
    git clone https://github.com/mohsenfayyaz/DecompX /tmp/DecompX
    git clone https://github.com/mohsenfayyaz/GlobEnc /tmp/GlobEnc

Then, from this project's environment:

    python scripts/compare_with_authors.py --authors-python /tmp/vz-venv/bin/python \\
        --value-zeroing-repo /tmp/ValueZeroing --alti-repo /tmp/transformer-contributions \\
        --decompx-repo /tmp/DecompX --globenc-repo /tmp/GlobEnc --decompx-transformers /tmp/tf426

Stage 1 (the authors' environment) builds the random BERT with the Value Zeroing authors' model class, saves its
weights and config, and computes both sets of scores; stage 2 (ours) loads the same weights into transformers 5's BERT
and compares our per-layer maps and rollouts. Not part of CI.

ALTI is also compared in float64 on a BERT-base-wide model (768 dimensions, 6 layers) with trained-like weights
(sharper attention, layer-norm gains spread around 1 with outlier dimensions of gain 6 to 10, realistic biases), where
float32 rounding no longer hides small differences: the authors' code there runs with float64 as torch's default
dtype, so every tensor it makes is float64 too. It measures distances with ``torch.nn.functional.pairwise_distance``,
which adds ``eps=1e-6`` to every coordinate of the difference, and scales a post-LN block's parts by ``1/std`` of the
norm's input without the norm's ``eps``; our ``convention="reference"`` does the same, ``"paper"`` follows the paper's
formula.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

#: Shared by every stage (run in the authors' environment): random weights large enough for non-trivial attention.
RANDOMIZE = r"""
import torch


def randomize(model, seed):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if param.dim() >= 2:
                param.copy_(noise * 1.2 / param.shape[-1] ** 0.5)
            else:
                param.copy_(1 + 0.1 * noise if "LayerNorm.weight" in name else 0.1 * noise)
"""

#: The ALTI authors' maps of a model (run in the authors' environment): their ``ModelWrapper`` and, read from their
#: ``utils_contributions`` module (which imports notebook and dataset packages at the top), ``normalize_contributions``
#: (min_sum, with the resultants' L1 norms) and ``compute_joint_attention``.
AUTHORS_ALTI = r"""
import ast, os, sys
from pathlib import Path
import numpy as np
import torch


def authors_alti(model, ids, mask, alti_repo):
    os.chdir(alti_repo)  # their module reads ./src/config.yaml
    sys.path.insert(0, alti_repo)
    from src.contributions import ModelWrapper

    tree = ast.parse(Path("src/utils_contributions.py").read_text())
    wanted = [node for node in tree.body if isinstance(node, ast.FunctionDef)
              and node.name in ("normalize_contributions", "compute_joint_attention")]
    helpers = {"torch": torch, "np": np}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), "utils_contributions.py", "exec"), helpers)
    contributions = ModelWrapper(model)({"input_ids": ids, "attention_mask": mask})[3]
    resultant_norm = torch.norm(torch.squeeze(contributions["resultants"]), p=1, dim=-1)
    alti = helpers["normalize_contributions"](contributions["contributions"], scaling="min_sum",
                                              resultant_norm=resultant_norm)
    return alti, helpers["compute_joint_attention"]
"""

#: Weights with a trained BERT's scales rather than a fresh one's (run in the authors' environment).
TRAINED_LIKE = r"""
import torch


def trained_like(model, seed):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=param.dtype)
            if param.dim() >= 2:  # sharper attention than a fresh model's: larger query and key matrices
                scale = 2.5 if ("query" in name or "key" in name) else 1.0
                param.copy_(noise * scale / param.shape[-1] ** 0.5)
            elif "LayerNorm.weight" in name:  # gains spread around 1, a few outlier dimensions of gain 6 to 10
                gain = 1 + 0.3 * noise.abs()
                outliers = torch.randperm(len(gain), generator=generator)[: max(1, len(gain) // 50)]
                gain[outliers] = 6 + 4 * torch.rand(len(outliers), generator=generator, dtype=param.dtype)
                param.copy_(gain)
            else:
                param.copy_(0.2 * noise)
"""

#: ALTI in float64 on the trained-like BERT-base-wide model, by the authors' code (their environment).
ALTI_FLOAT64_STAGE = r"""
import sys
from pathlib import Path
import numpy as np
import torch

torch.set_default_dtype(torch.float64)  # every tensor their code makes (torch.eye, torch.zeros) is float64 too
alti_repo, out = sys.argv[1], Path(sys.argv[2])
from transformers import BertConfig, BertForMaskedLM

config = BertConfig(vocab_size=64, hidden_size=768, num_hidden_layers=6, num_attention_heads=12,
                    intermediate_size=3072, max_position_embeddings=64)
torch.manual_seed(0)
model = BertForMaskedLM(config).eval().double()
trained_like(model, 3)
ids = torch.tensor([[2, 11, 17, 5, 23, 42, 8, 30, 19, 7, 55, 3]])
mask = torch.ones_like(ids)
alti, _ = authors_alti(model, ids, mask, alti_repo)
assert alti.dtype == torch.float64
out.mkdir(parents=True, exist_ok=True)
np.save(out / "alti64.npy", alti.numpy())
np.save(out / "ids64.npy", ids.numpy())
torch.save(model.state_dict(), out / "weights64.pt")
(out / "config64.json").write_text(config.to_json_string())
"""

STAGE_ONE = r"""
import json, sys
from pathlib import Path
import numpy as np
import torch
from sklearn.metrics.pairwise import cosine_distances

repo, alti_repo, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
sys.path.insert(0, repo)
from transformers import BertConfig
from modeling.customized_modeling_bert import BertForMaskedLM

config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=3, num_attention_heads=4, intermediate_size=32,
                    max_position_embeddings=32)
torch.manual_seed(0)
model = BertForMaskedLM(config).eval()
randomize(model, 0)
ids = torch.tensor([[2, 11, 17, 5, 23, 42, 8, 3]])
mask = torch.ones_like(ids)
with torch.no_grad():
    hidden = model(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    extended = model.bert.get_extended_attention_mask(mask, ids.shape, ids.device)
    scores = np.zeros((config.num_hidden_layers, ids.shape[1], ids.shape[1]))
    for layer, module in enumerate(model.bert.encoder.layer):
        for token in range(ids.shape[1]):
            zeroed = module(hidden[layer], attention_mask=extended, output_attentions=False,
                            zero_value_index=token)[0]
            scores[layer, :, token] = cosine_distances(zeroed[0].numpy(), hidden[layer + 1][0].numpy()).diagonal()
scores = scores / scores.sum(-1, keepdims=True)
rollout = np.zeros_like(scores)
rollout[0] = scores[0]
for layer in range(1, len(scores)):
    rollout[layer] = scores[layer] @ rollout[layer - 1]
out.mkdir(parents=True, exist_ok=True)
torch.save({k: v for k, v in model.state_dict().items()}, out / "weights.pt")
(out / "config.json").write_text(config.to_json_string())
np.save(out / "scores.npy", scores)
np.save(out / "rollout.npy", rollout)
np.save(out / "ids.npy", ids.numpy())

alti, compute_joint_attention = authors_alti(model, ids, mask, alti_repo)
np.save(out / "alti.npy", alti.double().numpy())
np.save(out / "alti_rollout.npy", compute_joint_attention(alti).double().numpy())
import transformers
print("authors' code: transformers", transformers.__version__, "torch", torch.__version__)
"""

DECOMPX_STAGE = r"""
import sys
from pathlib import Path
import numpy as np
import torch

repo, out = sys.argv[1], Path(sys.argv[2])
sys.path.insert(0, repo)
from transformers import BertConfig
from src.decompx_utils import DecompXConfig
from src.modeling_bert import BertForSequenceClassification

config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=3, num_attention_heads=4, intermediate_size=32,
                    max_position_embeddings=32, num_labels=3)
torch.manual_seed(0)
model = BertForSequenceClassification(config).eval()
randomize(model, 1)
ids = torch.tensor([[2, 11, 17, 5, 23, 42, 8, 3]])
(out / "classifier_config.json").write_text(config.to_json_string())
for variant in ("", "_no_first_value_bias"):  # their first layer gives its value bias to the tokens, not the bias
    if variant:
        with torch.no_grad():
            model.bert.encoder.layer[0].attention.self.value.bias.zero_()
    for name, options in (("separate", {"include_bias_token": True, "bias_decomp_type": None}), ("absdot", {})):
        decompx = DecompXConfig(aggregation="vector", include_classifier_w_pooler=True, output_all_layers=False,
                                output_aggregated=None, output_classifier=True, **options)
        with torch.no_grad():
            logits, _, last = model(input_ids=ids, attention_mask=torch.ones_like(ids), return_dict=False,
                                    output_hidden_states=True, decompx_config=decompx)
        scores = last.classifier[0].double().numpy()  # (tokens [+ bias], classes)
        np.save(out / f"decompx_{name}{variant}.npy", scores)
    np.save(out / f"decompx_logits{variant}.npy", logits[0].double().numpy())
    torch.save(model.state_dict(), out / f"classifier_weights{variant}.pt")
import transformers
print("DecompX authors' code: transformers", transformers.__version__)
"""

GLOBENC_STAGE = r"""
import sys
from pathlib import Path
import numpy as np
import torch

repo, out = sys.argv[1], Path(sys.argv[2])
sys.path.insert(0, repo)
from transformers import BertConfig
from src.attention_rollout import AttentionRollout
from src.modeling.modeling_bert import BertForSequenceClassification

config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=3, num_attention_heads=4, intermediate_size=32,
                    max_position_embeddings=32, num_labels=3)
model = BertForSequenceClassification(config).eval()
randomize(model, 2)
ids = torch.tensor([[2, 11, 17, 5, 23, 42, 8, 3]])
with torch.no_grad():
    _, _, norms = model(input_ids=ids, attention_mask=torch.ones_like(ids), output_attentions=True,
                        output_norms=True, return_dict=False)
names = {1: "N", 2: "N-Res", 3: "N-ResLN", 4: "N-Enc", 6: "ratio N-Res", 7: "ratio N-ResLN"}
for index, name in names.items():
    np.save(out / f"norms_{name}.npy", torch.stack([layer[index][0] for layer in norms]).double().numpy())
encoder_maps = torch.stack([layer[4][0] for layer in norms]).double().numpy()
encoder_maps = encoder_maps / encoder_maps.sum(-1, keepdims=True)
np.save(out / "globenc_rollout.npy", AttentionRollout().compute_flows([encoder_maps], output_hidden_states=True)[0])
torch.save(model.state_dict(), out / "globenc_weights.pt")
(out / "globenc_config.json").write_text(config.to_json_string())
import transformers
print("GlobEnc authors' code: transformers", transformers.__version__)
"""


def compare_globenc(out: Path, ids) -> None:
    """Our attention norm (N, N-Res, N-ResLN and the context-mixing ratios) and GlobEnc on the weights the GlobEnc
    authors' code explained."""
    import numpy as np
    import torch
    import transformers

    from inseq_mixing.methods.norm_based import attention_norm, globenc
    from inseq_mixing.trace import trace_model

    config = transformers.BertConfig(**json.loads((out / "globenc_config.json").read_text()))
    model = transformers.BertForSequenceClassification(config).eval()
    model.load_state_dict(torch.load(out / "globenc_weights.pt"), strict=False)
    trace = trace_model(model, ids, torch.ones_like(ids))
    for name, options in (("N", {}), ("N-Res", {"residual": True}), ("N-ResLN", {"layer_norm": True})):
        maps = attention_norm(trace, **options)
        theirs = np.load(out / f"norms_{name}.npy")
        line = f"attention_norm {name}: maps {theirs.shape}: max |ours - theirs| = "
        line += f"{np.abs(maps.target[0].double().numpy() - theirs).max():.2e}"
        if name != "N":
            ratio = maps.positions["context_mixing_ratio"][0].double().numpy()
            line += f"; mixing ratio {np.abs(ratio - np.load(out / f'norms_ratio {name}.npy')).max():.2e}"
        print(line)
    layers = globenc(trace, rollout=False).target[0].double().numpy()
    theirs = np.load(out / "norms_N-Enc.npy")
    theirs = theirs / theirs.sum(-1, keepdims=True)
    rolled = globenc(trace, rollout=True).target[0].double().numpy()
    their_rollout = np.load(out / "globenc_rollout.npy")[-1]
    print(
        f"globenc: row-normalised layer maps {theirs.shape}: max |ours - theirs| = "
        f"{np.abs(layers - theirs).max():.2e}; rollout (last layer): {np.abs(rolled - their_rollout).max():.2e}"
    )


def compare_decompx(out: Path, ids) -> None:
    """Our DecompX on the classifier the authors' code explained, every class, both bias treatments; then the same
    with the first layer's value bias set to 0 (their first layer gives it to the tokens, every later layer and ours
    to the bias)."""
    import numpy as np
    import torch
    import transformers

    from inseq_mixing.methods.decompx import DecompXOptions, decompx
    from inseq_mixing.trace import trace_model

    config = transformers.BertConfig(**json.loads((out / "classifier_config.json").read_text()))
    for variant in ("", "_no_first_value_bias"):
        model = transformers.BertForSequenceClassification(config).eval()
        model.load_state_dict(torch.load(out / f"classifier_weights{variant}.pt"), strict=False)
        trace = trace_model(model, ids, torch.ones_like(ids))
        logits = np.load(out / f"decompx_logits{variant}.npy")
        gap = np.abs(trace.logits[0, 0].double().numpy() - logits).max()
        for mode, convention in (("separate", "paper"), ("separate", "reference"), ("absdot", "paper"),
                                 ("absdot", "reference")):  # fmt: skip
            theirs = np.load(out / f"decompx_{mode}{variant}.npy")
            ours = []
            for label in range(theirs.shape[1]):
                options = DecompXOptions(bias=mode, convention=convention)
                scores = decompx(trace, torch.full_like(ids, label), options=options)
                row = scores.target[0, 0].double()
                ours.append(row if scores.bias is None else torch.cat([row, scores.bias[0, :1].double()]))
            ours = torch.stack(ours, dim=1).numpy()
            print(f"decompx{variant} (bias={mode}, convention={convention}): token x class scores {theirs.shape}: "
                  f"max |ours - theirs| = {np.abs(ours - theirs).max():.2e} (largest score "
                  f"{np.abs(theirs).max():.2e}; logits differ by {gap:.1e})")  # fmt: skip


def compare_alti_float64(out: Path) -> None:
    """Our ALTI, both conventions, in float64 on the trained-like model the authors' code explained."""
    import numpy as np
    import torch
    import transformers

    from inseq_mixing.methods.alti import alti
    from inseq_mixing.trace import trace_model

    config = transformers.BertConfig(**json.loads((out / "config64.json").read_text()))
    model = transformers.BertForMaskedLM(config).eval().double()
    model.load_state_dict(torch.load(out / "weights64.pt"), strict=False)
    ids = torch.from_numpy(np.load(out / "ids64.npy"))
    trace = trace_model(model, ids, torch.ones_like(ids))
    theirs = np.load(out / "alti64.npy")
    for convention in ("paper", "reference"):
        ours = alti(trace, convention=convention).decoder[0].numpy()
        per_layer = np.abs(ours - theirs).max(axis=(1, 2))
        print(f"alti float64, trained-like BERT-base-wide, convention={convention}: per-layer maps {theirs.shape}: "
              f"max |ours - theirs| per layer = {', '.join(f'{value:.1e}' for value in per_layer)}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--authors-python", required=True, help="python of the environment with transformers 4.15")
    parser.add_argument("--value-zeroing-repo", required=True, help="a clone of github.com/hmohebbi/ValueZeroing")
    parser.add_argument("--alti-repo", required=True, help="a clone of github.com/mt-upc/transformer-contributions")
    parser.add_argument("--decompx-repo", default=None, help="a clone of github.com/mohsenfayyaz/DecompX")
    parser.add_argument("--globenc-repo", default=None, help="a clone of github.com/mohsenfayyaz/GlobEnc")
    parser.add_argument("--decompx-transformers", default=None, help="a folder with transformers 4.26 (--target)")
    parser.add_argument("--out", default="out/authors")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    command = [args.authors_python, "-c", RANDOMIZE + AUTHORS_ALTI + STAGE_ONE, args.value_zeroing_repo,
               args.alti_repo, str(out)]  # fmt: skip
    subprocess.run(command, check=True)
    alti_stage = [
        args.authors_python,
        "-c",
        TRAINED_LIKE + AUTHORS_ALTI + ALTI_FLOAT64_STAGE,
        args.alti_repo,
        str(out),
    ]
    subprocess.run(alti_stage, check=True)
    environment = {**os.environ, "PYTHONPATH": args.decompx_transformers or ""}
    for repo, stage in ((args.decompx_repo, DECOMPX_STAGE), (args.globenc_repo, GLOBENC_STAGE)):
        if repo:
            subprocess.run([args.authors_python, "-c", RANDOMIZE + stage, repo, str(out)], check=True, env=environment)

    import numpy as np
    import torch
    import transformers

    from inseq_mixing.declarations import DECLARATIONS, Request
    from inseq_mixing.specs import get_spec
    from inseq_mixing.trace import trace_model

    config = transformers.BertConfig(**json.loads((out / "config.json").read_text()))
    model = transformers.BertForMaskedLM(config).eval()
    weights = torch.load(out / "weights.pt")
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing, unexpected = [[key for key in keys if not key.endswith("position_ids")] for keys in (missing, unexpected)]
    if missing or unexpected:  # the position-id buffer is not a weight
        print(f"weights do not match: missing {missing}, unexpected {unexpected}")
    ids = torch.from_numpy(np.load(out / "ids.npy"))
    mask = torch.ones_like(ids)
    spec = get_spec(model)
    request = Request(spec, model, mask, None, None, ids, None, mask.bool(), lambda: trace_model(model, ids, mask))
    print(f"ours: transformers {transformers.__version__}, torch {torch.__version__}")
    rollouts_asked = {"value_zeroing": {"rollout": True}, "alti": {}}  # value zeroing's default is the layers' mean
    for method, maps, rollouts in (("value_zeroing", "scores", "rollout"), ("alti", "alti", "alti_rollout")):
        declaration = DECLARATIONS[method]
        ours = declaration.compute(request, declaration.make_options({"per_layer": True})).target[0].double().numpy()
        rolled = declaration.compute(request, declaration.make_options(rollouts_asked[method]))
        rolled = rolled.target[0].double().numpy()
        theirs, their_rollout = np.load(out / f"{maps}.npy"), np.load(out / f"{rollouts}.npy")
        print(f"{method}: per-layer maps {theirs.shape}: max |ours - theirs| = {np.abs(ours - theirs).max():.2e}; "
              f"rollout (last layer): {np.abs(rolled - their_rollout[-1]).max():.2e}")  # fmt: skip
    compare_alti_float64(out)
    if args.globenc_repo:
        compare_globenc(out, ids)
    if args.decompx_repo:
        compare_decompx(out, ids)
    return 0


if __name__ == "__main__":
    sys.exit(main())

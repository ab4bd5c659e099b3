"""Compare our Value Zeroing and ALTI on BERT with the authors' released code, on a tiny random BERT.

- Value Zeroing (hmohebbi/ValueZeroing): their patched ``modeling_bert`` of transformers 4.15 (a ``zero_value_index``
  argument that zeroes one token's value vectors inside a layer); each layer scored with scikit-learn's cosine distance
  between the layer's output with and without that token's values, rows normalised, then rolled out. Their scoring
  script reads a fine-tuned checkpoint and a dataset from fixed paths, so the loop over their layer API is ours.
- ALTI (mt-upc/transformer-contributions): their ``ModelWrapper`` (hooks on the HF model) gives the contributions,
  their ``normalize_contributions(..., scaling="min_sum")`` and ``compute_joint_attention`` normalise and roll them out
  (their ``utils_contributions`` module imports notebook and dataset packages at the top, so only those two functions
  are read from it).

Both run in one virtual environment with transformers 4.15:

    python3 -m venv /tmp/vz-venv && . /tmp/vz-venv/bin/activate
    pip install torch==2.13.0 numpy scikit-learn filelock packaging regex requests tqdm pyyaml sacremoses \\
        matplotlib pandas pyaml-env
    pip install --no-deps transformers==4.15.0 huggingface_hub==0.2.1 captum==0.7.0
    git clone https://github.com/hmohebbi/ValueZeroing /tmp/ValueZeroing
    git clone https://github.com/mt-upc/transformer-contributions /tmp/transformer-contributions

Then, from this project's environment:

    python scripts/compare_with_authors.py --authors-python /tmp/vz-venv/bin/python \\
        --value-zeroing-repo /tmp/ValueZeroing --alti-repo /tmp/transformer-contributions

Stage 1 (the authors' environment) builds the random BERT with the Value Zeroing authors' model class, saves its
weights and config, and computes both sets of scores; stage 2 (ours) loads the same weights into transformers 5's BERT
and compares our per-layer maps and rollouts. Not part of CI.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

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
generator = torch.Generator().manual_seed(0)
with torch.no_grad():  # weights large enough for non-trivial attention
    for name, param in model.named_parameters():
        noise = torch.randn(param.shape, generator=generator)
        param.copy_(noise * 1.2 / param.shape[-1] ** 0.5 if param.dim() >= 2 else 1 + 0.1 * noise if "LayerNorm.weight"
                    in name else 0.1 * noise)
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

import ast, os
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
np.save(out / "alti.npy", alti.double().numpy())
np.save(out / "alti_rollout.npy", helpers["compute_joint_attention"](alti).double().numpy())
import transformers
print("authors' code: transformers", transformers.__version__, "torch", torch.__version__)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--authors-python", required=True, help="python of the environment with transformers 4.15")
    parser.add_argument("--value-zeroing-repo", required=True, help="a clone of github.com/hmohebbi/ValueZeroing")
    parser.add_argument("--alti-repo", required=True, help="a clone of github.com/mt-upc/transformer-contributions")
    parser.add_argument("--out", default="out/authors")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    command = [args.authors_python, "-c", STAGE_ONE, args.value_zeroing_repo, args.alti_repo, str(out)]
    subprocess.run(command, check=True)

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
    request = Request(
        spec, model, ids, mask, None, None, ids, None, mask.bool(), lambda: trace_model(model, ids, mask)
    )
    print(f"ours: transformers {transformers.__version__}, torch {torch.__version__}")
    for method, maps, rollouts in (("value_zeroing", "scores", "rollout"), ("alti", "alti", "alti_rollout")):
        declaration = DECLARATIONS[method]
        ours = declaration.compute(request, declaration.make_options({"rollout": False})).target[0].double().numpy()
        rolled = declaration.compute(request, declaration.make_options({"rollout": True})).target[0].double().numpy()
        theirs, their_rollout = np.load(out / f"{maps}.npy"), np.load(out / f"{rollouts}.npy")
        print(f"{method}: per-layer maps {theirs.shape}: max |ours - theirs| = {np.abs(ours - theirs).max():.2e}; "
              f"rollout (last layer): {np.abs(rolled - their_rollout[-1]).max():.2e}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fine-tuned models export with their head: transformers' <Family>For<Task> classes on the export give
the logits bert_jax computes, for every family and head kind; heads without an HF equivalent are refused."""
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from bert_jax import cli, params_checkpoint  # noqa: E402
from bert_jax.errors import UserError  # noqa: E402
from bert_jax.finetune import heads  # noqa: E402
from bert_jax.finetune.predict import Predictor  # noqa: E402
from bert_jax.models.config import ModelConfig  # noqa: E402
from bert_jax.models.modernbert import ModernBertConfig  # noqa: E402

TOL = 1e-5
LENGTH = 12
BASE = dict(vocab_size=100, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=37,
            max_position_embeddings=64, hidden_dropout=0.0, attention_dropout=0.0)
FAMILIES = {
    "bert": ("Bert", {}),
    "roberta": ("Roberta", dict(position_style="roberta", pad_token_id=1, type_vocab_size=1,
                                layer_norm_eps=1e-5, max_position_embeddings=66)),
    "albert": ("Albert", dict(share_layers="all", embedding_size=16, hidden_act="gelu_tanh")),
    "electra": ("Electra", dict(embedding_size=16)),
    "modernbert": ("ModernBert", {}),
}
# ModernBERT's own config: 3 layers (global, local with a window of 2 either side, global); its regression
# case pools the mean of the real tokens, the others [CLS] (the pooler and the token transform are HF's head.*).
MODERNBERT = dict(vocab_size=100, hidden_size=32, num_layers=3, num_heads=2, intermediate_size=24,
                  max_position_embeddings=64, local_window=4, global_every=2, pad_token_id=0)
HF_CLASSES = {"classification": "ForSequenceClassification", "regression": "ForSequenceClassification",
              "token": "ForTokenClassification", "span": "ForQuestionAnswering"}
LABELS = {"classification": ("entailment", "neutral", "contradiction"), "regression": (),
          "token": ("O", "B-PER", "I-PER", "B-LOC", "I-LOC"), "span": ()}
CASES = [(f, k) for f in FAMILIES for k in HF_CLASSES if not (f == "electra" and k in ("classification",
                                                                                         "regression"))]


def fine_tuned_workdir(directory, family, kind, pooling="pooled", seed=0, **model):
  """A params checkpoint as `bert-jax finetune` leaves it: random weights (every bias and LayerNorm
  too, so that a swapped tensor shows) and the config.json fields predict and export read; `model`:
  more ModelConfig fields (adapter_size)."""
  if family == "modernbert":
    encoder = ModernBertConfig(**MODERNBERT, pooling="mean" if kind == "regression" else "cls", **model)
  else:
    encoder = ModelConfig(**{**BASE, **FAMILIES[family][1], **model})
  model_config = heads.encoder_config(encoder, kind, pooling)
  labels = LABELS[kind]
  num_labels = 2 if kind == "span" else max(len(labels), 1)
  model = heads.FinetuneModel(model_config, kind, num_labels, pooling)
  ids = jnp.ones((1, LENGTH), jnp.int32)
  abstract = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(seed), ids, ids, ids * 0)["params"])
  rng = np.random.default_rng(seed)
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: (jax.tree_util.keystr(path).endswith("['scale']") + 0.1 * rng.standard_normal(x.shape))
      .astype(np.float32), abstract)
  config = {"model": model_config.to_dict(), "head": {"pooling": pooling, "dropout": 0.1},
            "task": {"family": "test", "name": f"{family}_{kind}", "head": kind, "num_labels": num_labels,
                     "labels": list(labels)},
            "data": {"max_seq_length": LENGTH}, "train": {"eval_batch_size": 8}}
  params_checkpoint.save_params(str(directory), params, config)
  return config, params


def batch(config):
  """Right-padded rows of different lengths, two segments where the model has two."""
  rng = np.random.RandomState(1)
  lengths = np.array([12, 5, 9, 7])
  mask = (np.arange(LENGTH)[None] < lengths[:, None]).astype(np.int32)
  ids = np.where(mask, rng.randint(3, config["model"]["vocab_size"], mask.shape), config["model"]["pad_token_id"])
  types = (np.arange(LENGTH)[None] >= lengths[:, None] // 2) * mask if config["model"].get("type_vocab_size", 1) > 1 \
      else np.zeros_like(ids)
  return {"input_ids": ids.astype(np.int32), "attention_mask": mask, "token_type_ids": types.astype(np.int32)}


def hf_logits(model, kind, rows):
  names = ("input_ids", "attention_mask") if model.config.model_type == "modernbert" else rows  # no token types
  with torch.no_grad():
    out = model(**{k: torch.tensor(rows[k], dtype=torch.long) for k in names})
  if kind == "span":
    return {"start_logits": out.start_logits.numpy(), "end_logits": out.end_logits.numpy()}
  return {"logits": out.logits.numpy()[:, 0] if kind == "regression" else out.logits.numpy()}


# Every head kind on BERT, and each other family with one kind, by default; every pair weekly.
DEFAULT_CASES = {("bert", k) for k in HF_CLASSES} | {("roberta", "span"), ("albert", "token"), ("electra", "token"),
                                                     ("modernbert", "classification")}


@pytest.mark.parametrize("family,kind", CASES)
def test_export_reproduces_logits(tmp_path, family, kind, capsys):
  if (family, kind) not in DEFAULT_CASES and not os.environ.get("BERT_JAX_SLOW_TESTS"):
    pytest.skip("weekly (BERT_JAX_SLOW_TESTS=1): the other family and head-kind pairs")
  config, params = fine_tuned_workdir(tmp_path / "ft", family, kind)
  assert cli.main(["convert", "--to", "hf", str(tmp_path / "ft"), str(tmp_path / "hf")]) == 0
  assert "not written" not in capsys.readouterr().out
  auto = getattr(transformers, f"AutoModel{HF_CLASSES[kind]}")
  # ModernBERT: the eager attention kernel, which computes as ours does (sdpa differs in the last bits).
  hf_model = auto.from_pretrained(tmp_path / "hf", **({"attn_implementation": "eager"} if family == "modernbert"
                                                      else {})).eval()
  assert type(hf_model).__name__ == FAMILIES[family][0] + HF_CLASSES[kind]
  hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
  if kind != "span":
    names = LABELS[kind] or ("LABEL_0",)
    assert hf_model.config.num_labels == len(names)
    assert hf_model.config.id2label == dict(enumerate(names))
    assert hf_model.config.label2id == {n: i for i, n in enumerate(names)}
  assert hf_config.get("problem_type") == {"classification": "single_label_classification",
                                           "regression": "regression"}.get(kind)
  rows = batch(config)
  ours = Predictor.build(config, params, tokenizer=None).run(rows)
  theirs = hf_logits(hf_model, kind, rows)
  mask = rows["attention_mask"] > 0
  for key, value in theirs.items():
    assert ours[key].shape == value.shape, key
    # Token and span logits on padding are not predictions (our span head masks them to -1e9).
    ours_v, theirs_v = (ours[key][mask], value[mask]) if kind in ("token", "span") else (ours[key], value)
    assert np.abs(ours_v - theirs_v).max() <= TOL, (key, np.abs(ours_v - theirs_v).max())
    assert np.abs(theirs_v).max() > 0.05  # the head is not a zero map


def test_electra_classification_is_refused(tmp_path):
  fine_tuned_workdir(tmp_path / "ft", "electra", "classification")
  with pytest.raises(UserError, match="GELU"):
    from bert_jax import pretrained  # pylint: disable=import-outside-toplevel
    from bert_jax.conversion import hf  # pylint: disable=import-outside-toplevel
    hf.write(str(tmp_path / "hf"), pretrained.read_checkpoint(str(tmp_path / "ft")))
  assert not os.path.exists(tmp_path / "hf")


def test_layer_mix_is_refused_in_one_line(tmp_path, capsys):
  fine_tuned_workdir(tmp_path / "ft", "bert", "classification", pooling="layer_mix")
  assert cli.main(["convert", "--to", "hf", str(tmp_path / "ft"), str(tmp_path / "hf")]) == 2
  err = capsys.readouterr().err
  assert "layer_mix" in err and "no Hugging Face equivalent" in err and len(err.strip().splitlines()) == 1


def test_tf_export_names_the_head_it_cannot_write(tmp_path, capsys):
  fine_tuned_workdir(tmp_path / "ft", "bert", "span")
  assert cli.main(["convert", "--to", "tf", str(tmp_path / "ft"), str(tmp_path / "tf")]) == 0
  out = capsys.readouterr().out
  assert "no place for 2 parameters, not written: head/span/bias, head/span/kernel" in out


def test_predictor_names_the_bad_example(tmp_path):
  config, params = fine_tuned_workdir(tmp_path / "ft", "bert", "span")
  predictor = Predictor.build(config, params, tokenizer=None)
  question = {"id": "q1", "question": "who?", "context": "me."}
  with pytest.raises(UserError, match=r"example 2: question answering takes"):
    predictor.normalize([question, {"id": "q2", "question": "who?"}])
  with pytest.raises(UserError, match=r"repeated: \['q1'\]"):
    predictor.normalize([question, question])

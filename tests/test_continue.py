"""Continued pretraining (configs/continue.py): a Hugging Face checkpoint continued on a domain corpus keeps
its model, tokenizer and heads; the step-0 evaluation is transformers' own loss on the same masked batches;
the domain loss falls; the general-domain set is evaluated alongside."""
import json
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_jax import pretrained  # noqa: E402
from bert_jax.config_utils import load_config  # noqa: E402
from bert_jax.data_pipelines import embedded  # noqa: E402
from bert_jax.training import trainer  # noqa: E402
from core_helpers import slow  # noqa: E402

RUN = ["--config.train.num_steps=20", "--config.train.eval_every_steps=20", "--config.train.eval_steps=2",
       "--config.optimizer.learning_rate=2e-3", "--config.optimizer.warmup_steps=5",
       "--config.checkpoint.async_save=False"]


def _hf_folder(path, cls):
  """A tiny random transformers BERT (`cls`) with the embedded corpus's WordPiece vocabulary."""
  vocab = embedded.ensure_embedded()[1]
  with open(vocab, encoding="utf-8") as f:
    words = f.read().splitlines()
  torch.manual_seed(0)
  config = transformers.BertConfig(vocab_size=len(words), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=37, max_position_embeddings=64)
  model = cls(config).eval()
  model.save_pretrained(path)
  (path / "vocab.txt").write_text("\n".join(words) + "\n")
  (path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
  return model


def _general_text(path):
  """Everyday English, 64 documents of three sentences: the general-domain held-out set."""
  r = random.Random(0)
  subjects = ["the cat", "a man", "my sister", "the old farmer", "our teacher", "the children", "a small dog"]
  verbs = ["walked to", "looked at", "talked about", "painted", "visited", "wrote about", "dreamed of"]
  objects = ["the garden", "a red house", "the river", "the market", "an old bridge", "the summer sea"]
  docs = [" ".join(f"{r.choice(subjects).capitalize()} {r.choice(verbs)} {r.choice(objects)}." for _ in range(3))
          for _ in range(64)]
  path.write_text("\n\n".join(d.replace(". ", ".\n") for d in docs) + "\n")
  return str(path)


def _hf_losses(model, inputs, steps):
  """transformers' masked-LM loss (mean over the weighted masked positions) and NSP loss (mean over rows) of
  `steps` batches from `inputs`."""
  mlm = nsp = masked = rows = 0.0
  for _ in range(steps):
    b = next(inputs)
    with torch.no_grad():
      out = model(torch.tensor(b["input_ids"]), attention_mask=torch.tensor(b["input_mask"]),
                  token_type_ids=torch.tensor(b["segment_ids"]))
    logits = out.prediction_logits.double()
    picked = torch.take_along_dim(logits, torch.tensor(b["masked_lm_positions"]).long()[..., None], dim=1)
    nll = torch.nn.functional.cross_entropy(picked.transpose(1, 2), torch.tensor(b["masked_lm_ids"]).long(),
                                            reduction="none")
    weights = torch.tensor(b["masked_lm_weights"]).double()
    mlm += float((nll * weights).sum())
    masked += float(weights.sum())
    nsp += float(torch.nn.functional.cross_entropy(out.seq_relationship_logits.double(),
                                                   torch.tensor(b["next_sentence_labels"]).long(), reduction="sum"))
    rows += len(b["input_ids"])
  return mlm / masked, nsp / rows


@slow  # a converted checkpoint pretrained further (~25 s in the suite)
def test_continued_pretraining_starts_at_transformers_loss_and_lowers_the_domain_loss(tmp_path, capsys):
  model = _hf_folder(tmp_path / "hf", transformers.BertForPreTraining)
  general = _general_text(tmp_path / "general.txt")
  config = load_config("configs/continue.py:tiny", RUN + [f"--config.init_from={tmp_path / 'hf'}",
                                                          f"--config.data.general_eval_corpus={general}"])
  result = trainer.pretrain(config, str(tmp_path / "run"))
  out = capsys.readouterr().out
  assert "heads pooler, mlm, sentence; nsp rows" in out and "no MLM head" not in out
  with open(tmp_path / "run" / "metrics.jsonl") as f:
    evals = {r["step"]: r for r in map(json.loads, f) if r.get("eval")}
  assert sorted(evals) == [0, 20] and result["step"] == 20
  # The same held-out batches the run evaluated, through transformers' model as released.
  resolved = pretrained.with_init_from_model(pretrained.native_init_from(config, tmp_path / "run"))
  assert resolved.model.vocab_size == model.config.vocab_size and resolved.data.tokenizer == "wordpiece"
  domain = trainer.make_inputs(resolved, "eval", resolved.train.eval_batch_size)
  mlm, nsp = _hf_losses(model, domain, 2)
  np.testing.assert_allclose([evals[0]["mlm_loss"], evals[0]["nsp_loss"]], [mlm, nsp], rtol=2e-5)
  mlm, nsp = _hf_losses(model, trainer._general_inputs(resolved), 2)  # pylint: disable=protected-access
  np.testing.assert_allclose([evals[0]["general_mlm_loss"], evals[0]["general_nsp_loss"]], [mlm, nsp], rtol=2e-5)
  assert abs(evals[0]["general_mlm_loss"] - evals[0]["mlm_loss"]) > 1e-3  # two different sets
  # 20 steps on the domain lower its held-out loss well below the released model's.
  assert evals[20]["mlm_loss"] < evals[0]["mlm_loss"] - 0.4, (evals[0]["mlm_loss"], evals[20]["mlm_loss"])


def test_a_checkpoint_without_an_mlm_head_gets_a_fresh_one(tmp_path, capsys):
  """A bare BertModel (as a sentence-transformers folder holds): the run's model is its architecture with a fresh
  MLM head, said on stdout, no sentence head and FULL-SENTENCES rows, on its own vocabulary."""
  _hf_folder(tmp_path / "hf", transformers.BertModel)
  config = load_config("configs/continue.py:tiny", [f"--config.init_from={tmp_path / 'hf'}"])
  resolved = pretrained.with_init_from_model(pretrained.native_init_from(config, tmp_path / "run"))
  assert "has no MLM head" in capsys.readouterr().out
  assert resolved.model.mlm_head and resolved.model.sentence_head == "none" and resolved.model.use_pooler
  assert (resolved.model.num_layers, resolved.model.hidden_size, resolved.model.max_position_embeddings) == (2, 32, 64)
  assert resolved.data.example_builder == "full_sentences" and resolved.data.vocab.endswith("vocab.txt")
  assert resolved.data.tokenizer == "wordpiece" and resolved.data.lower_case


@slow  # two short runs (about 20 s on an idle machine); resuming is every run's (tests/test_faults.py)
def test_continued_pretraining_resumes_with_the_same_model(tmp_path, capsys):
  _hf_folder(tmp_path / "hf", transformers.BertModel)
  first = RUN + [f"--config.init_from={tmp_path / 'hf'}", "--config.train.eval_every_steps=0",
                 "--config.train.num_steps=2"]
  trainer.pretrain(load_config("configs/continue.py:tiny", first), str(tmp_path / "run"))
  saved = json.loads((tmp_path / "run" / "config.json").read_text())
  assert saved["model"]["mlm_head"] and saved["model"]["sentence_head"] == "none"
  assert saved["data"]["vocab"] == "vocab.txt"
  capsys.readouterr()
  result = trainer.pretrain(load_config("configs/continue.py:tiny", first + ["--config.train.num_steps=3"]),
                            str(tmp_path / "run"))
  assert "resumed from" in capsys.readouterr().out and result["step"] == 3


def test_continue_without_init_from_is_one_line(tmp_path):
  config = load_config("configs/continue.py:tiny")
  with pytest.raises(Exception, match="init_from is empty: continued pretraining"):
    trainer.pretrain(config, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


def test_presets_say_the_model_comes_from_init_from():
  from bert_jax import presets  # pylint: disable=import-outside-toplevel
  rows = {r["preset"]: r for r in presets.list_presets(("continue",))}
  assert rows["tiny"]["model_from"] == rows["base"]["model_from"] == "init_from"
  assert (rows["base"]["batch_size"], rows["base"]["seq_length"], rows["base"]["num_steps"]) == (192, 512, 200_000)

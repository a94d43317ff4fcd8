"""XLNet's SQuAD v2 head with beam search (head kind xlnet_beam: models/xlnet_qa.py, finetune/squad.py) against
transformers' XLNetForQuestionAnswering (a tiny random one, 2 layers, d_model 32): the beam outputs with left
padding, the training loss, `convert --from hf` / `--to hf` both ways; XLNet's SQuAD post-processing by hand;
and (weekly) a SQuAD v2 fine-tuning run with task.head=xlnet_beam through predict and export."""
import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

import bert_jax
from bert_jax import cli
from bert_jax.config_utils import load_config
from bert_jax.data_pipelines import tokenizers
from bert_jax.errors import UserError
from bert_jax.finetune import heads, squad
from bert_jax.finetune.objective import FinetuneObjective
from core_helpers import slow
import test_xlnet_finetune as finetune_test

spiece = finetune_test.spiece  # the trained SentencePiece model (a module fixture) for the weekly run
VOCAB, T = 60, 12
START_N_TOP, END_N_TOP = 3, 2


def _hf_qa(directory):
  """A random XLNetForQuestionAnswering saved to `directory`; biases and LayerNorms drawn large enough to matter."""
  config = transformers.XLNetConfig(vocab_size=VOCAB, d_model=32, n_layer=2, n_head=4, d_inner=37,
                                    start_n_top=START_N_TOP, end_n_top=END_N_TOP)
  torch.manual_seed(0)
  model = transformers.XLNetForQuestionAnswering(config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith(("_bias", "seg_embed", "mask_emb", ".bias")) or "LayerNorm" in name:
        p.normal_(0.0 if name.endswith("bias") or "_bias" in name else 1.0, 0.3)
      elif name.startswith(("start_logits", "end_logits", "answer_class")):
        p.normal_(0.0, 0.5)
  model.save_pretrained(directory)
  return model


def _batch():
  """Left-padded rows (12, 8 and 6 real tokens; pad id 5), XLNet's a <sep> b <sep> <cls> token types."""
  rng = np.random.RandomState(0)
  ids = rng.randint(6, VOCAB, (3, T))
  mask = np.ones((3, T), np.int64)
  mask[1, :4] = mask[2, :6] = 0
  ids[mask == 0] = 5
  types = np.zeros_like(ids)
  types[:, 8:] = 1
  types[:, -1] = 2
  return ids, mask, types


def _torch(**arrays):
  return {k: torch.tensor(v) for k, v in arrays.items()}


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
  """(transformers' model, its folder, our FinetuneModel and the params load_pretrained gives)."""
  directory = tmp_path_factory.mktemp("xlnet_qa") / "hf"
  reference = _hf_qa(directory)
  model, params = bert_jax.load_pretrained(str(directory))
  assert "head" in params and "mlm_head" not in params
  return reference, directory, heads.FinetuneModel(model.config, "xlnet_beam", 2), params


def test_beam_outputs_match_transformers_with_left_padding(loaded):  # pylint: disable=redefined-outer-name
  reference, _, model, params = loaded
  assert (model.config.start_n_top, model.config.end_n_top) == (START_N_TOP, END_N_TOP)
  ids, mask, types = _batch()
  with torch.no_grad():  # p_mask: the padding, which our head masks out
    want = reference(**_torch(input_ids=ids, attention_mask=mask, token_type_ids=types),
                     p_mask=torch.tensor(1.0 - mask, dtype=torch.float32))
  got = jax.jit(model.apply)({"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
  assert got["end_top_index"].shape == (3, START_N_TOP * END_N_TOP)
  for name in ("start_top_index", "end_top_index"):
    np.testing.assert_array_equal(np.asarray(got[name]), getattr(want, name).numpy(), err_msg=name)
  for name in ("start_top_log_probs", "end_top_log_probs", "cls_logits"):
    np.testing.assert_allclose(np.asarray(got[name]), getattr(want, name).numpy(), atol=1e-4, rtol=0, err_msg=name)
  assert np.all(np.asarray(got["start_top_index"]) >= np.array([[0], [4], [6]]))  # never a padded position
  assert np.abs(want.cls_logits.numpy()).max() > 0.1 and want.start_top_log_probs.numpy().min() < 0.9


def test_training_loss_matches_transformers(loaded):  # pylint: disable=redefined-outer-name
  """(start CE + end CE, the end conditioned on the gold start) / 2 + 0.5 * the answer class's BCE, as
  transformers' total_loss with cls_index (<cls>, the last position) and is_impossible."""
  reference, _, model, params = loaded
  ids, mask, types = _batch()
  starts, ends = np.array([2, T - 1, 7], np.int64), np.array([4, T - 1, 9], np.int64)
  impossible = (starts == T - 1).astype(np.float32)
  with torch.no_grad():
    want = reference(**_torch(input_ids=ids, attention_mask=mask, token_type_ids=types, start_positions=starts,
                              end_positions=ends, is_impossible=impossible, cls_index=np.full(3, T - 1)),
                     p_mask=torch.tensor(1.0 - mask, dtype=torch.float32)).loss.item()
  objective = FinetuneObjective(model)
  batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types, "start_positions": starts,
           "end_positions": ends, "is_impossible": impossible}
  batch = {k: jnp.asarray(v, jnp.float32 if k == "is_impossible" else jnp.int32) for k, v in batch.items()}
  loss = jax.jit(lambda p, b: objective.loss(objective.sums(p, b, None, True), objective.counts(b)))
  got = float(loss(params, batch))
  assert abs(got - want) < 1e-4, (got, want)
  flipped = dict(batch, is_impossible=1.0 - batch["is_impossible"])  # the answer class's term counts
  assert abs(float(loss(params, flipped)) - got) > 0.01


def test_convert_round_trip(tmp_path, capsys, loaded):  # pylint: disable=redefined-outer-name
  reference, directory, _, _ = loaded
  capsys.readouterr()
  assert cli.main(["convert", "--from", "hf", str(directory), str(tmp_path / "native")]) == 0
  out = capsys.readouterr().out
  assert "ignored tensors" not in out and "no weights for mlm" in out
  saved = json.loads((tmp_path / "native" / "config.json").read_text())
  assert saved["task"]["head"] == "xlnet_beam"
  assert cli.main(["convert", "--to", "hf", str(tmp_path / "native"), str(tmp_path / "back")]) == 0
  assert "no place for" not in capsys.readouterr().out
  config = json.loads((tmp_path / "back" / "config.json").read_text())
  assert config["architectures"] == ["XLNetForQuestionAnswering"]
  assert (config["start_n_top"], config["end_n_top"]) == (START_N_TOP, END_N_TOP)
  back = safetensors.numpy.load_file(tmp_path / "back" / "model.safetensors")
  theirs = {k: v.numpy() for k, v in reference.state_dict().items()}
  assert set(back) == set(theirs)
  for name, value in theirs.items():
    np.testing.assert_array_equal(back[name], value, err_msg=name)
  reloaded = transformers.XLNetForQuestionAnswering.from_pretrained(tmp_path / "back").eval()
  assert reloaded.start_n_top == START_N_TOP


def _window_outputs(start_probs, start_index, end_probs, end_index, cls_logit):
  return {"start_top_log_probs": np.asarray([start_probs], np.float32), "start_top_index": np.asarray([start_index]),
          "end_top_log_probs": np.asarray([end_probs], np.float32), "end_top_index": np.asarray([end_index]),
          "cls_logits": np.asarray([cls_logit], np.float32)}


def test_beam_answers_by_hand():
  """One window whose context tokens sit at positions 4..7 (words "a bb ccc dd"): the end of start i, rank j,
  is at j * k1 + i; candidates outside the context, ending before their start or too long are dropped; the
  best is the highest log p(start) + log p(end); v2.0 answers "" when the answer class's logit > threshold."""
  context = "a bb ccc dd"
  spans = np.array([[0, 1], [2, 4], [5, 8], [9, 11]])
  example = squad.Example("q", "?", context, [])
  window = squad.Window(0, 0, 4, 4, np.ones(4, bool), null=9)
  featurized = squad.Featurized({}, [window], [spans])
  task = ml_collections.ConfigDict({"version": "v2.0", "null_score_diff_threshold": 0.0, "max_answer_length": 2})
  # starts: 5 (p .5), 2 (question: out, p .3), 6 (p .2); ends by rank then start: [5->6, 2->3, 6->6 | 5->5, 2->4, 6->7]
  outputs = _window_outputs([0.5, 0.3, 0.2], [5, 2, 6], [0.6, 0.9, 0.5, 0.3, 0.1, 0.5], [6, 3, 6, 5, 4, 7], -1.0)
  decoded = squad.beam_answers(outputs, [example], featurized, task)
  assert decoded.answers == {"q": "bb ccc"} and decoded.null_diff == {"q": -1.0}
  np.testing.assert_allclose(decoded.scores["q"], np.log(0.5) + np.log(0.6), rtol=1e-6)
  outputs["end_top_log_probs"][0, 0] = 0.2  # 5->6 now loses to 5->5 (0.3): "bb"; 6->7 (0.2 * 0.5) is lower
  assert squad.beam_answers(outputs, [example], featurized, task).answers == {"q": "bb"}
  outputs["cls_logits"][0] = 0.5
  decoded = squad.beam_answers(outputs, [example], featurized, task)
  assert decoded.answers == {"q": ""} and decoded.null_diff == {"q": 0.5}


def test_beam_head_refuses_a_cls_first_layout():
  task = {"family": "squad", "name": "squad_v2", "version": "v2.0", "head": "xlnet_beam", "doc_stride": 8,
          "max_query_length": 8, "n_best_size": 5, "max_answer_length": 5, "null_score_diff_threshold": 0.0}
  config = ml_collections.ConfigDict({"task": task, "data": {"max_seq_length": 32}, "predict_split": "dev"})

  class BertTokenizer:  # no layout: BERT's, [CLS] first
    kind = "wordpiece"

  with pytest.raises(UserError, match="task.head=xlnet_beam reads the answer class at <cls>"):
    squad.build(config, BertTokenizer(), need_train=False)


def test_squad_training_rows_carry_is_impossible(tmp_path, spiece):  # pylint: disable=redefined-outer-name
  """task.head=xlnet_beam: is_impossible is 1 exactly on the rows pointing at <cls> (the last position: the
  unanswerable questions and the windows without the answer), and the task trains the xlnet_beam head."""
  data = finetune_test._squad_files(tmp_path / "data")  # pylint: disable=protected-access
  config = load_config("configs/squad.py:v2", [f"--config.data.data_dir={data}", "--config.data.max_seq_length=24",
                                               "--config.task.head=xlnet_beam", "--config.task.doc_stride=4",
                                               "--config.task.max_query_length=8"])
  task = squad.build(config, tokenizers.load_tokenizer(str(spiece), False, kind="xlnet_spm"), need_train=True)
  assert task.head == "xlnet_beam"
  rows = task.train
  at_cls = rows["start_positions"] == rows["input_ids"].shape[1] - 1
  np.testing.assert_array_equal(rows["is_impossible"], at_cls.astype(np.float32))
  assert rows["is_impossible"].dtype == np.float32 and 0 < at_cls.sum() < len(at_cls)
  assert (rows["input_ids"][:, -1] == 3).all()  # <cls> last


@slow  # ~1 min on a loaded 2-core machine: a fine-tuning run, predict, its export and transformers' model
def test_squad_v2_finetune_predict_and_export(tmp_path, spiece):  # pylint: disable=redefined-outer-name
  """`bert-jax finetune` of SQuAD v2.0 with task.head=xlnet_beam from the HF XLNet folder: every question gets
  a prediction, and the exported XLNetForQuestionAnswering gives the Predictor's beam outputs."""
  folder = finetune_test._hf_folder(tmp_path, spiece)  # pylint: disable=protected-access
  run = tmp_path / "squad"
  data = finetune_test._squad_files(tmp_path / "data")  # pylint: disable=protected-access
  assert cli.main(["finetune", "--config", "configs/squad.py:v2", "--workdir", str(run), f"--config.init_from={folder}",
                   f"--config.data.data_dir={data}", "--config.task.doc_stride=8",
                   "--config.task.max_query_length=8", "--config.task.head=xlnet_beam", *finetune_test.FINETUNE]) == 0
  with open(run / "predictions" / "predictions.dev.json") as f:
    assert set(json.load(f)) == {f"q{i}" for i in range(16)}
  assert json.loads((run / "config.json").read_text())["task"]["head"] == "xlnet_beam"
  predictor = bert_jax.Predictor.load(str(run))
  questions = [{"id": "x", "question": "which word comes first?", "context": "The cat paid in 1990, they say."},
               {"id": "y", "question": "who?", "context": "Ångström paid."}]
  features, decode = predictor.featurize(predictor.normalize(questions))
  ours = predictor.run(features)
  records = decode(ours)
  assert [r["id"] for r in records] == ["x", "y"] and all(np.isfinite(r["null_score_diff"]) for r in records)
  assert cli.main(["convert", "--to", "hf", str(run), str(tmp_path / "squad_hf")]) == 0
  model = transformers.XLNetForQuestionAnswering.from_pretrained(tmp_path / "squad_hf").eval()
  with torch.no_grad():
    theirs = model(**{k: torch.tensor(features[k]) for k in ("input_ids", "attention_mask", "token_type_ids")},
                   p_mask=torch.tensor(1.0 - features["attention_mask"], dtype=torch.float32))
  for name in ("start_top_index", "end_top_index"):
    np.testing.assert_array_equal(ours[name], getattr(theirs, name).numpy(), err_msg=name)
  for name in ("start_top_log_probs", "end_top_log_probs", "cls_logits"):
    np.testing.assert_allclose(ours[name], getattr(theirs, name).numpy(), atol=1e-5, rtol=0, err_msg=name)

"""XLNet's segment memory at fine-tuning (task.memory_segments, bert_jax/finetune/memory.py; the model's
window_len, models/xlnet.py): N windows in one forward against transformers' XLNet run window by window with
`mems` (logits, hidden states and the memory), padding in the memory masked (a row's logits do not depend on
the windows of padding before it, and equal transformers' on the text alone), no gradient into the memory, the
refusals, and a `bert-jax finetune` run with memory that `predict` reads; and pretraining's evaluation carrying
the memory from batch to batch as training does."""
import io
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import sentencepiece as spm
import torch
import transformers

import bert_jax
import data_fixtures
import test_xlnet
import test_xlnet_memory
from bert_jax import cli, params_checkpoint
from bert_jax.config_utils import load_config
from bert_jax.errors import UserError
from bert_jax.finetune import heads, memory
from bert_jax.models.xlnet import XLNetConfig, XLNetModel
from bert_jax.training import objectives, partitioning, step, trainer
from core_helpers import slow

VOCAB, W, MEM = 50, 6, 8  # vocabulary, window length, memory length (> W: the memory spans two windows)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  """(transformers' model, ours, its params, our XLNetModel with windows), on the same weights."""
  tmp_path = tmp_path_factory.mktemp("xlnet_memory")
  hf_model = _hf_classifier(tmp_path)
  return (hf_model, *_ours(tmp_path, hf_model))


def _hf_classifier(tmp_path):
  """A tiny random XLNetForSequenceClassification (2 layers, d_model 32, mem_len 8, 3 labels) saved to
  tmp_path/hf, its weights drawn wide (initializer_range 0.2) and its biases and segment embeddings large
  enough to matter, so that the memory moves the logits."""
  config = transformers.XLNetConfig(vocab_size=VOCAB, d_model=32, n_layer=2, n_head=4, d_inner=37, mem_len=MEM,
                                    num_labels=3, initializer_range=0.2)
  torch.manual_seed(0)
  model = test_xlnet.widen(transformers.XLNetForSequenceClassification(config).eval(),
                           ("summary.bias", "logits_proj.bias"))
  model.save_pretrained(tmp_path / "hf")
  return model


def _ours(tmp_path, hf_model):
  """Our classification model with windows of W over the same weights: (FinetuneModel, params, XLNetModel)."""
  encoder, backbone = bert_jax.load_pretrained(str(tmp_path / "hf"))
  config = heads.encoder_config(encoder.config.replace(window_len=W), "classification", "pooled")
  assert config.mem_len == MEM
  model = heads.FinetuneModel(config, "classification", 3)
  t = lambda x: np.asarray(x.detach().numpy())  # noqa: E731
  head = {"summary": {"dense": {"kernel": t(hf_model.sequence_summary.summary.weight).T,
                                "bias": t(hf_model.sequence_summary.summary.bias)}},
          "classifier": {"kernel": t(hf_model.logits_proj.weight).T, "bias": t(hf_model.logits_proj.bias)}}
  params = {**backbone, "head": head}
  ids = jnp.zeros((1, 3 * W), jnp.int32)
  abstract = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), ids, ids + 1, ids))["params"]
  assert jax.tree.map(lambda a: a.shape, abstract) == jax.tree.map(np.shape, params)
  return model, params, XLNetModel(config)


def _hf_windows(hf_model, ids, mask, types):
  """transformers window by window, each with the memory of the ones before: (last window's logits, every
  window's last hidden states side by side, the final memory [L, B, MEM, H])."""
  mems, states = None, []
  for start in range(0, ids.shape[1], W):
    part = lambda x, start=start: torch.tensor(x[:, start:start + W])  # noqa: E731
    with torch.no_grad():
      out = hf_model(part(ids), attention_mask=part(mask), token_type_ids=part(types), mems=mems, use_mems=True,
                     output_hidden_states=True)
    mems = out.mems
    states.append(out.hidden_states[-1].numpy())
  return out.logits.numpy(), np.concatenate(states, axis=1), np.stack([m.transpose(0, 1).numpy() for m in mems])


def test_windows_match_transformers_window_by_window(models):
  """Rows of three full windows (no padding): the logits of the last window's summary, every window's hidden
  states and the memory handed on equal transformers' windows run one after another with mems=."""
  hf_model, model, params, encoder = models
  ids = np.random.RandomState(0).randint(6, VOCAB, (2, 3 * W))
  mask = np.ones_like(ids)
  types = np.zeros_like(ids)
  types[:, -4:] = 1
  types[:, -1] = 2  # XLNet's a <sep> b <sep> <cls>: <cls> at the end of the last window
  want_logits, want_states, want_mems = _hf_windows(hf_model, ids, mask, types)
  inputs = [jnp.asarray(x) for x in (ids, mask, types)]
  logits = jax.jit(model.apply)({"params": params}, *inputs)["logits"]
  np.testing.assert_allclose(logits, want_logits, atol=1e-5, rtol=0)
  out = jax.jit(encoder.apply)({"params": {k: v for k, v in params.items() if k != "head"}}, *inputs)
  np.testing.assert_allclose(out.last_hidden_state, want_states, atol=1e-5, rtol=0)
  np.testing.assert_allclose(out.mems, want_mems, atol=1e-5, rtol=0)
  # the memory matters: the last window alone (no memory) gives other logits
  with torch.no_grad():
    alone = hf_model(*(torch.tensor(x[:, -W:]) for x in (ids, mask)), token_type_ids=torch.tensor(types[:, -W:]))
  assert np.abs(alone.logits.numpy() - want_logits).max() > 1e-3


def test_padding_in_memory_is_masked(models):
  """A left-padded text in the last window: the same logits after one or two windows of padding, and
  transformers' on the text alone (its always-visible memory would let the padding in)."""
  hf_model, model, params, _ = models
  text = np.random.RandomState(1).randint(6, VOCAB, (2, 5))
  text_types = np.array([[0, 0, 1, 1, 2]] * 2)

  def padded(windows):
    ids = np.full((2, windows * W), 5)
    mask, types = np.zeros_like(ids), np.zeros_like(ids)
    ids[:, -5:], mask[:, -5:], types[:, -5:] = text, 1, text_types
    return ids, mask, types

  apply = jax.jit(model.apply)
  two, three = (apply({"params": params}, *map(jnp.asarray, padded(n)))["logits"] for n in (2, 3))
  np.testing.assert_allclose(two, three, atol=1e-5, rtol=0)
  with torch.no_grad():
    alone = hf_model(torch.tensor(text), token_type_ids=torch.tensor(text_types)).logits.numpy()
  np.testing.assert_allclose(three, alone, atol=1e-5, rtol=0)
  visible, _, _ = _hf_windows(hf_model, *padded(3))
  assert np.abs(visible - alone).max() > 1e-3  # what masking the memory's padding changes


def test_no_gradient_flows_into_the_memory(models):
  """Tokens only in the first window reach the last window's logits through the memory alone: their
  embeddings get no gradient (stop-gradient, as XLNet), though changing them changes the logits."""
  _, model, params, _ = models
  rng = np.random.RandomState(2)
  ids = np.concatenate([rng.randint(6, 20, (2, W)), rng.randint(20, VOCAB, (2, 2 * W))], axis=1)
  mask, types = np.ones_like(ids), np.zeros_like(ids)

  def loss(p, ids):
    return jnp.sum(model.apply({"params": p}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))["logits"] ** 2)

  value_and_grad = jax.jit(jax.value_and_grad(loss))  # one compile for both calls
  value, grads = value_and_grad(params, ids)
  grads = grads["embeddings"]["word_embeddings"]["embedding"]
  first, later = np.unique(ids[:, :W]), np.unique(ids[:, W:])
  assert np.all(grads[first] == 0) and np.abs(grads[later]).max() > 1e-4
  changed = ids.copy()
  changed[:, :W] = rng.randint(6, 20, (2, W))
  assert abs(float(value_and_grad(params, changed)[0]) - float(value)) > 1e-4


def _config(**task):
  return ml_collections.ConfigDict({"job": "finetune", "task": {"memory_segments": 2, "memory_len": 0, **task},
                                    "data": {"max_seq_length": 16, "length_buckets": ()}})


def test_what_memory_refuses_is_one_line():
  from bert_jax.models.config import ModelConfig  # pylint: disable=import-outside-toplevel
  xlnet = XLNetConfig(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=37)
  cases = [(lambda: memory.validate(_config(memory_segments=-1)), "must be >= 0"),
           (lambda: memory.model_config(_config(), ModelConfig(), "classification"), "segment memory is XLNet's"),
           (lambda: memory.model_config(_config(), xlnet, "classification"), "the model's mem_len is 0"),
           (lambda: memory.model_config(_config(), xlnet.replace(mem_len=4), "span"), "SQuAD windows"),
           (lambda: memory.validate(ml_collections.ConfigDict({**_config().to_dict(), "job": "distill"})),
            "job finetune"),
           (lambda: XLNetConfig(window_len=8), "model.mem_len"),
           (lambda: objectives.make_objective(load_config("configs/xlnet.py:tiny", [
               "--config.model.window_len=16", "--config.model.mem_len=16"])), "pretraining carries the memory")]
  for call, message in cases:
    with pytest.raises(UserError, match=message) as error:
      call()
    assert "\n" not in str(error.value)
  got = memory.model_config(_config(memory_len=12), xlnet, "token")
  assert (got.window_len, got.mem_len) == (16, 12)
  assert memory.model_config(_config(memory_segments=0), got, "token").window_len == 0  # off: no windows
  assert memory.model_config(_config(memory_segments=0), ModelConfig(), "token") == ModelConfig()


def _xlnet_folder(tmp_path):
  """A tiny random XLNetLMHeadModel (2 layers, d_model 32, no memory of its own) with a SentencePiece
  vocabulary in XLNet's id layout trained here, saved as a Hugging Face folder."""
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(data_fixtures.real_sentences(600)), model_writer=model, vocab_size=400,
      model_type="unigram", unk_id=0, bos_id=1, eos_id=2, pad_id=5, control_symbols=["<cls>", "<sep>", "<mask>"],
      user_defined_symbols=["<eop>", "<eod>"], minloglevel=2)
  config = transformers.XLNetConfig(vocab_size=400, d_model=32, n_layer=2, n_head=4, d_inner=37, pad_token_id=5)
  torch.manual_seed(0)
  folder = tmp_path / "hf"
  transformers.XLNetLMHeadModel(config).save_pretrained(folder)
  (folder / "spiece.model").write_bytes(model.getvalue())
  (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "XLNetTokenizer",
                                                            "do_lower_case": False, "padding_side": "left"}))
  return folder


@slow  # ~1 min on a loaded 2-core machine: a fine-tuning run with its evaluations and predict
def test_finetune_with_memory_trains_and_predict_reads_it(tmp_path):
  """`bert-jax finetune` on the embedded task from an XLNet folder with task.memory_segments=3 of 16 tokens and
  a memory of 16: config.json keeps the windows, predict builds rows of 48 (<cls> last, left padding) and
  gives the windowed model's logits, not those of the same weights without memory."""
  folder, run = _xlnet_folder(tmp_path), tmp_path / "run"
  assert cli.main(["finetune", "--config", "configs/glue.py:embedded", "--workdir", str(run),
                   f"--config.init_from={folder}", "--config.task.num_train=64", "--config.task.num_dev=16",
                   "--config.task.memory_segments=3", "--config.task.memory_len=16", "--config.data.max_seq_length=16",
                   "--config.train.batch_size=8", "--config.train.epochs=1", "--config.train.eval_batch_size=16",
                   "--config.train.tensorboard=false"]) == 0
  saved = json.loads((run / "config.json").read_text())
  assert (saved["model"]["window_len"], saved["model"]["mem_len"], saved["task"]["memory_segments"]) == (16, 16, 3)
  assert "accuracy" in json.loads((run / "eval_results.json").read_text())
  predictor = bert_jax.Predictor.load(str(run))
  sentences = [data_fixtures.real_sentences(40)[-1] * 2, "short"]
  features, _ = predictor.featurize(predictor.normalize(sentences))
  assert features["input_ids"].shape == (2, 48) and (features["input_ids"][:, -1] == 3).all()  # <cls> last
  assert features["attention_mask"][1, 0] == 0 and features["attention_mask"][0, 0] == 1  # the long one fills 3
  logits = predictor.outputs(sentences)["logits"]
  params, config = params_checkpoint.load_params(str(run))
  inputs = [jnp.asarray(features[k]) for k in ("input_ids", "attention_mask", "token_type_ids")]
  for window_len, same in ((16, True), (0, False)):
    model = heads.FinetuneModel(XLNetConfig(**{**config["model"], "window_len": window_len}), "classification", 2)
    got = np.asarray(model.apply({"params": params}, *inputs)["logits"])
    assert np.allclose(got, logits, atol=1e-5) == same


@slow  # the xlnet_stream input and two eval steps (~16 s alone); the train step's carry is test_xlnet_memory's
def test_pretraining_evaluation_carries_the_memory(tmp_path):
  """The held-out batches of xlnet_stream are streams too: evaluation carries each row's memory from batch to
  batch, from zeros, as training does (each eval step given the previous one's memory), which changes the loss
  against starting every batch from zeros."""
  corpus, _ = test_xlnet_memory._corpus(tmp_path)  # pylint: disable=protected-access
  b = test_xlnet_memory.B
  config = load_config("configs/xlnet.py:tiny", test_xlnet_memory.SMALL + [
      f"--config.data.corpus={corpus}", f"--config.data.eval_corpus={corpus}", "--config.train.eval_steps=2",
      f"--config.train.eval_batch_size={b}"])
  setup = step.build_train_setup(config)
  rng = np.random.default_rng(0)  # weights wide enough that the memory moves the loss
  params = jax.tree.map(lambda x: rng.normal(0.0, 0.3, x.shape).astype(np.float32),
                        setup.init_params(jax.random.key(0)))
  inputs = trainer.make_inputs(config, "eval", b)
  inputs.save(str(tmp_path / "start"))
  got = trainer.evaluate(setup, params, inputs, str(tmp_path / "start"))
  inputs.restore(str(tmp_path / "start"))
  zeros = jnp.zeros((b, 2, test_xlnet_memory.MEM, 32))
  carry, totals, fresh = zeros, [], []
  for _ in range(2):
    batch = partitioning.global_batch(next(inputs), setup.mesh)
    out = setup.eval_step(params, {**batch, objectives.CARRY: carry})
    carry = out.pop(objectives.CARRY)
    totals.append(out)
    fresh.append(setup.eval_step(params, {**batch, objectives.CARRY: zeros})["sum/plm_loss"])
  assert np.abs(np.asarray(carry)).max() > 0.1
  count = sum(float(t["count/plm"]) for t in totals)
  assert got["plm_loss"] == pytest.approx(sum(float(t["sum/plm_loss"]) for t in totals) / count, rel=1e-5)
  assert abs(sum(map(float, fresh)) / count - got["plm_loss"]) > 1e-4

"""ModernBERT: Hugging Face's ModernBertForMaskedLM / ModernBertModel (tiny, random, built here) against
load_pretrained and the export; packed rows against their documents run alone; the presets' sizes;
the tiny preset trains on the embedded corpus (BERT_JAX_SLOW_TESTS)."""
import functools
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import torch
import transformers
from core_helpers import slow

import bert_jax
from bert_jax.data_pipelines.masking import MaskingConfig, mask_batch, rates_at, row_keys
from bert_jax import cli
from bert_jax.config_utils import load_config
from bert_jax.conversion import common, hf, native
from bert_jax.data_pipelines import embedded
from bert_jax.finetune import modes
from bert_jax.conversion.params import param_shapes
from bert_jax.models import ModernBertConfig, ModernBertModel, build, families, model_config
from bert_jax.training import benchmark, objectives, partitioning, trainer
from bert_jax.training.objectives.base import mlm_sums
from bert_jax.training.step import build_train_setup

VOCAB = 96
# The hidden check's shape: 4 layers, a window of 8 (4 either side), global attention every 2nd layer.
HF_TINY = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=2,
               local_attention=8, global_attn_every_n_layers=2, max_position_embeddings=128, pad_token_id=0,
               bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)


def _hf_dir(tmp_path, cls, seed=0):
  torch.manual_seed(seed)
  model = cls(transformers.ModernBertConfig(**HF_TINY, attn_implementation="eager")).eval()
  with torch.no_grad():  # norms away from 1, so a norm read as ones (or skipped) shows
    for p in model.parameters():
      p.add_(0.05 * torch.randn_like(p))
  model.save_pretrained(tmp_path)
  return model


def _padded_batch(seed=0, batch=3, length=24):
  rng = np.random.RandomState(seed)
  ids = rng.randint(3, VOCAB, (batch, length))
  mask = np.ones((batch, length), np.int64)
  mask[1, 15:] = 0
  mask[2, 5:] = 0
  return ids * mask, mask


@pytest.mark.parametrize("scan_layers", [True, False])
def test_load_pretrained_matches_transformers_with_padding(tmp_path, scan_layers):
  reference = _hf_dir(tmp_path, transformers.ModernBertForMaskedLM)
  ids, mask = _padded_batch()
  with torch.no_grad():
    want = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), output_hidden_states=True,
                     output_attentions=True)
  model, params = bert_jax.load_pretrained(str(tmp_path), scan_layers=scan_layers)
  assert isinstance(model, ModernBertModel) and model.config.global_every == 2 and model.config.window == 4
  apply = jax.jit(model.apply, static_argnames="output_attentions")
  out = apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), output_attentions=True)
  real = mask > 0
  np.testing.assert_allclose(np.asarray(out.mlm_logits)[real], want.logits.numpy()[real], atol=1e-5, rtol=0)
  np.testing.assert_allclose(np.asarray(out.last_hidden_state)[real], want.hidden_states[-1].numpy()[real],
                             atol=1e-5, rtol=0)
  # Each layer's probabilities at real queries: the windows (layers 1, 3) and the padding as HF masks them.
  for layer in range(4):
    got, ref = np.asarray(out.attentions[layer]), want.attentions[layer].numpy()
    np.testing.assert_allclose(got.transpose(0, 2, 1, 3)[real], ref.transpose(0, 2, 1, 3)[real], atol=1e-6)
  assert np.all(np.asarray(out.attentions[1])[0, :, 0, 5:] == 0)  # beyond 4 positions: outside the window


def test_bare_model_export_and_reload_through_transformers(tmp_path):
  """ModernBertModel (no MLM head, no prefix) in; our export loads in transformers with the same states."""
  reference = _hf_dir(tmp_path / "in", transformers.ModernBertModel, seed=1)
  ids, mask = _padded_batch(seed=1)
  converted = bert_jax.pretrained.read_checkpoint(str(tmp_path / "in"))
  assert converted.missing_heads == ("mlm",) and not converted.config.mlm_head
  hf.write(str(tmp_path / "out"), converted)
  # The reference's attention kernel (eager; the default, sdpa, differs in the last bits).
  reloaded = transformers.ModernBertModel.from_pretrained(tmp_path / "out", attn_implementation="eager").eval()
  theirs, ours = reference.state_dict(), reloaded.state_dict()
  assert theirs.keys() == ours.keys()
  for name in theirs:
    np.testing.assert_array_equal(ours[name].numpy(), theirs[name].numpy(), err_msg=name)
  with torch.no_grad():
    want = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
    again = reloaded(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
  real = mask > 0
  np.testing.assert_array_equal(again[real], want[real])
  config = json.loads((tmp_path / "out" / "config.json").read_text())
  assert config["layer_types"][:2] == ["full_attention", "sliding_attention"] and config["local_attention"] == 8


def test_native_checkpoint_round_trip_through_the_record(tmp_path, capsys):
  """HF -> a bert_jax params checkpoint -> load_pretrained unrolled gives HF's logits; ModernBERT is a family
  record (found by its HF model_type), with no original TF layout: a TF export is refused in one line."""
  reference = _hf_dir(tmp_path / "in", transformers.ModernBertForMaskedLM, seed=2)
  ids, mask = _padded_batch(seed=2)
  native.write(str(tmp_path / "native"), bert_jax.pretrained.read_checkpoint(str(tmp_path / "in")))
  assert json.loads((tmp_path / "native" / "config.json").read_text())["heads"] == ["mlm"]
  model, params = bert_jax.load_pretrained(str(tmp_path / "native"), scan_layers=False)
  assert isinstance(model, ModernBertModel) and "layer_3" in params["encoder"]
  with torch.no_grad():
    want = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
  got = np.asarray(jax.jit(model.apply)({"params": params}, jnp.asarray(ids), jnp.asarray(mask)).mlm_logits)
  np.testing.assert_allclose(got[mask > 0], want[mask > 0], atol=1e-5, rtol=0)
  assert families.get("modernbert") is families.by_model_type("modernbert", "test")
  assert families.get("modernbert").config is ModernBertConfig and families.get("modernbert").tf is None
  capsys.readouterr()
  assert cli.main(["convert", "--to", "tf", str(tmp_path / "native"), str(tmp_path / "tf")]) == 2
  err = capsys.readouterr().err
  assert "modernbert has no original TF checkpoint" in err and len(err.strip().splitlines()) == 1, err


def test_a_fine_tuned_hf_model_loads_its_encoder_and_names_its_head(tmp_path, capsys):
  """ModernBertForSequenceClassification's head.* share the MLM head's names: its encoder loads (HF's
  states), its head is named as ignored, and no MLM head is read from it."""
  reference = _hf_dir(tmp_path, transformers.ModernBertForSequenceClassification, seed=3)
  ids, mask = _padded_batch(seed=3)
  model, params = bert_jax.load_pretrained(str(tmp_path))
  assert not model.config.mlm_head and "mlm_head" not in params
  assert "ignored tensors without a bert_jax counterpart: classifier.bias" in capsys.readouterr().out
  with torch.no_grad():
    want = reference.model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
  got = np.asarray(jax.jit(model.apply)({"params": params}, jnp.asarray(ids), jnp.asarray(mask)).last_hidden_state)
  np.testing.assert_allclose(got[mask > 0], want[mask > 0], atol=1e-5, rtol=0)


def test_embedder_mean_pools_a_modernbert_checkpoint(tmp_path):
  """bert_jax.Embedder on a HF ModernBertModel folder (with a WordPiece vocab.txt): mean pooling of
  transformers' last hidden states over [CLS] tokens [SEP]."""
  reference = _hf_dir(tmp_path, transformers.ModernBertModel, seed=4)
  words = [f"w{i}" for i in range(VOCAB - 5)]
  (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
  sentences = ["w3 w7 w11 w5", "w40", "w8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18"]
  embedder = bert_jax.Embedder.load(str(tmp_path), batch_size=4, buckets=(128,))
  got = embedder(sentences)
  for sentence, vector in zip(sentences, got):
    ids = torch.tensor([[2, *(5 + int(w[1:]) for w in sentence.split()), 3]])
    with torch.no_grad():
      want = reference(input_ids=ids).last_hidden_state[0].mean(0).numpy()
    np.testing.assert_allclose(vector, want, atol=1e-5, rtol=0)


@slow  # a fine-tuning run, predict, an export and transformers on it: about a minute on two cores
def test_finetune_predict_and_export_a_tiny_modernbert(tmp_path, capsys):
  """A tiny ModernBERT params checkpoint (the embedded vocabulary) fine-tunes on the embedded task through
  the CLI; predict runs on its workdir; `convert --to hf` gives a ModernBertForSequenceClassification
  whose logits are predict's."""
  vocab = embedded.ensure_embedded()[1]
  with open(vocab, encoding="utf-8") as f:
    size = sum(1 for _ in f)
  config = _tiny(vocab_size=size, max_position_embeddings=64)
  params = jax.device_get(nn.meta.unbox(jax.jit(ModernBertModel(config).init)(
      jax.random.key(0), jnp.ones((1, 8), jnp.int32))["params"]))
  native.write(str(tmp_path / "mb"), common.Converted("modernbert", config, params,
                                                      common.Tokenizer("wordpiece", True, {"vocab.txt": vocab})))
  ft, hf_dir = str(tmp_path / "ft"), str(tmp_path / "hf")
  assert cli.main(["finetune", "--config", "configs/glue.py:embedded", "--workdir", ft,
                   f"--config.init_from={tmp_path / 'mb'}", "--config.data.max_seq_length=32",
                   "--config.data.train_limit=64", "--config.data.eval_limit=32", "--config.train.batch_size=16",
                   "--config.train.eval_batch_size=32", "--config.train.epochs=1"]) == 0
  sentences = ["the cat sat on the mat", "a dog ran", "words in an order"]
  (tmp_path / "in.txt").write_text("".join(s + "\n" for s in sentences))
  assert cli.main(["predict", "--model", ft, "--input", str(tmp_path / "in.txt"),
                   "--output", str(tmp_path / "out.jsonl")]) == 0
  with open(tmp_path / "out.jsonl") as f:
    records = [json.loads(line) for line in f]
  assert len(records) == 3 and all("scores" in r for r in records)
  assert cli.main(["convert", "--to", "hf", ft, hf_dir]) == 0
  assert "not written" not in capsys.readouterr().out
  theirs = transformers.AutoModelForSequenceClassification.from_pretrained(hf_dir, attn_implementation="eager")
  assert type(theirs).__name__ == "ModernBertForSequenceClassification"
  tokenizer = bert_jax.load_tokenizer(ft)
  special = tokenizer.special_ids
  for sentence, record in zip(sentences, records):
    ids = torch.tensor([[special["[CLS]"], *tokenizer.encode(sentence), special["[SEP]"]]])
    with torch.no_grad():
      logits = theirs.eval()(input_ids=ids).logits[0].numpy()
    probabilities = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    np.testing.assert_allclose(sorted(record["scores"].values()), sorted(probabilities), atol=1e-5)
    assert record["score"] == pytest.approx(probabilities.max(), abs=1e-5)


def test_adapters_are_refused_and_feature_mode_drops_every_dropout():
  """train.mode through the record: ModernBERT has no Houlsby adapters (one line); feature mode's dropout-off
  reaches its embedding, MLP and attention dropouts (with_dropout)."""
  config = _tiny(embedding_dropout=0.1, mlp_dropout=0.1, attention_dropout=0.1)
  with pytest.raises(bert_jax.errors.UserError, match="train.mode=adapters: .* a modernbert model has none"):
    modes.model_config(config, ml_collections.ConfigDict({"mode": "adapters", "adapter_size": 8}))
  off = modes.model_config(config, ml_collections.ConfigDict({"mode": "feature"}))
  assert (off.embedding_dropout, off.mlp_dropout, off.attention_dropout) == (0.0, 0.0, 0.0)


def _tiny(**changes):
  return ModernBertConfig(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=48,
                          global_every=2, local_window=16, pad_token_id=0).replace(**changes)


def _packed_rows():
  """Row 0 packs two documents (40 and 50 tokens) and padding; rows 1-2 hold each one alone."""
  rng = np.random.RandomState(2)
  docs = [rng.randint(3, VOCAB, 40), rng.randint(3, VOCAB, 50)]
  length = 128  # splash tiles by 128
  ids, doc_ids, positions = (np.zeros((3, length), np.int32) for _ in range(3))
  ids[0, :90] = np.concatenate(docs)
  doc_ids[0, :40], doc_ids[0, 40:90] = 1, 2
  positions[0, :40], positions[0, 40:90] = np.arange(40), np.arange(50)
  for row, doc in zip((1, 2), docs):
    ids[row, :len(doc)], doc_ids[row, :len(doc)], positions[row, :len(doc)] = doc, 1, np.arange(len(doc))
  # The same predictions: in the packed row at the documents' offsets, alone at their own.
  picks = [(0, 3), (0, 39), (1, 0), (1, 25), (1, 49)]
  packed = [p + (40 if d else 0) for d, p in picks]
  pos = np.zeros((3, 5), np.int32)
  pos[0] = packed
  weights = np.zeros((3, 5), np.float32)
  weights[0] = 1
  for row, d in ((1, 0), (2, 1)):
    mine = [p for dd, p in picks if dd == d]
    pos[row, :len(mine)], weights[row, :len(mine)] = mine, 1
  labels = np.take_along_axis(ids, pos, axis=1)
  return {"input_ids": ids, "input_mask": (doc_ids > 0).astype(np.int32), "segment_ids": np.zeros_like(ids),
          "document_ids": doc_ids, "position_ids": positions, "masked_lm_positions": pos, "masked_lm_ids": labels,
          "masked_lm_weights": weights, "next_sentence_labels": np.zeros(3, np.int32)}


def _packed_config(family, attention):
  if family == "bert":
    return model_config(dict(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=48,
                             max_position_embeddings=128, attention=attention, attention_dropout=0.0,
                             use_pooler=False, sentence_head="none"))
  return _tiny(attention=attention)


@functools.lru_cache(maxsize=None)
def _dot_weights(family):
  """The family's weights (key 0) from dot's init, compiled once: the attention backend holds no weights, so
  they serve splash's cases too (splash's init would trace and compile its interpret-mode kernel once more)."""
  model = build(_packed_config(family, "dot"))
  return nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), **objectives.model_inputs(_packed_rows()))["params"])


@pytest.mark.parametrize("family,attention", [("bert", "dot"), ("bert", "splash"), ("modernbert", "dot"),
                                              ("modernbert", "splash")])
def test_a_packed_rows_loss_is_the_sum_of_its_documents_alone(family, attention):
  """Attention stays inside each document and positions restart in it (absolute for BERT, rotary for
  ModernBERT): the packed row's masked-LM loss is the sum of its documents' losses, each alone in a row."""
  model, batch = build(_packed_config(family, attention)), _packed_rows()
  inputs = objectives.model_inputs(batch)
  params = _dot_weights(family)
  logits = jax.jit(model.apply)({"params": params}, **inputs).mlm_logits
  per_row = [float(mlm_sums(logits[i:i + 1], {k: v[i:i + 1] for k, v in batch.items()})["mlm_loss"])
             for i in range(3)]
  np.testing.assert_allclose(per_row[0], per_row[1] + per_row[2], rtol=1e-5)


def test_scanned_layers_alternate_like_unrolled_ones_under_splash():
  """Scanned layers pick window and theta from their index (lax.cond between two splash kernels): the same
  function as the unrolled layers' static choice, and as dot's."""
  batch = {k: v[:1] for k, v in _packed_rows().items()}  # the packed row
  inputs = objectives.model_inputs(batch)
  scanned = ModernBertModel(_tiny(attention="splash"))
  params = _dot_weights("modernbert")  # _tiny()'s: the same tree as splash's
  encoder = dict(params["encoder"])
  layers = encoder.pop("layers")
  unrolled = {**params, "encoder": {**encoder, **{f"layer_{i}": jax.tree.map(lambda x, i=i: x[i], layers)
                                                  for i in range(2)}}}
  real = batch["input_mask"] > 0
  dot = jax.jit(ModernBertModel(_tiny()).apply)({"params": params}, **inputs).last_hidden_state
  for model, p in ((scanned, params), (ModernBertModel(_tiny(attention="splash", scan_layers=False)), unrolled)):
    got = jax.jit(model.apply)({"params": p}, **inputs).last_hidden_state
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(dot)[real], atol=1e-5)


# Parameter shapes of the tiny preset: a rename or a changed layout shows here.
TINY_SHAPES = {
    "embeddings/word_embeddings/embedding": (8192, 128), "embeddings/norm/scale": (128,),
    "encoder/layers/attention_norm/scale": (4, 128), "encoder/layers/attention/qkv": (4, 128, 3, 2, 64),
    "encoder/layers/attention/out": (4, 2, 64, 128), "encoder/layers/mlp_norm/scale": (4, 128),
    "encoder/layers/mlp/wi": (4, 128, 2, 256), "encoder/layers/mlp/wo": (4, 256, 128),
    "encoder/final_norm/scale": (128,), "mlm_head/transform/kernel": (128, 128), "mlm_head/transform/norm/scale": (128,),
    "mlm_head/output_bias": (8192,),
}


def _shapes(preset):
  config = model_config(load_config(f"configs/modernbert.py:{preset}", []).model.to_dict())
  return param_shapes(config)


@pytest.mark.parametrize("preset,released", [
    ("base", 149e6), ("large", 395e6), ("ettin_17m", 17e6), ("ettin_32m", 32e6), ("ettin_68m", 68e6),
    ("ettin_150m", 150e6), ("ettin_400m", 400e6), ("ettin_1b", 1e9), ("mmbert_small", 140e6),
    ("mmbert_base", 307e6)])
def test_presets_have_the_released_sizes(preset, released):
  backbone = sum(int(np.prod(s)) for k, s in _shapes(preset).items() if not k.startswith("mlm_head"))
  assert abs(backbone / released - 1) < 0.04, backbone


@pytest.mark.parametrize("size", ["small", "base"])
def test_mmbert_phases_anneal_the_masking_rate(size):
  """mmBERT's schedule (configs/modernbert.py MASK_SCHEDULE): 30%, 15% and 5% of the real tokens masked (counted
  over 400 masked rows of 128 tokens), Gemma 2's vocabulary; mid-training and the decay as one run (`_mid`) at 8192
  tokens with RoPE theta 160k, init_from pretraining, its rate 15% until the decay's first step and 5% from it
  (data.mask_rate_schedule), the learning rate falling as 1 - sqrt to 2% over the decay's steps."""
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 1000, (400, 128)).astype(np.int32)
  special = np.arange(1000) < 5
  mid = load_config(f"configs/modernbert.py:mmbert_{size}_mid", [])
  first = load_config(f"configs/modernbert.py:mmbert_{size}", [])
  boundary = mid.data.mask_rate_schedule[0][0]
  for config, step, rate in ((first, 0, 0.3), (mid, boundary - 1, 0.15), (mid, boundary, 0.05)):
    assert config.model.vocab_size == 256_000 and config.data.tokenizer == "tokenizer_json"
    cfg = MaskingConfig(config.data.masking, config.data.mask_rate, 128, 4, special, np.zeros(1000, bool),
                        schedule=config.data.mask_rate_schedule)
    rates = rates_at(cfg, np.full(400, step))
    out = mask_batch(ids, np.full(400, 128, np.int32), row_keys((1,), np.zeros(400), np.arange(400)), cfg,
                     rates=rates)
    got = float(np.asarray(out["masked_lm_weights"]).sum()) / ids.size
    assert abs(got - rate) < 0.01, (step, got)
  assert (mid.data.max_seq_length, mid.model.global_rope_theta, mid.model.local_rope_theta) == (8192, 16e4, 16e4)
  assert mid.init_from == f"runs/mmbert_{size}" and first.data.mask_rate_schedule == ()
  assert (boundary, mid.train.num_steps) == (15_895, 15_895 + 2_649)
  assert (mid.optimizer.decay, mid.optimizer.decay_steps, mid.optimizer.decay_start) == ("1-sqrt", 2649, -1)
  assert mid.optimizer.end_learning_rate == pytest.approx(0.02 * mid.optimizer.learning_rate)
  assert mid.data.max_predictions_per_seq == 1229  # the first rate's: ceil(0.15 * 8192)


def test_tiny_parameter_table():
  assert _shapes("tiny") == TINY_SHAPES


@slow  # a minute of training on two cores; the warmup's rows and the step are tested above and in test_optim
def test_tiny_trains_on_the_embedded_corpus(tmp_path):
  config = load_config("configs/modernbert.py:tiny", [
      "--config.train.batch_size=16", "--config.data.max_seq_length=64", "--config.data.max_predictions_per_seq=20",
      "--config.train.num_steps=40", "--config.train.log_every_steps=5",
      "--config.train.eval_every_steps=0", "--config.checkpoint.every_steps=1000",
      "--config.checkpoint.async_save=False", "--config.data.num_shards=4", "--config.optimizer.warmup_steps=5",
      "--config.optimizer.learning_rate=2e-3", "--config.train.batch_warmup_steps=10"])
  trainer.pretrain(config, str(tmp_path))
  with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f if '"loss"' in line]
  assert rows[-1]["loss"] < rows[0]["loss"] - 0.4, (rows[0]["loss"], rows[-1]["loss"])


def test_sequence_sharded_eval_equals_one_device():
  """mesh.shard_sequence: the tensor axis splits each row's tokens (splash with q_seq_shards, keys gathered);
  the eval sums on a 2x2x2 mesh are those of one device."""
  base = ["--config.model.num_layers=1", "--config.data.max_seq_length=256", "--config.train.batch_size=4",
          "--config.data.max_predictions_per_seq=8", "--config.train.batch_warmup_steps=0",
          "--config.model.attention=splash"]
  batch = benchmark.synthetic_batch(4, 256, 8, 8192)
  batch["input_mask"][1, 200:] = 0
  sums, host = [], None
  for devices, mesh in ((jax.devices()[:1], ["--config.mesh.data=1"]),
                        (jax.devices(), ["--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2",
                                         "--config.mesh.shard_sequence=True"])):
    config = load_config("configs/modernbert.py:tiny", base + mesh)
    setup = build_train_setup(config, partitioning.make_mesh(config.mesh, devices))
    if host is None:  # initialised once (one device), then laid out over each mesh: the same weights
      host = jax.device_get(setup.init_params(jax.random.key(0)))
    params = jax.device_put(host, setup.state_shardings.params)
    sums.append(setup.eval_step(params, partitioning.global_batch(batch, setup.mesh)))
  np.testing.assert_allclose(float(sums[1]["sum/mlm_loss"]), float(sums[0]["sum/mlm_loss"]), rtol=1e-5)

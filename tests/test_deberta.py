"""DeBERTa-v3: Hugging Face's DebertaV2ForMaskedLM / DebertaV2Model / DebertaV2For* (tiny, random, built here with
v3's attention settings) against load_pretrained, the export and fine-tuning's heads; the spm.model tokenizer
against transformers' DebertaV2Tokenizer on a SentencePiece model trained here; the log buckets against a hand
table; the presets' sizes."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sentencepiece as spm
import torch
import transformers
from core_helpers import slow

import bert_jax
from bert_jax import pretrained
from bert_jax.conversion import hf, native
from bert_jax.data_pipelines.tokenizers import load_tokenizer
from bert_jax.models import deberta, families

VOCAB = 96
# v3's attention: both position terms, log buckets (8 here, so distances past 4 are bucketed within 24 tokens),
# shared keys, LayerNorm'd relative embeddings, no absolute positions, no token types.
HF_TINY = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
               relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=8, norm_rel_ebd="layer_norm",
               share_att_key=True, position_biased_input=False, max_relative_positions=-1,
               max_position_embeddings=64, type_vocab_size=0)


def _hf_dir(tmp_path, cls, seed=0, **changes):
  torch.manual_seed(seed)
  model = cls(transformers.DebertaV2Config(**{**HF_TINY, **changes})).eval()
  with torch.no_grad():  # norms and biases away from 1 and 0, so one read wrong shows
    for p in model.parameters():
      p.add_(0.05 * torch.randn_like(p))
  model.save_pretrained(tmp_path)
  return model


def _padded_batch(seed=0, batch=3, length=24):
  rng = np.random.RandomState(seed)
  ids = rng.randint(5, VOCAB, (batch, length))
  mask = np.ones((batch, length), np.int64)
  mask[1, 15:] = 0
  mask[2, 5:] = 0
  return ids * mask, mask


@pytest.mark.parametrize("scan_layers", [True, False])
def test_load_pretrained_matches_transformers_with_padding(tmp_path, scan_layers):
  """Logits and last hidden states at every position (padding included: HF masks queries and keys there)."""
  reference = _hf_dir(tmp_path, transformers.DebertaV2ForMaskedLM)
  ids, mask = _padded_batch()
  with torch.no_grad():
    want = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), output_hidden_states=True,
                     output_attentions=True)
  model, params = bert_jax.load_pretrained(str(tmp_path), scan_layers=scan_layers)
  assert isinstance(model, deberta.DebertaModel) and model.config.position_buckets == 8
  apply = jax.jit(model.apply, static_argnames=("output_attentions", "output_hidden_states"))
  out = apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), output_attentions=True,
              output_hidden_states=True)
  np.testing.assert_allclose(np.asarray(out.mlm_logits), want.logits.numpy(), atol=1e-5, rtol=0)
  np.testing.assert_allclose(np.asarray(out.last_hidden_state), want.hidden_states[-1].numpy(), atol=1e-5, rtol=0)
  for layer in range(2):
    np.testing.assert_allclose(np.asarray(out.hidden_states[layer]), want.hidden_states[layer].numpy(), atol=1e-5)
    np.testing.assert_allclose(np.asarray(out.attentions[layer]), want.attentions[layer].numpy(), atol=1e-6)


@pytest.mark.parametrize("changes", [dict(pos_att_type=["c2p"], position_buckets=-1, max_relative_positions=16,
                                          norm_rel_ebd="none"),
                                     dict(position_biased_input=True, type_vocab_size=2, pos_att_type=["p2c"])])
def test_v2_style_settings_match_transformers(tmp_path, changes):
  """One position term, no buckets (distances clamped at 16), no norm; absolute positions and token types."""
  reference = _hf_dir(tmp_path, transformers.DebertaV2Model, seed=1, **changes)
  ids, mask = _padded_batch(seed=1)
  types = (np.arange(24)[None] >= 10).astype(np.int64).repeat(3, 0) * (changes.get("type_vocab_size", 0) > 0)
  with torch.no_grad():
    want = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                     token_type_ids=torch.tensor(types)).last_hidden_state.numpy()
  model, params = bert_jax.load_pretrained(str(tmp_path))
  got = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types)).last_hidden_state
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=0)


def test_log_buckets_by_hand():
  """Hugging Face's make_log_bucket_position at buckets=8, max 64: |d| <= 4 kept; beyond,
  4 + ceil(log(|d|/4) / log(63/4) * 3), signed."""
  d = np.array([0, 1, -3, 4, -4, 5, 8, 16, -16, 40, 63, 100])
  want = [0, 1, -3, 4, -4, 4 + int(np.ceil(np.log(5 / 4) / np.log(63 / 4) * 3)), 4 + 1, 4 + 2, -6, 4 + 3, 7, 4 + 4]
  assert deberta.log_buckets(d, 8, 64).tolist() == want


def test_refused_settings_are_one_line(tmp_path):
  _hf_dir(tmp_path, transformers.DebertaV2Model, share_att_key=False)
  with pytest.raises(bert_jax.errors.UserError, match="share_att_key=False"):
    bert_jax.load_pretrained(str(tmp_path))


LINES = ["The quick brown fox jumps over the lazy dog.", "Él dijo: «¡Hola, mundo!» y se fue.",
         "naïve café résumé, déjà vu", "numbers 12345 and symbols #$% here", "Der schnelle braune Fuchs springt.",
         "日本語のテキストです", "Быстрая коричневая лиса"]
HELD_OUT = ["Hello   world\tand\nnew lines ", "Ｆｕｌｌ ｗｉｄｔｈ and NFD cafe\u0301", "a [MASK] b[SEP]c [CLS]",
            "unseen ∑ symbols → here", "Schnelle Füchse, große Hunde", "  leading spaces", "テキスト ロシア語 лиса"]


@pytest.fixture(scope="module")
def spm_folder(tmp_path_factory):
  """A v3-style spm.model: [PAD] [CLS] [SEP] [UNK] at 0-3 and no [MASK] (transformers adds it at the end)."""
  folder = tmp_path_factory.mktemp("spm")
  spm.SentencePieceTrainer.train(sentence_iterator=iter(LINES * 20), model_prefix=str(folder / "spm"),
                                 vocab_size=90, model_type="unigram", pad_id=0, bos_id=1, eos_id=2, unk_id=3,
                                 pad_piece="[PAD]", bos_piece="[CLS]", eos_piece="[SEP]", unk_piece="[UNK]",
                                 character_coverage=1.0, minloglevel=2)
  return folder


def _transformers_tokenizer(folder, monkeypatch):
  """transformers' DebertaV2Tokenizer.from_pretrained on the folder. Its SentencePiece reader's protobuf module
  (sentencepiece's) is newer than this protobuf runtime: read the model with transformers' own module instead."""
  import transformers.convert_slow_tokenizer as slow  # pylint: disable=import-outside-toplevel
  from transformers.utils import sentencepiece_model_pb2_new  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(slow, "import_protobuf", lambda *args: sentencepiece_model_pb2_new, raising=False)
  return transformers.DebertaV2Tokenizer.from_pretrained(str(folder))


@pytest.mark.parametrize("lower", [False, True])
def test_tokenizer_ids_equal_transformers(spm_folder, monkeypatch, tmp_path, lower):
  folder = spm_folder
  if lower:
    folder = tmp_path
    (folder / "spm.model").write_bytes((spm_folder / "spm.model").read_bytes())
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
  theirs = _transformers_tokenizer(folder, monkeypatch)
  ours = load_tokenizer(str(folder / "spm.model"), kind="deberta_spm")
  for line in HELD_OUT + LINES:
    assert ours.encode(line) == theirs(line, add_special_tokens=False)["input_ids"], line
  assert [ours.special_ids[r] for r in ("[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]")] == [
      theirs.pad_token_id, theirs.cls_token_id, theirs.sep_token_id, theirs.unk_token_id, theirs.mask_token_id]
  assert ours.special_ids["[MASK]"] == ours.vocab_size - 1 == len(theirs) - 1
  assert ours.special_mask()[:4].all() and not ours.special_mask()[4:-1].any()


def test_a_released_style_folder_loads_its_tokenizer_and_model(spm_folder, monkeypatch, tmp_path):
  """A HF folder (weights + spm.model): load_tokenizer reads the spm.model as DeBERTa's kind, and the converted
  checkpoint carries it (a native checkpoint, then a HF export with a tokenizer.json transformers reads)."""
  _hf_dir(tmp_path / "in", transformers.DebertaV2ForMaskedLM)
  (tmp_path / "in" / "spm.model").write_bytes((spm_folder / "spm.model").read_bytes())
  assert bert_jax.load_tokenizer(str(tmp_path / "in")).kind == "deberta_spm"
  converted = pretrained.read_checkpoint(str(tmp_path / "in"))
  native.write(str(tmp_path / "native"), converted)
  tokenizer = bert_jax.load_tokenizer(str(tmp_path / "native"))
  assert tokenizer.kind == "deberta_spm"
  hf.write(str(tmp_path / "out"), pretrained.read_checkpoint(str(tmp_path / "native")))
  theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))
  assert type(theirs).__name__ == "DebertaV2Tokenizer"
  for line in HELD_OUT:
    assert theirs(line)["input_ids"] == [tokenizer.special_ids["[CLS]"], *tokenizer.encode(line),
                                         tokenizer.special_ids["[SEP]"]], line


def test_masked_lm_export_and_reload_through_transformers(tmp_path):
  """DebertaV2ForMaskedLM in, `convert --to hf` out: transformers reads back the same tensors and logits."""
  reference = _hf_dir(tmp_path / "in", transformers.DebertaV2ForMaskedLM, seed=2)
  ids, mask = _padded_batch(seed=2)
  converted = pretrained.read_checkpoint(str(tmp_path / "in"))
  assert converted.family == "deberta" and converted.config.mlm_head and not converted.missing_heads
  hf.write(str(tmp_path / "out"), converted)
  reloaded = transformers.DebertaV2ForMaskedLM.from_pretrained(tmp_path / "out").eval()
  theirs, ours = reference.state_dict(), reloaded.state_dict()
  assert theirs.keys() == ours.keys()
  for name in theirs:
    np.testing.assert_array_equal(ours[name].numpy(), theirs[name].numpy(), err_msg=name)
  with torch.no_grad():
    want = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    again = reloaded(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
  np.testing.assert_array_equal(again, want)
  written = json.loads((tmp_path / "out" / "config.json").read_text())
  assert written["architectures"] == ["DebertaV2ForMaskedLM"] and written["position_buckets"] == 8


def _tiny_config(**changes):
  return deberta.DebertaConfig(**{**dict(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=2,
                                         intermediate_size=48, max_position_embeddings=64, position_buckets=8),
                                  **changes})


_HF_TASK = {"classification": "DebertaV2ForSequenceClassification", "regression": "DebertaV2ForSequenceClassification",
            "token": "DebertaV2ForTokenClassification", "span": "DebertaV2ForQuestionAnswering"}


@pytest.mark.parametrize("kind", ["classification", "token", "span"])  # regression: the classification class
def test_fine_tuning_heads_export_to_transformers_with_our_logits(tmp_path, capsys, kind):
  """A fine-tuned DeBERTa (random weights) through the generic head kinds: sequence heads read the ContextPooler
  (head/summary), token and span heads the last hidden states; `convert --to hf` gives transformers' DebertaV2For*
  class, whose logits are predict's."""
  from bert_jax import cli, params_checkpoint  # pylint: disable=import-outside-toplevel
  from bert_jax.finetune import heads  # pylint: disable=import-outside-toplevel
  from bert_jax.finetune.predict import Predictor  # pylint: disable=import-outside-toplevel
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  labels = 1 if kind == "regression" else 2 if kind == "span" else 3
  config = heads.encoder_config(_tiny_config(), kind, "pooled")
  assert not config.mlm_head
  model = heads.FinetuneModel(config, kind, labels)
  ids, mask = _padded_batch(seed=4, length=16)
  params = jax.device_get(nn.meta.unbox(model.init(jax.random.key(4), *(jnp.asarray(x) for x in (ids, mask, mask * 0)))
                                        ["params"]))
  rng = np.random.default_rng(4)
  params = jax.tree.map(lambda x: x + 0.2 * rng.standard_normal(x.shape).astype(np.float32), params)
  if kind in ("classification", "regression"):
    assert set(params["head"]) == {"summary", "classifier"}
  names = ["a", "b", "c"][:labels] if kind != "span" else []
  saved = {"model": config.to_dict(), "head": {"pooling": "pooled", "dropout": 0.1},
           "task": {"family": "test", "name": f"deberta_{kind}", "head": kind, "num_labels": labels, "labels": names},
           "data": {"max_seq_length": 16}, "train": {"eval_batch_size": 4}}
  params_checkpoint.save_params(str(tmp_path / "ft"), params, saved)
  assert cli.main(["convert", "--to", "hf", str(tmp_path / "ft"), str(tmp_path / "hf")]) == 0
  assert "not written" not in capsys.readouterr().out
  written = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert written["architectures"] == [_HF_TASK[kind]]
  theirs = getattr(transformers, _HF_TASK[kind]).from_pretrained(tmp_path / "hf").eval()
  with torch.no_grad():
    out = theirs(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
  ours = Predictor.build(saved, params, tokenizer=None).run(
      {"input_ids": ids.astype(np.int32), "attention_mask": mask.astype(np.int32),
       "token_type_ids": np.zeros_like(ids, np.int32)})
  real = mask > 0
  if kind == "span":
    for name in ("start_logits", "end_logits"):
      np.testing.assert_allclose(np.asarray(ours[name])[real], getattr(out, name).numpy()[real], atol=1e-5)
  elif kind == "token":
    np.testing.assert_allclose(np.asarray(ours["logits"])[real], out.logits.numpy()[real], atol=1e-5)
  else:
    want = out.logits.numpy()[:, 0] if kind == "regression" else out.logits.numpy()
    np.testing.assert_allclose(np.asarray(ours["logits"]), want, atol=1e-5)
    assert np.abs(want).max() > 0.05


def _presets_shapes(preset):
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  from bert_jax.conversion.params import param_shapes  # pylint: disable=import-outside-toplevel
  config = families.model_config(load_config(f"configs/deberta.py:{preset}", []).model.to_dict())
  return param_shapes(config)


# The paper's sizes: (backbone without the token table, token table), in parameters.
RELEASED = {"xsmall": (22e6, 48e6), "small": (44e6, 98e6), "base": (86e6, 98e6), "large": (304e6, 131e6)}


@pytest.mark.parametrize("preset", list(RELEASED))
def test_presets_have_the_released_sizes(preset):
  shapes = _presets_shapes(preset)
  table = int(np.prod(shapes["embeddings/word_embeddings/embedding"]))
  backbone = sum(int(np.prod(s)) for k, s in shapes.items()
                 if not k.startswith(("rtd_head", "mlm_head")) and k != "embeddings/word_embeddings/embedding")
  want_backbone, want_table = RELEASED[preset]
  assert abs(backbone / want_backbone - 1) < 0.04, backbone
  assert abs(table / want_table - 1) < 0.04, table


def _rtd_batch(vocab, seed=0, batch=3, length=16, predictions=4):
  rng = np.random.RandomState(seed)
  ids = rng.randint(5, vocab, (batch, length)).astype(np.int32)
  mask = np.ones((batch, length), np.int32)
  mask[1, 10:] = 0
  positions = np.stack([rng.choice(np.arange(1, 9), predictions, replace=False) for _ in range(batch)]).astype(np.int32)
  weights = np.ones((batch, predictions), np.float32)
  weights[2, 3] = 0.0
  originals = np.take_along_axis(ids, positions, axis=1)
  masked = ids.copy()
  np.put_along_axis(masked, positions, 4, axis=1)  # [MASK]
  return {"input_ids": masked * mask, "input_mask": mask, "segment_ids": np.zeros_like(ids),
          "masked_lm_positions": positions, "masked_lm_ids": originals, "masked_lm_weights": weights}


def test_rtd_loss_and_gdes_gradients_against_numpy():
  """The deberta_rtd loss = MLM cross-entropy / predictions + 50 x binary cross-entropy / real tokens, recomputed in
  NumPy from the two networks' outputs (the replaced inputs and labels built in NumPy); GDES: the RTD loss sends no
  gradient to the shared table (the generator's), E_delta starts at zeros and gets the RTD loss's gradient only."""
  from bert_jax.models import electra  # pylint: disable=import-outside-toplevel
  from bert_jax.training.objectives import deberta_rtd  # pylint: disable=import-outside-toplevel
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  config = _tiny_config(mlm_head=False, rtd_head=True, hidden_dropout=0.0, attention_dropout=0.0)
  objective = deberta_rtd.DebertaRTDPretraining(config, 0.5, 50.0)
  assert objective.model.generator.config.num_layers == 1 and objective.model.generator.config.hidden_size == 32
  batch = {k: jnp.asarray(v) for k, v in _rtd_batch(VOCAB).items()}
  params = nn.meta.unbox(objective.init(jax.random.key(0), batch))
  assert not np.any(params["discriminator"]["embeddings"]["word_embeddings"]["embedding"])
  rng = np.random.default_rng(1)  # E_delta away from zeros, so E_D = E + E_delta is tested
  params["discriminator"]["embeddings"]["word_embeddings"]["embedding"] = jnp.asarray(
      0.02 * rng.standard_normal((VOCAB, 32)), jnp.float32)

  def part(name):
    return lambda p: objective.loss({**objective.sums(p, batch, None, True)}, objective.counts(batch)) if name == "all" \
        else objective.sums(p, batch, None, True)[name]
  # The loss, its gradients and the MLM loss's gradients in one compiled program.
  (loss, grads), mlm_grads = jax.jit(lambda p: (jax.value_and_grad(part("all"))(p), jax.grad(part("mlm_loss"))(p)))(
      params)
  loss = float(loss)

  np_batch = {k: np.asarray(v) for k, v in batch.items()}
  gen = jax.jit(objective.model.generator.apply)({"params": params["generator"]}, batch["input_ids"],
                                                 batch["input_mask"], masked_positions=batch["masked_lm_positions"])
  logits = np.asarray(gen.mlm_logits, np.float64)
  log_probs = logits - logits.max(-1, keepdims=True)
  log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
  nll = -np.take_along_axis(log_probs, np_batch["masked_lm_ids"][..., None], -1)[..., 0]
  weights = np_batch["masked_lm_weights"]
  mlm = (nll * weights).sum() / weights.sum()
  samples = np.asarray(electra.sample_tokens(gen.mlm_logits, jax.random.key(0)))
  ids, replaced = np_batch["input_ids"].copy(), np.zeros(ids_shape := np_batch["input_ids"].shape)
  for b, p in zip(*np.nonzero(weights)):
    pos = np_batch["masked_lm_positions"][b, p]
    ids[b, pos] = samples[b, p]
    replaced[b, pos] = float(samples[b, p] != np_batch["masked_lm_ids"][b, p])
  assert ids_shape == (3, 16) and 0 < replaced.sum()
  disc_tree = {**params["discriminator"], "embeddings": {
      **params["discriminator"]["embeddings"], "word_embeddings": {"embedding": (
          params["generator"]["embeddings"]["word_embeddings"]["embedding"]
          + params["discriminator"]["embeddings"]["word_embeddings"]["embedding"])}}}
  disc = jax.jit(objective.model.discriminator.apply)({"params": disc_tree}, jnp.asarray(ids), batch["input_mask"])
  z = np.asarray(disc.rtd_logits, np.float64)
  bce = np.maximum(z, 0) - z * replaced + np.log1p(np.exp(-np.abs(z)))
  real = np_batch["input_mask"]
  want = mlm + 50.0 * (bce * real).sum() / real.sum()
  assert loss == pytest.approx(want, rel=1e-5)
  table = ("embeddings", "word_embeddings", "embedding")
  shared = np.asarray(grads["generator"][table[0]][table[1]][table[2]])
  from_mlm = np.asarray(mlm_grads["generator"][table[0]][table[1]][table[2]]) / float(weights.sum())
  np.testing.assert_allclose(shared, from_mlm, rtol=1e-5, atol=1e-6)  # the RTD loss adds nothing to E
  delta = np.asarray(grads["discriminator"][table[0]][table[1]][table[2]])
  assert np.abs(delta).max() > 1e-6 and not np.any(mlm_grads["discriminator"][table[0]][table[1]][table[2]])


@slow  # minutes of training on two cores; the loss and its gradients are tested above against NumPy
def test_tiny_preset_learns_on_the_embedded_corpus(tmp_path, capsys):
  """`bert-jax pretrain --config configs/deberta.py:tiny` (RTD with GDES) on the embedded corpus: the loss falls
  and the run ends with its one `done:` line; its discriminator converts and fine-tunes."""
  from bert_jax import cli  # pylint: disable=import-outside-toplevel
  assert cli.main(["pretrain", "--config", "configs/deberta.py:tiny", "--workdir", str(tmp_path),
                   "--config.train.num_steps=60", "--config.train.log_every_steps=10",
                   "--config.train.eval_every_steps=0", "--config.data.max_seq_length=64",
                   "--config.train.batch_size=16", "--config.checkpoint.every_steps=1000",
                   "--config.optimizer.warmup_steps=10"]) == 0
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines[-1].startswith("done: step 60 |"), lines[-1]
  with open(tmp_path / "metrics.jsonl") as f:
    rows = [json.loads(line) for line in f if '"loss"' in line]
  assert rows[-1]["loss"] < rows[0]["loss"] - 5.0, (rows[0]["loss"], rows[-1]["loss"])
  assert rows[-1]["disc_accuracy"] > 0.8 and rows[-1]["mlm_loss"] < rows[0]["mlm_loss"]
  # Its discriminator (E + E_delta) out as a HF folder, then fine-tuned on the embedded task.
  assert cli.main(["convert", "--to", "hf", str(tmp_path), str(tmp_path / "hf")]) == 0
  assert cli.main(["finetune", "--config", "configs/glue.py:embedded", "--workdir", str(tmp_path / "ft"),
                   f"--config.init_from={tmp_path / 'hf'}", "--config.data.max_seq_length=32",
                   "--config.data.train_limit=32", "--config.data.eval_limit=16", "--config.train.batch_size=16",
                   "--config.train.eval_batch_size=16", "--config.train.epochs=1"]) == 0
  assert capsys.readouterr().out.strip().splitlines()[-1].startswith("done: dev accuracy ")


def test_preset_count_is_the_built_discriminators():
  """`bert-jax presets` counts from the sizes; `bert-jax info` counts the RTD objective's backbone (the
  discriminator, E + E_delta as one table, without its head)."""
  from bert_jax import jobs, presets  # pylint: disable=import-outside-toplevel
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  from bert_jax.training import info  # pylint: disable=import-outside-toplevel
  config = load_config("configs/deberta.py:tiny")
  built = jobs.with_step(config, "configs/deberta.py:tiny", "info").step(config, None)
  assert presets.backbone_params(config.model) == info.model_info(*built)["num_params"] > 1_000_000


def test_a_pretraining_pair_converts_as_its_finished_discriminator(tmp_path):
  """A deberta_rtd run's params ({"generator", "discriminator"}) read by conversion: the discriminator, its token
  table E + E_delta; `convert --to hf` then gives a DebertaV2Model transformers loads with that table."""
  from bert_jax import params_checkpoint  # pylint: disable=import-outside-toplevel
  from bert_jax.training.objectives import deberta_rtd  # pylint: disable=import-outside-toplevel
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  config = _tiny_config(mlm_head=False, rtd_head=True)
  objective = deberta_rtd.DebertaRTDPretraining(config, 0.5, 50.0)
  batch = {k: jnp.asarray(v) for k, v in _rtd_batch(VOCAB).items()}
  params = jax.device_get(nn.meta.unbox(objective.init(jax.random.key(0), batch)))
  delta = np.random.default_rng(0).standard_normal((VOCAB, 32)).astype(np.float32)
  params["discriminator"]["embeddings"]["word_embeddings"]["embedding"] = delta
  params_checkpoint.save_params(str(tmp_path / "run"), params, {"model": config.to_dict()})
  converted = pretrained.read_checkpoint(str(tmp_path / "run"))
  table = params["generator"]["embeddings"]["word_embeddings"]["embedding"] + delta
  np.testing.assert_array_equal(converted.params["embeddings"]["word_embeddings"]["embedding"], table)
  assert "rtd_head" in converted.params and "generator" not in converted.params
  hf.write(str(tmp_path / "hf"), converted)
  theirs = transformers.DebertaV2Model.from_pretrained(tmp_path / "hf")
  np.testing.assert_array_equal(theirs.embeddings.word_embeddings.weight.detach().numpy(), table)

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

import bert_jax
from bert_jax import pretrained
from bert_jax.conversion import hf, native
from bert_jax.data_pipelines import deberta_spm
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
  monkeypatch.setattr(slow, "import_protobuf", lambda *args: sentencepiece_model_pb2_new)
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
  return deberta.DebertaConfig(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=48,
                               max_position_embeddings=64, position_buckets=8, **changes)


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

"""The family record is the whole of a family: a toy family registered here (its own config dataclass,
Flax module, a mapping table whose layer rows the config counts, its sequence summary and token
transform, none of them BERT's) converts to and from a HF-style directory, loads through
load_pretrained, fine-tunes and exports its classification and token heads, all through the generic
paths; a NumPy forward pass over the exported tensors, by their HF names, is the reference.
A RoBERTa-layout family that differs only in its name (as CamemBERT or XLM-R would) is one record too."""
from __future__ import annotations

import dataclasses
import functools
import json
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import safetensors.numpy

from bert_jax import cli, params_checkpoint, pretrained
from bert_jax.conversion import common, hf, native
from bert_jax.errors import UserError
from bert_jax.finetune import heads, modes
from bert_jax.finetune.predict import Predictor
from bert_jax.models import families
from bert_jax.models.bert import ModelOutput
from bert_jax.models.config import ModelConfig
from bert_jax.models.families import Architecture, Row, dense_rows, hf_only
from bert_jax.models.records import bert_layout, roberta

LENGTH = 6
EPS = 1e-5


@dataclasses.dataclass(frozen=True)
class ToyConfig:
  """Pre-LN residual MLP blocks without biases or positions: nothing like BertModel's config."""
  family: str = "toy"
  vocab_size: int = 40
  hidden_size: int = 16
  intermediate_size: int = 24
  num_layers: int = 2
  mlps_per_layer: int = 2  # MobileBERT-style stacked feed-forward networks: the layer's rows depend on it
  max_position_embeddings: int = 64
  scan_layers: bool = False
  mlm_head: bool = True
  initializer_range: float = 0.02
  compute_dtype = jnp.float32  # what bert_jax's fine-tuning heads build their layers with
  weight_dtype = jnp.float32

  @classmethod
  def from_dict(cls, values):
    unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
      raise UserError(f"unknown toy config keys {sorted(unknown)}")
    return cls(**values)

  def to_dict(self):
    return dataclasses.asdict(self)

  def replace(self, **changes):
    return dataclasses.replace(self, **changes)


def _norm(name):
  return nn.LayerNorm(epsilon=EPS, use_bias=False, name=name)


class ToyLayer(nn.Module):
  """mlps_per_layer times: x + W_out relu(W_in LN(x))."""
  config: ToyConfig

  @nn.compact
  def __call__(self, x):
    for j in range(self.config.mlps_per_layer):
      h = nn.Dense(self.config.intermediate_size, use_bias=False, name=f"mlp_{j}_in")(_norm(f"norm_{j}")(x))
      x = x + nn.Dense(self.config.hidden_size, use_bias=False, name=f"mlp_{j}_out")(jax.nn.relu(h))
    return x


class ToyModel(nn.Module):
  config: ToyConfig

  @nn.compact
  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *, deterministic=True,
               output_hidden_states=False, head_mask=None):
    cfg = self.config
    embed = nn.Embed(cfg.vocab_size, cfg.hidden_size, name="tokens")
    x = _norm("embedding_norm")(embed(input_ids))
    states = [x]
    for i in range(cfg.num_layers):
      x = ToyLayer(cfg, name=f"layer_{i}")(x)
      states.append(x)
    x = _norm("final_norm")(x)
    out = {"last_hidden_state": x, "hidden_states": jnp.stack(states) if output_hidden_states else None}
    if cfg.mlm_head:
      bias = self.param("mlm_bias", nn.initializers.zeros_init(), (cfg.vocab_size,))
      out["mlm_logits"] = embed.attend(x) + bias
    return ModelOutput(**out)


class MeanSummary(nn.Module):
  """The toy's sequence summary (a family-owned pooling): tanh(dense(masked mean of the tokens))."""
  config: ToyConfig

  @nn.compact
  def __call__(self, out, attention_mask, deterministic):
    mask = attention_mask[..., None].astype(jnp.float32)
    mean = jnp.sum(out.last_hidden_state * mask, axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1.0)
    return jnp.tanh(nn.Dense(self.config.hidden_size, name="dense")(mean))


class DenseTransform(nn.Module):
  """The toy's token transform before token and span classifiers: relu(dense(every token))."""
  config: ToyConfig

  @nn.compact
  def __call__(self, out, attention_mask, deterministic):
    return jax.nn.relu(nn.Dense(self.config.hidden_size, name="dense")(out.last_hidden_state))


def _layer_slots(config):
  return [(i, f"layer_{i}", False) for i in range(config.num_layers)]


def _read_hf(hf_config, heads_found, scan_layers, source):
  del scan_layers, source
  return ToyConfig(vocab_size=hf_config["vocab_size"], hidden_size=hf_config["hidden_size"],
                   intermediate_size=hf_config["intermediate_size"], num_layers=hf_config["num_hidden_layers"],
                   mlps_per_layer=hf_config["num_feedforward_networks"], mlm_head="mlm" in heads_found)


def _write_hf(config):
  return {"vocab_size": config.vocab_size,
          "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
          "num_hidden_layers": config.num_layers, "num_feedforward_networks": config.mlps_per_layer}


def _norm_row(ours, hf_name, part="backbone"):
  return Row(part, f"{ours}/scale", f"{hf_name}.weight", None, "copy")


def _layer_rows(config):
  """One layer's rows: as many feed-forward networks as the config stacks."""
  return tuple(row for j in range(config.mlps_per_layer) for row in (
      _norm_row(f"norm_{j}", f"{{b}}layers.{{i}}.mlps.{j}.norm"),
      Row("backbone", f"mlp_{j}_in/kernel", f"{{b}}layers.{{i}}.mlps.{j}.Wi.weight", None, "kernel"),
      Row("backbone", f"mlp_{j}_out/kernel", f"{{b}}layers.{{i}}.mlps.{j}.Wo.weight", None, "kernel")))


TOY = families.Family(
    name="toy", config=ToyConfig, module=ToyModel, heads=("mlm",),
    heads_of=lambda config: ("mlm",) if config.mlm_head else (),
    with_heads=lambda config, on: config.replace(mlm_head="mlm" in set(on)),
    pretrained_heads=lambda present: ("mlm",), tokenizer="wordpiece",
    layout=families.Layout(
        global_rows=(Row("backbone", "tokens/embedding", "{b}embeddings.tok.weight", None, "copy"),
                     _norm_row("embedding_norm", "{b}embeddings.norm"), _norm_row("final_norm", "{b}final_norm"),
                     Row("mlm", "mlm_bias", "decoder.bias", None, "copy")),
        layer_rows=_layer_rows,
        parts=lambda config: frozenset({"backbone", *(("mlm",) if config.mlm_head else ())}),
        layer_slots=_layer_slots),
    hf=families.HFNames(
        model_type="toy", class_prefix="Toy", base_prefix="toy.",
        architectures=(Architecture("ToyForMaskedLM", frozenset({"mlm"}), True),
                       Architecture("ToyModel", frozenset(), False)),
        read_config=_read_hf, write_config=_write_hf, tokenizer_class="BertTokenizer",
        tied={"decoder.weight": "{b}embeddings.tok.weight"},
        task_rows={"classification": hf_only(dense_rows("head/summary/dense", "head.dense", None)
                                             + dense_rows("head/classifier", "classifier", None), part="task"),
                   "token": hf_only(dense_rows("head/token_transform/dense", "head.dense", None)
                                    + dense_rows("head/classifier", "classifier", None), part="task")}),
    summary_heads=(), summary=MeanSummary, token_transform=DenseTransform)


@pytest.fixture
def toy_family(monkeypatch):
  """TOY in the registry for one test (monkeypatch takes it out again)."""
  monkeypatch.setitem(families._FAMILIES, "toy", TOY)  # pylint: disable=protected-access
  monkeypatch.setitem(families._BY_MODEL_TYPE, "toy", TOY)  # pylint: disable=protected-access


def _layer_norm(x, scale):
  x = x - x.mean(-1, keepdims=True)
  return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * scale


def numpy_toy(t, ids, prefix="toy."):
  """The toy forward pass from HF-named tensors (Linear weights [out, in]): (hidden [B, T, H], MLM logits)."""
  x = _layer_norm(t[f"{prefix}embeddings.tok.weight"][ids], t[f"{prefix}embeddings.norm.weight"])
  mlps = sorted({tuple(map(int, m.groups())) for k in t if (m := re.search(r"layers\.(\d+)\.mlps\.(\d+)\.Wi", k))})
  for i, j in mlps:
    block = f"{prefix}layers.{i}.mlps.{j}"
    h = _layer_norm(x, t[f"{block}.norm.weight"]) @ t[f"{block}.Wi.weight"].T
    x = x + np.maximum(h, 0) @ t[f"{block}.Wo.weight"].T
  x = _layer_norm(x, t[f"{prefix}final_norm.weight"])
  logits = x @ t["decoder.weight"].T + t["decoder.bias"] if "decoder.bias" in t else None
  return x, logits


def _random_params(model, seed=0):
  ids = jnp.ones((1, LENGTH), jnp.int32)
  abstract = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(seed), ids, ids, ids * 0)["params"])
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: (0.5 * rng.standard_normal(x.shape) + 0.1).astype(np.float32), abstract)


def _ids(vocab):
  return np.random.RandomState(3).randint(0, vocab, (3, LENGTH)).astype(np.int32)


def test_toy_family_converts_and_loads_through_the_generic_paths(toy_family, tmp_path):
  config = ToyConfig()
  params = _random_params(families.build(config))
  hf.write(str(tmp_path / "hf"), common.Converted("toy", config, params, None))
  written = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert written["architectures"] == ["ToyForMaskedLM"] and written["model_type"] == "toy"
  tensors = safetensors.numpy.load_file(tmp_path / "hf" / "model.safetensors")
  assert tensors["toy.layers.1.mlps.1.Wo.weight"].shape == (16, 24) and written["num_feedforward_networks"] == 2
  assert len([k for k in tensors if ".Wi." in k]) == 4  # 2 layers x 2 stacked networks, by the config's rows
  tensors["decoder.weight"] = tensors["toy.embeddings.tok.weight"]  # tied, as a HF export leaves it implied
  ids = _ids(config.vocab_size)
  hidden, logits = numpy_toy(tensors, ids)
  out = families.build(config).apply({"params": params}, jnp.asarray(ids))
  np.testing.assert_allclose(out.last_hidden_state, hidden, atol=1e-5)
  np.testing.assert_allclose(out.mlm_logits, logits, atol=1e-4)
  assert np.abs(logits).max() > 0.1

  back = pretrained.read_checkpoint(str(tmp_path / "hf"))  # source_kind, hf.read: the record alone
  assert back.family == "toy" and back.config == config and not back.missing_heads
  jax.tree.map(np.testing.assert_array_equal, back.params, params)

  native.write(str(tmp_path / "ours"), back)
  saved = json.loads((tmp_path / "ours" / "config.json").read_text())
  assert saved["model"]["family"] == "toy" and saved["heads"] == ["mlm"]
  model, loaded = pretrained.load_pretrained(str(tmp_path / "ours"))
  assert isinstance(model, ToyModel) and model.config == config
  jax.tree.map(np.testing.assert_array_equal, loaded, params)


def _fine_tuned(directory, kind, seed):
  """A toy `bert-jax finetune` workdir with random weights: (its config.json, params)."""
  config = heads.encoder_config(ToyConfig(), kind, "pooled")
  params = _random_params(heads.FinetuneModel(config, kind, 3), seed)
  saved = {"model": config.to_dict(), "head": {"pooling": "pooled", "dropout": 0.1},
           "task": {"family": "test", "name": f"toy_{kind}", "head": kind, "num_labels": 3, "labels": ["a", "b", "c"]},
           "data": {"max_seq_length": LENGTH}, "train": {"eval_batch_size": 4}}
  params_checkpoint.save_params(str(directory), params, saved)
  return saved, params


@pytest.mark.parametrize("kind", ["classification", "token"])
def test_toy_family_fine_tunes_with_its_own_pooling_and_exports_it(toy_family, tmp_path, capsys, kind):
  saved, params = _fine_tuned(tmp_path / "ft", kind, seed=1)
  assert not saved["model"]["mlm_head"] and "mlm_bias" not in params  # its pooling reads no pretraining head
  assert set(params["head"]) == {"summary" if kind == "classification" else "token_transform", "classifier"}
  assert cli.main(["convert", "--to", "hf", str(tmp_path / "ft"), str(tmp_path / "hf")]) == 0
  assert "not written" not in capsys.readouterr().out
  written = json.loads((tmp_path / "hf" / "config.json").read_text())
  architecture = {"classification": "ToyForSequenceClassification", "token": "ToyForTokenClassification"}[kind]
  assert written["architectures"] == [architecture] and written["id2label"]["2"] == "c"

  t = safetensors.numpy.load_file(tmp_path / "hf" / "model.safetensors")
  ids = _ids(ToyConfig.vocab_size)
  mask = (np.arange(LENGTH)[None] < np.array([[6], [2], [4]])).astype(np.int32)
  hidden, _ = numpy_toy(t, ids)
  if kind == "classification":
    mean = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    features = np.tanh(mean @ t["head.dense.weight"].T + t["head.dense.bias"])
  else:
    features = np.maximum(hidden @ t["head.dense.weight"].T + t["head.dense.bias"], 0)
  reference = features @ t["classifier.weight"].T + t["classifier.bias"]
  ours = Predictor.build(saved, params, tokenizer=None).run(
      {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
  np.testing.assert_allclose(ours["logits"], reference, atol=1e-5)
  assert np.abs(reference).max() > 0.05


def test_a_roberta_layout_family_is_one_record(monkeypatch, tmp_path):
  """As CamemBERT or XLM-R: RoBERTa's rows and config translation under its own model_type; its
  ModelConfig keeps the family through `replace` (it is not read off the switches)."""
  read_config = functools.partial(bert_layout.read_hf_config, with_heads=roberta.with_heads,
                                  defaults={"pad_token_id": 1}, gelu_mlm="roberta_like", position_style="roberta",
                                  family="roberta_like")
  record = dataclasses.replace(roberta.FAMILY, name="roberta_like", hf=dataclasses.replace(
      roberta.FAMILY.hf, model_type="roberta_like", read_config=read_config))
  monkeypatch.setitem(families._FAMILIES, "roberta_like", record)  # pylint: disable=protected-access
  monkeypatch.setitem(families._BY_MODEL_TYPE, "roberta_like", record)  # pylint: disable=protected-access
  config = ModelConfig(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=20,
                       max_position_embeddings=40, position_style="roberta", pad_token_id=1, type_vocab_size=1,
                       use_pooler=False, sentence_head="none", family="roberta_like")
  assert config.replace(mlm_head=False).family == "roberta_like" and families.of(config) is record
  params = _random_params(families.build(config))
  hf.write(str(tmp_path / "hf"), common.Converted("roberta_like", config, params, None))
  assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "roberta_like"
  back = hf.read(str(tmp_path / "hf"))
  assert back.family == "roberta_like" and back.config == config
  jax.tree.map(np.testing.assert_array_equal, back.params, params)


def test_registry_lookups_and_the_family_key():
  # Every module of models/records/, BERT first and the rest in the order of their modules' names.
  assert families.names()[:2] == ("bert", "albert")
  assert {"camembert", "electra", "mobilebert", "modernbert", "roberta", "xlm-roberta"} <= set(families.names())
  with pytest.raises(UserError, match=r"model.family='xlnet_typo' is not one of \('bert', 'albert'"):
    families.get("xlnet_typo")
  with pytest.raises(UserError, match="unknown architecture GPT2LMHeadModel"):
    families.by_model_type("gpt2", "dir", "GPT2LMHeadModel")
  # A "model" dict saved before the key existed: the family is read off the switches, as before.
  assert families.model_config({"share_layers": "all"}).family == "albert"
  assert families.model_config({"position_style": "roberta"}).family == "roberta"
  assert families.model_config({"embedding_size": 128}).family == "electra"
  assert families.model_config({}).to_dict()["family"] == "bert"
  electra_base = ModelConfig(rtd_head=True, use_pooler=False, mlm_head=False, sentence_head="none")
  assert electra_base.family == "electra" and electra_base.replace(rtd_head=False).family == "bert"
  with pytest.raises(UserError, match="model.family='roberta', but these switches make a 'bert' model"):
    ModelConfig(family="roberta")


def test_adapters_are_a_record_capability(toy_family):
  # finetune/modes.py asked isinstance(model, ModelConfig) before the hook: the same families answer yes.
  assert {n for n in families.names() if families.get(n).adapters} == {
      n for n in families.names() if families.get(n).config is ModelConfig}
  train = ml_collections.ConfigDict({"mode": "adapters", "adapter_size": 8})
  assert modes.model_config(ModelConfig(family="bert"), train).adapter_size == 8
  with pytest.raises(UserError, match="a toy model has none"):
    modes.model_config(ToyConfig(), train)

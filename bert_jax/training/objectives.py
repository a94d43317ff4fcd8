"""Pretraining objectives: a model plus how its loss and metrics are computed from a batch.

A loss is a combination of additive statistics: `sums(params, batch)` are sums over rows (summing them
over micro-batches gives the full batch's), `counts(batch)` are the denominators, which depend on the
data only. `loss(sums, counts)` is linear in the sums, so accumulating gradients over micro-batches
with the full batch's counts gives exactly the full batch's gradient.
"""
from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bert_jax.errors import UserError
from bert_jax.models.bert import BertModel, ModelOutput
from bert_jax.models.config import ModelConfig

Batch = Mapping[str, jax.Array]

HEAD_NAMES = ("mlm_head", "sentence_classifier", "rtd_head")
FAMILY_OBJECTIVES = ("electra", "spanbert")  # in family.py


def example_batch(batch_size: int, seq_len: int, max_predictions: int) -> dict[str, np.ndarray]:
  """An all-zeros batch of the data contract's shapes (for init and abstract evaluation)."""
  tokens = np.zeros((batch_size, seq_len), np.int32)
  preds = np.zeros((batch_size, max_predictions), np.int32)
  return {"input_ids": tokens, "input_mask": tokens + 1, "segment_ids": tokens,
          "masked_lm_positions": preds, "masked_lm_ids": preds,
          "masked_lm_weights": preds.astype(np.float32),
          "next_sentence_labels": np.zeros((batch_size,), np.int32)}


def token_nll_and_correct(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
  """logits: f32[..., V], labels: int[...] -> (negative log-likelihood, label logit == max logit).

  One-hot products rather than gathers/argmax along V: the vocab axis may be sharded over the mesh.
  The loss is (max - label logit) + log(sum(exp(logits - max))): no cancellation between two large
  log-sum-exp and label terms, and exactly the log-sum-exp term when the label is the max.
  """
  logits = logits.astype(jnp.float32)
  one_hot = jax.nn.one_hot(labels, logits.shape[-1], dtype=jnp.float32)
  label_logit = jnp.sum(logits * one_hot, axis=-1)
  top = jax.lax.stop_gradient(jnp.max(logits, axis=-1))
  nll = (top - label_logit) + jnp.log(jnp.sum(jnp.exp(logits - top[..., None]), axis=-1))
  correct = (label_logit >= top).astype(jnp.float32)
  return nll, correct


def model_inputs(batch: Batch) -> dict[str, Any]:
  """Maps the data contract's feature names to the model's arguments."""
  return dict(input_ids=batch["input_ids"], attention_mask=batch["input_mask"],
              token_type_ids=batch["segment_ids"], position_ids=batch.get("position_ids"),
              document_ids=batch.get("document_ids"), masked_positions=batch["masked_lm_positions"])


class BertPretraining:
  """Masked LM at the masked positions, plus NSP or SOP on the pooled output when configured."""

  def __init__(self, model_config: ModelConfig):
    self.config = model_config
    self.model = BertModel(model_config)
    self.sentence = model_config.sentence_head

  def init(self, rng: jax.Array, batch: Batch) -> Any:
    params_rng, dropout_rng = jax.random.split(rng)
    variables = self.model.init({"params": params_rng, "dropout": dropout_rng}, **model_inputs(batch),
                                deterministic=True)
    return variables["params"]

  def apply(self, params: Any, batch: Batch, rng: jax.Array | None, deterministic: bool) -> ModelOutput:
    rngs = None if deterministic else {"dropout": rng}
    return self.model.apply({"params": params}, **model_inputs(batch), deterministic=deterministic,
                            rngs=rngs)

  def backbone(self, params: Any) -> Any:
    """The parameters the papers count as the model's size: embeddings, encoder, pooler."""
    return {k: v for k, v in params.items() if k not in HEAD_NAMES}

  def counts(self, batch: Batch) -> dict[str, jax.Array]:
    return {"mlm": jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)),
            "rows": jnp.asarray(batch["input_ids"].shape[0], jnp.float32)}

  def sums(self, params: Any, batch: Batch, rng: jax.Array | None, deterministic: bool
           ) -> dict[str, jax.Array]:
    out = self.apply(params, batch, rng, deterministic)
    weights = batch["masked_lm_weights"].astype(jnp.float32)
    nll, correct = token_nll_and_correct(out.mlm_logits, batch["masked_lm_ids"])
    sums = {"mlm_loss": jnp.sum(nll * weights), "mlm_correct": jnp.sum(correct * weights)}
    if self.sentence != "none":
      logits = out.nsp_logits if self.sentence == "nsp" else out.sop_logits
      s_nll, s_correct = token_nll_and_correct(logits, batch["next_sentence_labels"])
      sums.update(sentence_loss=jnp.sum(s_nll), sentence_correct=jnp.sum(s_correct))
    return sums

  def loss(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> jax.Array:
    loss = sums["mlm_loss"] / jnp.maximum(counts["mlm"], 1.0)
    if self.sentence != "none":
      loss = loss + sums["sentence_loss"] / counts["rows"]
    return loss

  def metrics(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> dict[str, jax.Array]:
    n = jnp.maximum(counts["mlm"], 1.0)
    metrics = {"mlm_loss": sums["mlm_loss"] / n, "mlm_accuracy": sums["mlm_correct"] / n}
    if self.sentence != "none":
      metrics[f"{self.sentence}_loss"] = sums["sentence_loss"] / counts["rows"]
      metrics[f"{self.sentence}_accuracy"] = sums["sentence_correct"] / counts["rows"]
    return metrics


def make_objective(config: ml_collections.ConfigDict):
  """The objective named by `config.objective`."""
  model_config = ModelConfig.from_dict(config.model.to_dict())
  if config.objective == "bert":
    return BertPretraining(model_config)
  if config.objective in FAMILY_OBJECTIVES:
    from bert_jax.training import family  # pylint: disable=import-outside-toplevel  (it imports this module)
    return family.make_objective(config, model_config)
  raise UserError(f"objective={config.objective!r} is not one of {('bert',) + FAMILY_OBJECTIVES}")

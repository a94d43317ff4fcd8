"""Objectives of the BERT family beyond plain MLM (+ NSP/SOP): ELECTRA and SpanBERT.

Both follow the interface in objectives.py: `sums` are additive over rows, `counts` depend on the data
only and `loss` is linear in the sums, so gradient accumulation stays exact.
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bert_jax.errors import UserError
from bert_jax.models import electra
from bert_jax.models.config import ModelConfig
from bert_jax.models.spanbert import SpanBoundaryHead
from bert_jax.training.objectives import (HEAD_NAMES, Batch, BertPretraining, model_inputs,
                                          token_nll_and_correct)


def _mlm_sums(logits: jax.Array, batch: Batch, prefix: str = "mlm") -> dict[str, jax.Array]:
  weights = batch["masked_lm_weights"].astype(jnp.float32)
  nll, correct = token_nll_and_correct(logits, batch["masked_lm_ids"])
  return {f"{prefix}_loss": jnp.sum(nll * weights), f"{prefix}_correct": jnp.sum(correct * weights)}


class ElectraPretraining:
  """Generator MLM + `disc_weight` x replaced-token detection over every real token (ELECTRA).

  The generator's samples at the masked positions build the discriminator's input; the sampling has its
  own rng and no gradient. num_params (backbone) counts the discriminator, as the paper does.
  """

  def __init__(self, model_config: ModelConfig, generator_hidden_fraction: float,
               generator_layer_fraction: float, disc_weight: float):
    self.config = model_config
    self.model = electra.Electra.from_config(model_config, generator_hidden_fraction,
                                             generator_layer_fraction)
    self.disc_weight = disc_weight

  def init(self, rng: jax.Array, batch: Batch) -> Any:
    return self.model.init(rng, model_inputs(batch))

  def backbone(self, params: Any) -> Any:
    return {k: v for k, v in params["discriminator"].items() if k not in HEAD_NAMES}

  def counts(self, batch: Batch) -> dict[str, jax.Array]:
    return {"mlm": jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)),
            "tokens": jnp.sum(batch["input_mask"].astype(jnp.float32))}

  def sums(self, params: Any, batch: Batch, rng: jax.Array | None, deterministic: bool
           ) -> dict[str, jax.Array]:
    # Evaluation (rng None) still samples replacements: from a fixed key, so it is repeatable.
    gen_rng, disc_rng, sample_rng = (jax.random.split(rng, 3) if rng is not None
                                     else (None, None, jax.random.key(0)))
    inputs = model_inputs(batch)
    gen = self.model.run_generator(params, inputs, gen_rng, deterministic)
    samples = electra.sample_tokens(gen.mlm_logits, sample_rng)
    ids, replaced = electra.replace_tokens(batch["input_ids"], batch["masked_lm_positions"],
                                           batch["masked_lm_weights"], batch["masked_lm_ids"], samples)
    disc = self.model.run_discriminator(params, {**inputs, "input_ids": ids}, disc_rng, deterministic)
    real = batch["input_mask"].astype(jnp.float32)
    predicted = (disc.rtd_logits > 0).astype(jnp.float32)
    bce = optax.sigmoid_binary_cross_entropy(disc.rtd_logits, replaced)
    return {**_mlm_sums(gen.mlm_logits, batch),
            "disc_loss": jnp.sum(bce * real),
            "disc_correct": jnp.sum((predicted == replaced) * real),
            "disc_true_positive": jnp.sum(predicted * replaced * real),
            "disc_predicted": jnp.sum(predicted * real),
            "disc_replaced": jnp.sum(replaced * real)}

  def loss(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> jax.Array:
    return (sums["mlm_loss"] / jnp.maximum(counts["mlm"], 1.0)
            + self.disc_weight * sums["disc_loss"] / jnp.maximum(counts["tokens"], 1.0))

  def metrics(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> dict[str, jax.Array]:
    n_mlm, n_tok = jnp.maximum(counts["mlm"], 1.0), jnp.maximum(counts["tokens"], 1.0)
    return {"mlm_loss": sums["mlm_loss"] / n_mlm, "mlm_accuracy": sums["mlm_correct"] / n_mlm,
            "disc_loss": sums["disc_loss"] / n_tok, "disc_accuracy": sums["disc_correct"] / n_tok,
            "disc_precision": sums["disc_true_positive"] / jnp.maximum(sums["disc_predicted"], 1.0),
            "disc_recall": sums["disc_true_positive"] / jnp.maximum(sums["disc_replaced"], 1.0),
            "replaced_fraction": sums["disc_replaced"] / n_tok}


class SpanBertPretraining(BertPretraining):
  """MLM + the span boundary objective at the same predictions (SpanBERT); loss = their sum.

  Needs data.masking="span" (the batch carries masked_lm_span_left/right/offset) and no sentence head
  (SpanBERT drops NSP; make_objective checks both). Predictions deeper
  than the head's position table into their span count for MLM only, as in the released code.
  """

  def __init__(self, model_config: ModelConfig):
    super().__init__(model_config)
    self.head = SpanBoundaryHead(model_config)

  def init(self, rng: jax.Array, batch: Batch) -> Any:
    bert_rng, head_rng = jax.random.split(rng)
    params = super().init(bert_rng, batch)
    table = nn.meta.unbox(params["embeddings"]["word_embeddings"]["embedding"])
    preds = jnp.zeros_like(batch["masked_lm_positions"])
    hidden = jnp.zeros(preds.shape[:1] + (batch["input_ids"].shape[1], self.config.hidden_size))
    head = self.head.init(head_rng, hidden, preds, preds, preds, table)["params"]
    return {**params, "sbo_head": head}

  def backbone(self, params: Any) -> Any:
    return super().backbone({k: v for k, v in params.items() if k != "sbo_head"})

  def _sbo_weights(self, batch: Batch) -> jax.Array:
    inside = batch["masked_lm_span_offset"] < self.head.max_span_positions
    return batch["masked_lm_weights"].astype(jnp.float32) * inside

  def counts(self, batch: Batch) -> dict[str, jax.Array]:
    return {**super().counts(batch), "sbo": jnp.sum(self._sbo_weights(batch))}

  def sums(self, params: Any, batch: Batch, rng: jax.Array | None, deterministic: bool
           ) -> dict[str, jax.Array]:
    out = self.apply({k: v for k, v in params.items() if k != "sbo_head"}, batch, rng, deterministic)
    offset = jnp.minimum(batch["masked_lm_span_offset"], self.head.max_span_positions - 1)
    logits = self.head.apply({"params": params["sbo_head"]}, out.last_hidden_state,
                             batch["masked_lm_span_left"], batch["masked_lm_span_right"], offset,
                             params["embeddings"]["word_embeddings"]["embedding"])
    nll, correct = token_nll_and_correct(logits, batch["masked_lm_ids"])
    weights = self._sbo_weights(batch)
    return {**_mlm_sums(out.mlm_logits, batch),
            "sbo_loss": jnp.sum(nll * weights), "sbo_correct": jnp.sum(correct * weights)}

  def loss(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> jax.Array:
    return super().loss(sums, counts) + sums["sbo_loss"] / jnp.maximum(counts["sbo"], 1.0)

  def metrics(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> dict[str, jax.Array]:
    n = jnp.maximum(counts["sbo"], 1.0)
    return {**super().metrics(sums, counts), "sbo_loss": sums["sbo_loss"] / n,
            "sbo_accuracy": sums["sbo_correct"] / n}


def make_objective(config, model_config: ModelConfig):
  """ELECTRA or SpanBERT from a run config, after checking the keys they need."""
  if config.objective == "electra":
    if "electra" not in config:
      raise UserError("objective='electra' needs the config section `electra` (generator_hidden_fraction, "
                      "generator_layer_fraction, disc_weight); start from configs/electra.py")
    e = config.electra
    return ElectraPretraining(model_config, e.generator_hidden_fraction, e.generator_layer_fraction,
                              e.disc_weight)
  if config.data.masking != "span":
    raise UserError(f"objective='spanbert' needs data.masking='span', got {config.data.masking!r}")
  if model_config.sentence_head != "none" or not model_config.mlm_head:
    raise UserError("objective='spanbert' needs model.mlm_head=True and model.sentence_head='none', got "
                    f"{model_config.mlm_head} and {model_config.sentence_head!r}")
  return SpanBertPretraining(model_config)

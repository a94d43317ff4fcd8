"""ELECTRA's pretraining objective: a generator's MLM and the discriminator's replaced-token detection."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from bert_jax.errors import UserError
from bert_jax.models import electra
from bert_jax.models.config import ModelConfig
from bert_jax.training.objectives.base import HEAD_NAMES, Batch, mlm_sums, model_inputs
from bert_jax.training.objectives.registry import register


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
    return {**mlm_sums(gen.mlm_logits, batch),
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


@register("electra")
def from_config(config: ml_collections.ConfigDict, model_config: ModelConfig) -> ElectraPretraining:
  """ELECTRA from a run config, after checking it has the `electra` section."""
  if "electra" not in config:
    raise UserError("objective='electra' needs the config section `electra` (generator_hidden_fraction, "
                    "generator_layer_fraction, disc_weight); start from configs/electra.py")
  e = config.electra
  return ElectraPretraining(model_config, e.generator_hidden_fraction, e.generator_layer_fraction,
                            e.disc_weight)

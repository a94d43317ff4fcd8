"""BERT's pretraining objective: masked LM, plus NSP or SOP (ALBERT) when the model has a sentence head."""
from __future__ import annotations

import inspect
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from bert_jax.models import families
from bert_jax.models.bert import ModelOutput
from bert_jax.models.config import ModelConfig
from bert_jax.training.objectives.base import (HEAD_NAMES, Batch, mlm_sums, model_inputs,
                                               token_nll_and_correct)
from bert_jax.training.objectives.registry import register


class BertPretraining:
  """Masked LM at the masked positions, plus NSP or SOP on the pooled output when configured."""

  def __init__(self, model_config: ModelConfig):
    self.config = model_config
    self.model = families.build(model_config)
    self.sentence = model_config.sentence_head
    # The model can run its last layer at the heads' positions only (BertModel's heads_only).
    self.model_takes_heads_only = "heads_only" in inspect.signature(self.model.__call__).parameters

  def init(self, rng: jax.Array, batch: Batch) -> Any:
    params_rng, dropout_rng = jax.random.split(rng)
    variables = self.model.init({"params": params_rng, "dropout": dropout_rng}, **model_inputs(batch),
                                deterministic=True)
    return variables["params"]

  def apply(self, params: Any, batch: Batch, rng: jax.Array | None, deterministic: bool,
            heads_only: bool = False) -> ModelOutput:
    """The model's outputs; heads_only: only the heads' (last_hidden_state None), the last layer run at
    their positions where the model can (less work, the same outputs)."""
    rngs = None if deterministic else {"dropout": rng}
    extra = {"heads_only": True} if heads_only and self.model_takes_heads_only else {}
    return self.model.apply({"params": params}, **model_inputs(batch), deterministic=deterministic,
                            rngs=rngs, **extra)

  def backbone(self, params: Any) -> Any:
    """The parameters the papers count as the model's size: embeddings, encoder, pooler."""
    return {k: v for k, v in params.items() if k not in HEAD_NAMES}

  def counts(self, batch: Batch) -> dict[str, jax.Array]:
    return {"mlm": jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)),
            "rows": jnp.asarray(batch["input_ids"].shape[0], jnp.float32)}

  def sums(self, params: Any, batch: Batch, rng: jax.Array | None, deterministic: bool
           ) -> dict[str, jax.Array]:
    return self.output_sums(self.apply(params, batch, rng, deterministic, heads_only=True), batch)

  def output_sums(self, out: ModelOutput, batch: Batch) -> dict[str, jax.Array]:
    """sums() of the model's outputs."""
    sums = mlm_sums(out.mlm_logits, batch)
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


@register("bert", bert_mlm=True)
def from_config(config: ml_collections.ConfigDict, model_config: ModelConfig) -> BertPretraining:
  return BertPretraining(model_config)

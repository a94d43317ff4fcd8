"""StructBERT's pretraining objective (Wang et al. 2019): masked LM plus the word and sentence structural
objectives."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from bert_jax.errors import UserError
from bert_jax.models.bert import dense
from bert_jax.models.config import ModelConfig
from bert_jax.training.objectives.base import Batch, mlm_sums, token_nll_and_correct
from bert_jax.training.objectives.bert import BertPretraining
from bert_jax.training.objectives.registry import register

SSO_CLASSES = 3  # B follows A, B precedes A, B from another document (data_pipelines/examples.py)


class StructBertPretraining(BertPretraining):
  """MLM + WSO + SSO; loss = the sum of their means.

  WSO: the MLM output layer, at the shuffled trigrams' positions (data.trigram_shuffle_rate, the batch's
  shuffled_*), predicts the original tokens; MLM and WSO logits come from one gather of P + S positions.
  SSO: a 3-way classifier on the pooled output (data.example_builder="sso": labels 0 next, 1 previous,
  2 random); its params sit beside the encoder's under "sso_head", so the rest of the tree stays exactly
  a BertModel's (with pooler, without a sentence head).
  """

  def __init__(self, model_config: ModelConfig):
    super().__init__(model_config)
    self.head = dense(model_config, SSO_CLASSES, ("embed", "classes"), "sso_head")

  def init(self, rng: jax.Array, batch: Batch) -> Any:
    bert_rng, head_rng = jax.random.split(rng)
    params = super().init(bert_rng, batch)
    pooled = jnp.zeros((batch["input_ids"].shape[0], self.config.hidden_size))
    return {**params, "sso_head": self.head.init(head_rng, pooled)["params"]}

  def backbone(self, params: Any) -> Any:
    return super().backbone({k: v for k, v in params.items() if k != "sso_head"})

  def counts(self, batch: Batch) -> dict[str, jax.Array]:
    return {**super().counts(batch), "wso": jnp.sum(batch["shuffled_weights"].astype(jnp.float32))}

  def sums(self, params: Any, batch: Batch, rng: jax.Array | None, deterministic: bool
           ) -> dict[str, jax.Array]:
    num_masked = batch["masked_lm_positions"].shape[1]
    positions = jnp.concatenate([batch["masked_lm_positions"], batch["shuffled_positions"]], axis=1)
    out = self.apply({k: v for k, v in params.items() if k != "sso_head"},
                     {**batch, "masked_lm_positions": positions}, rng, deterministic, heads_only=True)
    wso_nll, wso_correct = token_nll_and_correct(out.mlm_logits[:, num_masked:], batch["shuffled_ids"])
    weights = batch["shuffled_weights"].astype(jnp.float32)
    sso_logits = self.head.apply({"params": params["sso_head"]}, out.pooled_output)
    sso_nll, sso_correct = token_nll_and_correct(sso_logits, batch["next_sentence_labels"])
    return {**mlm_sums(out.mlm_logits[:, :num_masked], batch),
            "wso_loss": jnp.sum(wso_nll * weights), "wso_correct": jnp.sum(wso_correct * weights),
            "sso_loss": jnp.sum(sso_nll), "sso_correct": jnp.sum(sso_correct)}

  def loss(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> jax.Array:
    return (super().loss(sums, counts) + sums["wso_loss"] / jnp.maximum(counts["wso"], 1.0)
            + sums["sso_loss"] / counts["rows"])

  def metrics(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> dict[str, jax.Array]:
    n = jnp.maximum(counts["wso"], 1.0)
    return {**super().metrics(sums, counts), "wso_loss": sums["wso_loss"] / n,
            "wso_accuracy": sums["wso_correct"] / n, "sso_loss": sums["sso_loss"] / counts["rows"],
            "sso_accuracy": sums["sso_correct"] / counts["rows"]}


@register("structbert", structural_inputs=True, bert_mlm=True)
def from_config(config: ml_collections.ConfigDict, model_config: ModelConfig) -> StructBertPretraining:
  """StructBERT from a run config, after checking its data and heads."""
  data = config.data
  if data.example_builder != "sso":
    raise UserError(f"objective='structbert' needs data.example_builder='sso' (next / previous / random "
                    f"segment), got {data.example_builder!r}")
  if not 0 < data.trigram_shuffle_rate < 1:
    raise UserError(f"objective='structbert' needs data.trigram_shuffle_rate in (0, 1) (the paper shuffles "
                    f"5% of the trigrams: 0.05), got {data.trigram_shuffle_rate}")
  if not (model_config.mlm_head and model_config.use_pooler) or model_config.sentence_head != "none":
    raise UserError("objective='structbert' needs model.mlm_head=True, model.use_pooler=True and "
                    "model.sentence_head='none' (it adds its own 3-way head), got "
                    f"{model_config.mlm_head}, {model_config.use_pooler} and {model_config.sentence_head!r}")
  return StructBertPretraining(model_config)

"""The fine-tuning objective: a task head's loss as additive sums, so it trains through the shared step.

Each head kind's loss is a sum over rows (or labelled tokens) divided by a count that depends on the
data only (models/head_kinds.py lists them), as the pretraining objectives do (training/step.py), so
micro-batches give exactly the full batch's gradient. With SMART (finetune/smart.py) the adversarial and Bregman terms are sums over the same rows (or
tokens), added to the loss with their weights before the division.
"""
from __future__ import annotations

from typing import Any

import jax
import ml_collections

from bert_jax.finetune import heads, smart
from bert_jax.finetune.features import MODEL_INPUTS
from bert_jax.models import head_kinds, unpad


class FinetuneObjective:
  """smart_config: the `smart` config section when SMART is on, else None."""

  def __init__(self, model: heads.FinetuneModel, smart_config: ml_collections.ConfigDict | None = None):
    self.model = model
    self.kind = model.kind
    self.head = head_kinds.get(model.kind)
    self.smart = smart_config

  @property
  def packs_rows(self) -> bool:
    """Its training step takes a batch's real tokens packed into fewer rows (models/unpad.py): not with SMART,
    whose perturbation is of the padded embeddings."""
    return self.smart is None

  def init(self, rng: jax.Array, batch: dict[str, jax.Array]) -> Any:
    return self.model.init(rng, *(batch[k] for k in MODEL_INPUTS))["params"]

  def apply(self, params: Any, batch: dict[str, jax.Array], rng: jax.Array | None = None,
            deterministic: bool = True, head_mask: jax.Array | None = None,
            delta: jax.Array | None = None, labelled: bool = False) -> dict[str, jax.Array]:
    """head_mask: [L, N] or [N] (BertModel's); head importance differentiates the loss in it.
    delta [B, T, H] is added to the embedding output (SMART). labelled: the outputs the loss reads (the
    head kind's label_inputs passed to it), not predict's."""
    rngs = None if deterministic else {"dropout": rng}
    labels = {k: batch[k] for k in self.head.label_inputs} if labelled and self.head.label_inputs else None
    extra = {"labels": labels} if labels else {}
    args, packed = unpad.model_inputs(batch)  # a packed batch's rows (models/unpad.py) or the padded one
    return smart.with_embedding_perturbation(
        lambda: self.model.apply({"params": params}, *args, deterministic=deterministic, rngs=rngs,
                                 head_mask=head_mask, **extra, **packed), delta)

  def counts(self, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    return {"labels": self.head.count(batch)}

  def sums(self, params: Any, batch: dict[str, jax.Array], rng: jax.Array | None, deterministic: bool,
           head_mask: jax.Array | None = None, teacher: Any = None) -> dict[str, jax.Array]:
    """The task loss summed (plus SMART's terms in training); teacher: SMART's momentum teacher."""
    outputs = self.apply(params, batch, rng, deterministic, head_mask, labelled=True)
    state_loss = outputs.pop("state_loss", None)  # head.cls_norm's estimates (models/isobn.py); value 0
    sums = {"loss": self.head.loss(outputs, batch)}
    if state_loss is not None:  # times the count the loss is divided by: the estimates' gradient as it is
      sums["loss"] = sums["loss"] + state_loss * self.head.count(batch)
    if self.smart is not None and not deterministic:
      apply = lambda p, delta: self.apply(p, batch, rng, False, head_mask, delta, labelled=True)  # noqa: E731
      sums.update(smart.sums(apply, params, teacher, outputs, batch, rng, self.smart, self.kind,
                             self.model.config.hidden_size))
    return sums

  def loss(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> jax.Array:
    total = sums["loss"]
    if "smart_adversarial" in sums:
      total = total + self.smart.adversarial_weight * sums["smart_adversarial"]
    if "smart_bregman" in sums:
      total = total + self.smart.bregman_weight * sums["smart_bregman"]
    return total / counts["labels"]

  def metrics(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """The task loss alone and SMART's terms, each per row (or token), when SMART is on."""
    if self.smart is None:
      return {}
    return {("task_loss" if k == "loss" else k): v / counts["labels"] for k, v in sums.items()}


def predict_step(params: Any, batch: dict[str, jax.Array], *, objective: FinetuneObjective
                 ) -> dict[str, jax.Array]:
  """The head's outputs for one batch (the eval step of fine-tuning)."""
  return objective.apply(params, batch)

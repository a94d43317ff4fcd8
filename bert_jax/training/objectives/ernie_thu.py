"""ERNIE-THU's pretraining (Zhang et al. 2019, "ERNIE: Enhanced Language Representation with Informative
Entities", section 4.3): the masked LM (+ NSP) of BERT plus the denoising entity auto-encoder (dEA).

The model is BERT with its top model.entity_layers layers fused with a stream of frozen entity vectors
(models/bert.py:KnowledgeLayer). The entity inputs are made on the host for each batch (`EntityFeed`, in
front of the pretraining input; data_pipelines/entities.py): each token's aligned entity (read from the batch's
`entity_ids`, else matched by the `ernie_thu.mentions` list), noised for dEA (ernie_thu.dea_replace of the
alignments replaced by a random entity, ernie_thu.dea_mask masked, the rest kept), and looked up in the frozen
table (`ernie_thu.entity_embeddings`, a .npy [N, model.entity_dim]); the table is no parameter: it is not
trained and not in the checkpoints.

dEA: at every originally aligned token j, p(e | w_j) = softmax over the row's candidate entities e (the
distinct entities aligned in the row, at most ernie_thu.max_entities) of (W w_j + b) . e, w_j the token's final
hidden state and W, b the `dea_head` (H -> entity_dim); its loss is the mean negative log-likelihood over the
aligned tokens, added to BERT's loss.
"""
from __future__ import annotations

import zlib
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bert_jax.data_pipelines import entities
from bert_jax.errors import UserError
from bert_jax.models.bert import ModelOutput, dense
from bert_jax.models.config import ModelConfig
from bert_jax.training.objectives.base import Batch, BatchFeed, model_inputs, token_nll_and_correct
from bert_jax.training.objectives.bert import BertPretraining
from bert_jax.training.objectives.registry import register

HEAD = "dea_head"  # beside the encoder's params
FEATURES = ("entity_vectors", "entity_mask", "entity_candidates", "entity_candidate_mask", "entity_labels")


class EntityFeed(BatchFeed):
  """The pretraining input with ERNIE-THU's entity features added to each batch (entities.features): the dEA
  noise of train batch `first_step + k` drawn from (seed, first_step + k), so a resumed run noises as the
  uninterrupted one; a held-out batch's from its ids, so every evaluation sees the same."""

  def __init__(self, inputs, objective: "ErnieThuPretraining", first_step: int, split: str, seed: int):
    super().__init__(inputs, first_step, split)
    self._objective, self._seed = objective, seed

  def added(self, batch: dict) -> dict:
    if self.split == "eval":
      rng = np.random.default_rng([self._seed & 0xFFFFFFFF, 2, zlib.crc32(np.ascontiguousarray(batch["input_ids"]))])
    else:
      rng = np.random.default_rng([self._seed & 0xFFFFFFFF, 1, self.step])
    return self._objective.add_features(batch, rng)


class ErnieThuPretraining(BertPretraining):
  """BERT's MLM (+ NSP) with the knowledgeable encoder and the dEA loss; see the module docstring."""

  def __init__(self, model_config: ModelConfig, table: np.ndarray, mentions: entities.Mentions | None = None,
               max_entities: int = 16, replace: float = 0.05, mask: float = 0.15):
    if not model_config.entity_layers:
      raise UserError("objective='ernie_thu' needs model.entity_layers > 0 (the fusion layers that read the entities)")
    super().__init__(model_config)
    self.table, self.mentions = table, mentions
    self.max_entities, self.replace, self.mask = max_entities, replace, mask
    self.head = dense(model_config, model_config.entity_dim, ("embed", "mlp"), HEAD)

  def add_features(self, batch: dict, rng: np.random.Generator) -> dict:
    """`batch` with the entity features; its alignments from `entity_ids` when it has them, else matched."""
    batch = dict(batch)
    ids = batch.pop("entity_ids", None)
    if ids is None:
      if self.mentions is None:
        raise UserError("objective='ernie_thu': the batches carry no entity_ids and no ernie_thu.mentions list "
                        "is set to find them")
      ids = np.stack([self.mentions.match(row) for row in entities.original_ids(batch)])
    batch.update(entities.features(np.asarray(ids, np.int32), self.table, self.max_entities, self.replace,
                                   self.mask, rng))
    return batch

  def feature_shapes(self, batch_size: int, seq_len: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (dtype, shape) of the features the feed adds (entities.features): with the data contract's, the
    batch `bert-jax compile` lowers the step for (tpu/aot.py)."""
    rows, dim, cands = batch_size, self.config.entity_dim, self.max_entities
    return {"entity_vectors": ("float32", (rows, seq_len, dim)), "entity_mask": ("int32", (rows, seq_len)),
            "entity_candidates": ("float32", (rows, cands, dim)), "entity_candidate_mask": ("int32", (rows, cands)),
            "entity_labels": ("int32", (rows, seq_len))}

  def _with_entities(self, batch: Batch) -> dict:
    """The batch with zero (no) entity features where it has none (init's example batch; labels -1: none)."""
    shapes = self.feature_shapes(*batch["input_ids"].shape)
    zeros = {k: jnp.full(shape, -1 if k == "entity_labels" else 0, dtype) for k, (dtype, shape) in shapes.items()}
    return {**zeros, **batch}

  def init(self, rng: jax.Array, batch: Batch) -> Any:
    model_rng, head_rng = jax.random.split(rng)
    batch = self._with_entities(batch)
    params = super().init(model_rng, batch)
    x = jnp.zeros((1, self.config.hidden_size))
    return {**params, HEAD: self.head.init(head_rng, x)["params"]}

  def apply(self, params: Any, batch: Batch, rng: jax.Array | None, deterministic: bool) -> ModelOutput:
    rngs = None if deterministic else {"dropout": rng}
    params = {k: v for k, v in params.items() if k != HEAD}
    return self.model.apply({"params": params}, **model_inputs(batch), entity_vectors=batch.get("entity_vectors"),
                            entity_mask=batch.get("entity_mask"), deterministic=deterministic, rngs=rngs)

  def backbone(self, params: Any) -> Any:
    return super().backbone({k: v for k, v in params.items() if k != HEAD})

  def counts(self, batch: Batch) -> dict[str, jax.Array]:
    batch = self._with_entities(batch)
    return {**super().counts(batch), "dea": jnp.sum((batch["entity_labels"] >= 0).astype(jnp.float32))}

  def dea_logits(self, params: Any, hidden: jax.Array, batch: Batch) -> jax.Array:
    """f32[B, T, C]: each token's projected final state . each candidate's vector; -1e9 on empty candidates."""
    projected = self.head.apply({"params": params[HEAD]}, hidden).astype(jnp.float32)
    logits = jnp.einsum("btd,bcd->btc", projected, batch["entity_candidates"].astype(jnp.float32))
    return jnp.where(batch["entity_candidate_mask"][:, None, :] > 0, logits, -1e9)

  def sums(self, params: Any, batch: Batch, rng: jax.Array | None, deterministic: bool) -> dict[str, jax.Array]:
    batch = self._with_entities(batch)
    out = self.apply(params, batch, rng, deterministic)
    sums = self.output_sums(out, batch)
    labels = batch["entity_labels"]
    weights = (labels >= 0).astype(jnp.float32)
    nll, correct = token_nll_and_correct(self.dea_logits(params, out.last_hidden_state, batch),
                                         jnp.maximum(labels, 0))
    sums.update(dea_loss=jnp.sum(nll * weights), dea_correct=jnp.sum(correct * weights))
    return sums

  def loss(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> jax.Array:
    return super().loss(sums, counts) + sums["dea_loss"] / jnp.maximum(counts["dea"], 1.0)

  def metrics(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> dict[str, jax.Array]:
    n = jnp.maximum(counts["dea"], 1.0)
    return {**super().metrics(sums, counts), "dea_loss": sums["dea_loss"] / n, "dea_accuracy": sums["dea_correct"] / n}

  def feed(self, inputs, first_step: int, split: str, config: ml_collections.ConfigDict,
           process_index: int = 0, process_count: int = 1) -> EntityFeed:
    """`inputs` with the entity features (EntityFeed); the mention list is tokenized by the input's tokenizer."""
    if self.mentions is None and config.ernie_thu.mentions:
      _, path = entities.resolve("", config.ernie_thu.mentions, self.config.entity_dim)
      self.mentions = entities.Mentions.from_file(path, inputs.tokenizer, self.table.shape[0])
    seed = config.train.seed * 1000 + process_index  # each host noises its own rows
    return EntityFeed(inputs, self, first_step, split, seed)


@register("ernie_thu")
def from_config(config: ml_collections.ConfigDict, model_config: ModelConfig) -> ErnieThuPretraining:
  """ERNIE-THU from a run config (configs/ernie_thu.py), after checking its entity block."""
  if "ernie_thu" not in config:
    raise UserError("objective='ernie_thu' needs an `ernie_thu` block (entity_embeddings, mentions, ...): start "
                    "from configs/ernie_thu.py")
  block = config.ernie_thu
  if not block.entity_embeddings:
    raise UserError("objective='ernie_thu' needs ernie_thu.entity_embeddings: a .npy of entity vectors "
                    "[entities, model.entity_dim] (e.g. TransE's)")
  if block.dea_replace + block.dea_mask > 1:
    raise UserError(f"ernie_thu.dea_replace={block.dea_replace} and dea_mask={block.dea_mask} must have a "
                    "sum <= 1 (the paper: 0.05 and 0.15)")
  path, _ = entities.resolve(block.entity_embeddings, "", model_config.entity_dim)
  table = entities.load_table(path, model_config.entity_dim)
  return ErnieThuPretraining(model_config, table, None, block.max_entities, block.dea_replace, block.dea_mask)

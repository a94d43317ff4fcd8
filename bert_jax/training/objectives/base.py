"""What an objective is (a model plus how its loss and metrics are computed from a batch), and the loss
helpers the objectives share.

A loss is a combination of additive statistics: `sums(params, batch)` are sums over rows (summing them
over micro-batches gives the full batch's), `counts(batch)` are the denominators, which depend on the
data only. `loss(sums, counts)` is linear in the sums, so accumulating gradients over micro-batches
with the full batch's counts gives exactly the full batch's gradient.
"""
from __future__ import annotations

import abc
from typing import Any, Mapping, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bert_jax.errors import UserError
from bert_jax.models.config import ModelConfig

Batch = Mapping[str, jax.Array]

HEAD_NAMES = ("mlm_head", "sentence_classifier", "rtd_head")
CARRY = "carry"  # a CarryingObjective's state: the batch feature its sums read and the sums entry it writes


class Objective(Protocol):
  """What the shared train and eval steps (training/step.py) need of a job's objective."""

  def init(self, rng: jax.Array, batch: Batch) -> Any:
    """The boxed parameter tree (logical axis names on every leaf)."""

  def counts(self, batch: Batch) -> dict[str, jax.Array]:
    """The denominators: from the data only."""

  def sums(self, params: Any, batch: Batch, rng: jax.Array | None, deterministic: bool
           ) -> dict[str, jax.Array]:
    """Statistics additive over rows; rng None in evaluation."""

  def loss(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> jax.Array:
    """Linear in the sums."""

  def metrics(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """The logged metrics besides the loss."""


class PretrainingObjective(Objective, Protocol):
  """A pretraining objective (`make_objective`): also its encoder's config and how to count its size."""
  config: ModelConfig

  def backbone(self, params: Any) -> Any:
    """The parameters the papers count as the model's size."""


@runtime_checkable
class TeacherObjective(PretrainingObjective, Protocol):
  """A pretraining objective with a frozen teacher (general distillation): the jitted step gets the
  teacher's params as an extra, sharded input (training/step.py:build_train_setup)."""

  def teacher_init(self, seq_len: int, max_predictions: int) -> Any:
    """The teacher's boxed abstract params (nothing allocated)."""

  def load_teacher(self, abstract: Any) -> Any:
    """The teacher's params, restored into the shapes and shardings of `abstract`."""

  def with_teacher(self, teacher_params: Any) -> PretrainingObjective:
    """This objective, its train sums reading `teacher_params`."""


@runtime_checkable
class StagedObjective(TeacherObjective, Protocol):
  """A teacher objective whose loss and trained parameters go by stages of the step (MobileBERT's progressive
  knowledge transfer, objectives/mobilebert_pkt.py): its train step is training/step.py:staged_step."""

  def stage_of(self, step: jax.Array) -> jax.Array:
    """The stage (int32) of the train step numbered `step` (the state's step before the update)."""

  def at_stage(self, stage: jax.Array) -> PretrainingObjective:
    """This objective (teacher bound), its loss that of `stage`, its gradient only to what `stage` trains."""

  def trains(self, stage: jax.Array, params: Any) -> Any:
    """A tree like `params` of bool arrays, each broadcastable to its leaf: what `stage` trains."""


@runtime_checkable
class ScheduledObjective(PretrainingObjective, Protocol):
  """A pretraining objective whose batches carry what a schedule decides per step (ERNIE 2.0's task of each
  batch, objectives/ernie2.py): the pretraining job puts `feed` in front of its input."""

  def feed(self, inputs: Any, first_step: int, split: str, config: ml_collections.ConfigDict,
           process_index: int = 0, process_count: int = 1) -> Any:
    """`inputs` ("train": its first batch is step first_step + 1's; or "eval") with the schedule's features."""


@runtime_checkable
class CarryingObjective(PretrainingObjective, Protocol):
  """A pretraining objective with a state carried from each train step to the next, row by row (XLNet's
  memory of the previous segment, objectives/xlnet.py). The train state holds it, so checkpoints save it and
  a resumed run continues exactly; the train step hands it to `sums` as batch[CARRY] and keeps sums[CARRY]
  (not a sum: the next carry, row i of the batch continuing row i). Evaluation passes none."""

  def carry_init(self, batch_size: int) -> Any:
    """The boxed initial carry of a global batch of `batch_size` rows (rows first on every leaf)."""


class BatchFeed(abc.ABC):
  """A pretraining input whose batches an objective adds features to on the host (ERNIE 2.0's task ids,
  ERNIE-THU's entities): `added(batch)` gives each batch's additions, with `self.step` the batch's train step
  (the first batch's is first_step + 1). Everything else (save, restore, close, tokenizer) is the input's."""

  def __init__(self, inputs, first_step: int, split: str):
    self._inputs, self.step, self.split = inputs, first_step, split

  def __getattr__(self, name):
    return getattr(self._inputs, name)

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    batch = dict(next(self._inputs))
    self.step += 1
    return self.added(batch)

  @abc.abstractmethod
  def added(self, batch: dict) -> dict:
    """`batch` (a copy of the input's) with the objective's host-side features."""


def example_batch(batch_size: int, seq_len: int, max_predictions: int) -> dict[str, np.ndarray]:
  """An all-zeros batch of the data contract's shapes (for init and abstract evaluation)."""
  tokens = np.zeros((batch_size, seq_len), np.int32)
  preds = np.zeros((batch_size, max_predictions), np.int32)
  return {"input_ids": tokens, "input_mask": tokens + 1, "segment_ids": tokens,
          "masked_lm_positions": preds, "masked_lm_ids": preds,
          "masked_lm_weights": preds.astype(np.float32),
          "next_sentence_labels": np.zeros((batch_size,), np.int32)}


def refuse_structbert_inputs(config: ml_collections.ConfigDict) -> None:
  """Shuffled trigrams and 3-way sentence labels are StructBERT's, the 'ernie' builder's rows ERNIE 2.0's:
  another objective would train on them without their losses (shuffled tokens never predicted, a label its
  2-way head cannot hold, reordered pieces read as text)."""
  # Saved configs may lack either key (older runs; converted checkpoints keep only the tokenizer's).
  data = config.get("data") or {}
  shuffle, builder = data.get("trigram_shuffle_rate", 0.0), data.get("example_builder", "")
  if builder == "ernie" and config.objective != "ernie2":
    raise UserError(f"data.example_builder='ernie' makes ERNIE 2.0's rows, which objective={config.objective!r} "
                    "has no loss for; use objective='ernie2' (configs/ernie.py) or another builder")
  if shuffle or builder == "sso":
    raise UserError(f"data.trigram_shuffle_rate={shuffle} and data.example_builder={builder!r}: shuffled "
                    f"trigrams and the 'sso' builder are StructBERT's inputs, which objective={config.objective!r} "
                    "has no loss for; use objective='structbert' (configs/structbert.py), or "
                    "trigram_shuffle_rate=0 and another builder")


def token_nll_and_correct(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
  """logits: f32[..., V], labels: int[...] -> (negative log-likelihood, label logit == max logit).

  The label logit is a gather along V, no argmax: with V sharded over the mesh, GSPMD gathers locally
  under a mask and all-reduces one value per row (the 2x2x2 mesh tests run it). A one-hot product was one
  more pass over [..., V] on XLA:CPU, forward and backward (BENCHMARKS.md, "2026-11-28 evening").
  The loss is (max - label logit) + log(sum(exp(logits - max))): no cancellation between two large
  log-sum-exp and label terms, and exactly the log-sum-exp term when the label is the max.
  """
  logits = logits.astype(jnp.float32)
  # mode="clip": a label outside [0, V) (a padding slot, weight 0) reads an end logit, finite (fill: NaN).
  label_logit = jnp.take_along_axis(logits, labels[..., None].astype(jnp.int32), axis=-1, mode="clip")[..., 0]
  top = jax.lax.stop_gradient(jnp.max(logits, axis=-1))
  nll = (top - label_logit) + jnp.log(jnp.sum(jnp.exp(logits - top[..., None]), axis=-1))
  correct = (label_logit >= top).astype(jnp.float32)
  return nll, correct


def mlm_sums(logits: jax.Array, batch: Batch) -> dict[str, jax.Array]:
  """The masked-LM loss and correct predictions summed over the weighted (real) predictions."""
  weights = batch["masked_lm_weights"].astype(jnp.float32)
  nll, correct = token_nll_and_correct(logits, batch["masked_lm_ids"])
  return {"mlm_loss": jnp.sum(nll * weights), "mlm_correct": jnp.sum(correct * weights)}


def model_inputs(batch: Batch) -> dict[str, Any]:
  """Maps the data contract's feature names to the model's arguments."""
  return dict(input_ids=batch["input_ids"], attention_mask=batch["input_mask"],
              token_type_ids=batch["segment_ids"], position_ids=batch.get("position_ids"),
              document_ids=batch.get("document_ids"), masked_positions=batch["masked_lm_positions"])

"""The bi-encoder training job (`sbert`; `bert-jax finetune --config configs/sbert.py:PRESET`): an encoder
and its pooling (sbert/model.py) fine-tuned on sentence pairs with one of sbert/losses.py's losses.

  softmax  NLI: premise<TAB>hypothesis<TAB>label lines; a linear classifier on (u, v, |u - v|)
           (params["head"], trained and then dropped: the saved model is the encoder)
  cosine   STS: sentence1<TAB>sentence2<TAB>score lines, scores divided by cosine.score_scale;
           (cos(u, v) - score)^2
  ranking  anchor<TAB>positive[<TAB>hard negative] lines; each anchor against every positive and hard
           negative of the *global* batch, scale * cosine, cross-entropy. The loss is one computation
           on the whole batch under jit: with the rows split over the mesh's data axes, XLA all-gathers
           the candidates' embeddings (tests/test_sbert_train.py reads it in the HLO), so more devices
           give each row more negatives. ranking.directions and ranking.partition_mode choose
           sentence-transformers' variants (the symmetric loss, GTE's). train.grad_accum_steps=K runs the
           step through GradCache (sbert/gradcache.py): the global batch in K chunks per device, the
           same loss and gradient as one pass, in a chunk's memory.
A pair's sentences run through the encoder as one batch of rows ([B, K, T] -> [B * K, T]).

It runs as every job does: the workdir lock, the shared sharded step (training/step.py), the one loop
(training/loop.py: logging, the finite check, SIGTERM and Ctrl-C), the train state in WORKDIR/state to
resume from (the batches are a function of the step: finetune/batching.py), and a dev STS evaluation
(Spearman of cosine, sbert/evaluate.py) every train.eval_every_* and at the end. The encoder starts from
init_from (any checkpoint; a HF or TF one is converted into the workdir first) or fresh.

The workdir it leaves is a sentence embedding model: params/ (the encoder), config.json recording the
pooling ("sentence_embedding"), the tokenizer; so `bert-jax embed --model WORKDIR`, `embed-eval`, `search`,
`init_from` and `convert --to hf` (a sentence-transformers folder) take it. eval_results.json holds the
final dev scores and, as initial/*, those of the encoder it started from (the untrained pooling).
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import Mesh

from bert_jax import config_schema, workdir as workdir_lib
from bert_jax.conversion import native
from bert_jax.data_pipelines import tokenizer_kinds
from bert_jax.errors import UserError
from bert_jax.finetune import init, modes, optim
from bert_jax.finetune.batching import train_batches
from bert_jax.models import attention
from bert_jax.models.pooling import Pooling
from bert_jax.sbert import data, embed, embedded, evaluate, gradcache, losses
from bert_jax.sbert.model import ENCODER_KEYS, SentenceEncoder, encoder_config
from bert_jax.training import checkpoint, driver, partitioning
from bert_jax.training.step import TrainSetup, sharded_setup

LOSSES = ("softmax", "cosine", "ranking")
RANDOM_ENCODER = ("model: a random encoder (no init_from); it trains from random weights, not a pretrained model "
                  "(--config.init_from=CKPT fine-tunes one)")


class BiEncoderObjective:
  """The bi-encoder's loss as a sum over rows (training/step.py's objective): batch input_ids and
  attention_mask int32[B, K, T] (K sentences per row: 2, or 3 with a hard negative), label [B]."""

  def __init__(self, model: SentenceEncoder, loss: str, num_labels: int = 0, scale: float = 20.0,
               directions: tuple[str, ...] = ("query_to_doc",), partition_mode: str = "joint",
               matryoshka: tuple[tuple[int, float], ...] = ()):
    self.model, self.kind, self.num_labels, self.scale = model, loss, num_labels, scale
    self.directions, self.partition_mode, self.matryoshka = tuple(directions), partition_mode, tuple(matryoshka)

  def init(self, rng: jax.Array, batch: dict[str, jax.Array]) -> Any:
    params = dict(self.model.init(rng, batch["input_ids"][:, 0], batch["attention_mask"][:, 0])["params"])
    if self.kind == "softmax":
      features = 3 * self.model.pooling.dimension(self.model.config.hidden_size)
      kernel = nn.with_logical_partitioning(nn.initializers.lecun_normal(), (None, "classes"))
      bias = nn.with_logical_partitioning(nn.initializers.zeros_init(), ("classes",))
      params["head"] = {"kernel": kernel(jax.random.fold_in(rng, 1), (features, self.num_labels)),
                        "bias": bias(rng, (self.num_labels,))}
    return params

  def embed(self, params: Any, batch: dict[str, jax.Array], rng: jax.Array | None = None,
            deterministic: bool = True) -> jax.Array:
    """float32[B, K, D]: every sentence of every row."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    rows, k, length = ids.shape
    out = self.model.apply({"params": {key: params[key] for key in ENCODER_KEYS}}, ids.reshape(rows * k, length),
                           mask.reshape(rows * k, length), deterministic=deterministic,
                           rngs=None if deterministic else {"dropout": rng})
    return out.reshape(rows, k, -1)

  def per_row(self, params: Any, batch: dict[str, jax.Array], rng: jax.Array | None = None,
              deterministic: bool = True) -> jax.Array:
    """float32[B]: each row's loss (the ranking loss's rows see the whole batch)."""
    e = self.embed(params, batch, rng, deterministic)
    u, v = e[:, 0], e[:, 1]
    if self.kind == "softmax":
      return losses.softmax(u, v, params["head"]["kernel"], params["head"]["bias"], batch["label"])
    if self.kind == "cosine":
      return losses.cosine_regression(u, v, batch["label"])
    return self.rows_loss(e, e, 0)

  def rows_loss(self, rows: jax.Array, whole: jax.Array, first: jax.Array | int) -> jax.Array:
    """The ranking loss of rows [R, K, D], rows first .. first + R of the batch's embeddings whole [B, K, D];
    with matryoshka (dimension, weight) pairs, sentence-transformers' MatryoshkaLoss: the weighted sum of the
    loss of each prefix of the embeddings (normalised again after the cut)."""
    loss = functools.partial(losses.ranking_rows, first=first, scale=self.scale, directions=self.directions,
                             partition_mode=self.partition_mode)
    if not self.matryoshka:
      return loss(rows, whole)
    return sum(weight * loss(rows[..., :dim], whole[..., :dim]) for dim, weight in self.matryoshka)

  def sums(self, params: Any, batch: dict[str, jax.Array], rng: jax.Array | None, deterministic: bool
           ) -> dict[str, jax.Array]:
    return {"loss": jnp.sum(self.per_row(params, batch, rng, deterministic))}

  def counts(self, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    return {"rows": jnp.asarray(batch["input_ids"].shape[0], jnp.float32)}

  def loss(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> jax.Array:
    return sums["loss"] / counts["rows"]

  def metrics(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> dict[str, jax.Array]:
    del sums, counts
    return {}


def validate(config: ml_collections.ConfigDict) -> None:
  """The shared blocks (bert_jax/config_schema.py), then the bi-encoder's own fields."""
  config_schema.of(config, config_schema.DATASET).check(config)
  attention.check(config.model, config.data.max_seq_length)
  if config.loss not in LOSSES:
    raise UserError(f"loss={config.loss!r} is not one of {LOSSES}")
  pooling(config)
  if config.loss == "ranking":
    check_ranking(config.ranking, config.data.max_seq_length)


def check_ranking(ranking: ml_collections.ConfigDict, length: int) -> None:
  """The ranking block as sentence-transformers' MultipleNegativesRankingLoss checks its arguments (the
  plain ranges: the schema's); a token budget that holds one longest sentence."""
  directions = tuple(ranking.directions)
  if "query_to_doc" not in directions or not set(directions) <= set(losses.DIRECTIONS):
    raise UserError(f"ranking.directions={list(directions)}: query_to_doc and any of {list(losses.DIRECTIONS)}")
  if ranking.partition_mode not in losses.PARTITION_MODES:
    raise UserError(f"ranking.partition_mode={ranking.partition_mode!r} is not one of {losses.PARTITION_MODES}")
  if 0 < ranking.chunk_tokens < length:
    raise UserError(f"ranking.chunk_tokens={ranking.chunk_tokens} is below one sentence of data.max_seq_length="
                    f"{length} tokens")
  if ranking.partition_mode == "per_direction" and {"query_to_query", "doc_to_doc"} & set(directions):
    raise UserError("ranking.partition_mode='per_direction' takes the directions query_to_doc and doc_to_query "
                    "only (as sentence-transformers)")


def objective_for(config: ml_collections.ConfigDict, model: SentenceEncoder) -> BiEncoderObjective:
  r = config.ranking
  return BiEncoderObjective(model, config.loss, len(config.softmax.labels), r.scale, tuple(r.directions),
                            r.partition_mode, matryoshka(r, model.pooling.dimension(model.config.hidden_size)))


def matryoshka(ranking: ml_collections.ConfigDict, dimension: int) -> tuple[tuple[int, float], ...]:
  """ranking.matryoshka_dims with their weights (1 each unless ranking.matryoshka_weights), checked against
  the embedding's dimension."""
  dims, weights = tuple(ranking.matryoshka_dims), tuple(ranking.matryoshka_weights) or (1.0,) * len(
      ranking.matryoshka_dims)
  if len(weights) != len(dims):
    raise UserError(f"ranking.matryoshka_weights={list(weights)}: one weight per dimension of "
                    f"ranking.matryoshka_dims={list(dims)}")
  bad = [d for d in dims if not 1 <= d <= dimension]
  if bad:
    raise UserError(f"ranking.matryoshka_dims={list(dims)}: {bad[0]} is not between 1 and the embedding's "
                    f"{dimension} dimensions")
  return tuple(zip(dims, map(float, weights)))


def pooling(config: ml_collections.ConfigDict) -> Pooling:
  return Pooling(tuple(config.pooling.modes), config.pooling.normalize, config.data.max_seq_length)


def read_pairs(config: ml_collections.ConfigDict) -> tuple[data.Pairs, data.Pairs]:
  """(training pairs with the loss's targets, dev scored pairs): the files, or the embedded STS set."""
  d = config.data
  built = embedded.splits(d.embedded_train, d.embedded_dev) if not (d.train_file and d.dev_file) else None
  dev = data.read_scored_pairs(d.dev_file) if d.dev_file else built[1]
  evaluate.check_sts_pairs(dev, f"data.dev_file={d.dev_file}" if d.dev_file
                           else f"data.embedded_dev={d.embedded_dev} (the embedded STS set's dev pairs)")
  if config.loss == "softmax":
    if not d.train_file and tuple(config.softmax.labels) != embedded.NLI_LABELS:
      raise UserError(f"the embedded set's pairs are labelled {embedded.NLI_LABELS}; give data.train_file for "
                      f"softmax.labels={tuple(config.softmax.labels)}")
    train = (data.read_labelled_pairs(d.train_file, tuple(config.softmax.labels)) if d.train_file
             else embedded.as_nli(built[0]))
  elif config.loss == "cosine":
    train = data.read_scored_pairs(d.train_file) if d.train_file else built[0]
    train = data.Pairs(train.columns, train.target / config.cosine.score_scale)
  else:
    train = data.read_text_pairs(d.train_file) if d.train_file else embedded.as_ranking(built[0])
  return train, dev


def featurize(pairs: data.Pairs, tokenizer, length: int) -> dict[str, np.ndarray]:
  """input_ids, attention_mask int32[N, K, length] ([CLS] tokens [SEP], padded), label [N] if any."""
  ids = np.full((len(pairs), len(pairs.columns), length), tokenizer.special_ids["[PAD]"], np.int32)
  mask = np.zeros(ids.shape, np.int32)
  for k, column in enumerate(pairs.columns):
    for i, sentence in enumerate(column):
      row = embed.token_ids(tokenizer, sentence, length)
      ids[i, k, :len(row)], mask[i, k, :len(row)] = row, 1
  features = {"input_ids": ids, "attention_mask": mask}
  if pairs.target.size:
    features["label"] = pairs.target
  return features


def build_setup(config: ml_collections.ConfigDict, objective: BiEncoderObjective, columns: int, num_train: int,
                mesh: Mesh | None = None) -> tuple[TrainSetup, int]:
  """The shared sharded setup for the objective (on config.mesh's devices, or `mesh`); also the steps per
  epoch."""
  steps_per_epoch = max(num_train // config.train.batch_size, 1)
  num_steps = config_schema.run_steps(config.train, steps_per_epoch)
  dummy = jnp.zeros((1, columns, config.data.max_seq_length), jnp.int32)
  init_params = functools.partial(objective.init, batch={"input_ids": dummy, "attention_mask": dummy + 1})
  make_tx = lambda abstract: optim.make_optimizer(config.optimizer, num_steps, nn.meta.unbox(abstract),  # noqa: E731
                                                  objective.model.config)
  # The ranking loss is not a sum over micro-batches: chunks (or a bfloat16 reduction) go through GradCache.
  cached = objective.kind == "ranking" and (config.train.grad_accum_steps > 1 or config.ranking.chunk_tokens or
                                           config.train.grad_reduce_dtype != "float32")
  step_fn = functools.partial(gradcache.train_step, chunk_tokens=config.ranking.chunk_tokens,
                              buckets=embed.buckets_for(config.data.max_seq_length))
  setup = sharded_setup(config, objective, init_params, make_tx, num_steps, mesh=mesh,
                        **({"step_fn": step_fn} if cached else {}))
  if objective.kind == "ranking":
    check_chunk_tokens(config, columns, partitioning.data_parallel_size(setup.mesh))
  return setup, steps_per_epoch


def check_chunk_tokens(config: ml_collections.ConfigDict, columns: int, data_parallel: int) -> None:
  """A token budget below a device's whole batch (a chunk larger than the batch is a mistaken setting)."""
  budget, length = config.ranking.chunk_tokens, config.data.max_seq_length
  tokens = config.train.batch_size // data_parallel * columns * length
  if budget >= tokens:
    raise UserError(f"ranking.chunk_tokens={budget} is not below a device's whole batch ({tokens:,} tokens: "
                    f"{config.train.batch_size // data_parallel} rows x {columns} sentences x {length}); 0 turns "
                    "the token budget off")


class Training:
  """The bi-encoder job's learner (training/driver.py): its pairs' batches, its step, the dev STS scores
  (Spearman is the score; the starting encoder's are evaluated first, as step 0) and the encoder as params/."""

  evaluates_start = True
  score_name = "spearman"

  def __init__(self, config: ml_collections.ConfigDict, run_dir):
    self.config, self.run_dir = config, run_dir
    saved = workdir_lib.read_config(config.init_from) if config.init_from else None
    model_config = encoder_config(init.model_config(config, saved))
    self.tokenizer = init.load_tokenizer(config)
    train, self.dev = read_pairs(config)
    if len(train) < config.train.batch_size:
      raise UserError(f"{len(train)} training pairs are fewer than train.batch_size={config.train.batch_size}")
    self.train_features = featurize(train, self.tokenizer, config.data.max_seq_length)
    self.model = SentenceEncoder(model_config, pooling(config))
    self.objective = objective_for(config, self.model)
    self.setup, self.steps_per_epoch = build_setup(config, self.objective, len(train.columns), len(train))
    # The whole encoder trains (and the softmax loss's classifier, which is not saved).
    self.trainable_parameters = modes.trainable_parameters(self.setup.abstract_state.params, "finetune")
    self.embedder = self._embedder()
    self.tokens_per_step = (config.train.batch_size * len(self.train_features["input_ids"][0])
                            * config.data.max_seq_length)
    self._rng = jax.random.key(config.train.seed)

  def _embedder(self) -> embed.Embedder:
    """An Embedder on the run's mesh, for the current parameters (dataclasses.replace its params)."""
    setup, rules = self.setup, partitioning.rules(self.config.mesh)
    shardings = {k: setup.state_shardings.params[k] for k in ENCODER_KEYS}
    batch = partitioning.batch_sharding(setup.mesh)
    forward = lambda p, ids, mask: self.model.apply({"params": p}, ids, mask)  # noqa: E731
    return embed.Embedder(pooling=self.model.pooling, dimension=self.model.pooling.dimension(
                              self.model.config.hidden_size), tokenizer=self.tokenizer, params=None,
                          forward=jax.jit(partitioning.in_mesh(forward, setup.mesh, rules),
                                          in_shardings=(shardings, batch, batch), out_shardings=batch),
                          mesh=setup.mesh, batch_size=self.config.train.eval_batch_size,
                          buckets=embed.buckets_for(self.config.data.max_seq_length))

  def evaluate(self, params: Any) -> driver.Scored:
    """Dev STS: Spearman and Pearson of cosine against the gold scores."""
    embedder = dataclasses.replace(self.embedder, params={k: params[k] for k in ENCODER_KEYS})
    scores = {k: float(v) for k, v in evaluate.sts(embedder, self.dev).items()}
    return driver.Scored(scores["spearman"], scores, scores)

  def initial_params(self) -> Any:
    """init_from's encoder over a fresh init, or a fresh init."""
    params = self.setup.init_params(jax.random.key(self.config.train.seed))
    if self.config.init_from:
      params = checkpoint.load_params_into(self.config.init_from, params, keep=ENCODER_KEYS)
      print(f"initialised the encoder from {self.config.init_from}", flush=True)
    else:
      print(RANDOM_ENCODER, flush=True)
    return params

  def batches(self, start: int, end: int):
    return train_batches(self.train_features, self.config.train.batch_size, self.config.train.seed, start, end)

  def step(self, state: Any, batch: dict) -> tuple[Any, dict]:
    return self.setup.train_step(state, batch, self._rng)

  def saved_config(self) -> dict:
    """config.json: the run config, the encoder's model, the tokenizer's copy and the pooling."""
    saved = self.config.to_dict()
    saved["model"] = self.model.config.to_dict()
    saved["data"].update(vocab=workdir_lib.path(self.tokenizer.path).name,
                         **tokenizer_kinds.saved_fields(self.tokenizer))
    saved[native.SENTENCE_EMBEDDING] = self.model.pooling.to_dict()
    saved["trainable_parameters"] = self.trainable_parameters
    return saved

  def exported(self, params: Any) -> Any:
    """The encoder (the softmax loss's classifier is dropped)."""
    return {k: params[k] for k in ENCODER_KEYS}

  def save_params(self, params: Any) -> None:
    checkpoint.save_params(self.run_dir, self.exported(params), self.saved_config(), self.tokenizer.files)

  def write_outputs(self, params: Any, scored: driver.Scored) -> None:
    del params, scored


def train(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains a bi-encoder in `workdir` through the driver (training/driver.py:run_job). Its "dev" holds the
  final dev STS scores and the starting encoder's as initial/*."""
  return driver.run_job(config, workdir, validate=validate, learner=Training)


def summary(config: ml_collections.ConfigDict, workdir: str, result: dict) -> str:
  """The line a bi-encoder run ends with."""
  del config
  if result["stopped_by"]:
    return driver.stopped_line(workdir, result)
  dev = result["dev"]
  scores = f"dev STS spearman {dev['spearman']:.4f} (the starting encoder's: {dev['initial/spearman']:.4f})" if (
      "initial/spearman" in dev) else f"dev STS spearman {dev['spearman']:.4f}"
  before = driver.finished_before(workdir, result)
  return (f"{before}done: {scores} | a sentence embedding model in {workdir} | next: bert-jax embed --model "
          f"{os.fspath(workdir)} --input FILE --output OUT.npy")

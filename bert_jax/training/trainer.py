"""The pretraining job (every objective, ELECTRA and general distillation's distill_mlm included): the
input, the sharded train step and the held-out evaluation, run by the one loop (training/loop.py).

The same command resumes: a workdir with a checkpoint continues from it, with the input position
saved alongside, so an interrupted and resumed run sees exactly the batches of an uninterrupted one.
SIGTERM and Ctrl-C save a checkpoint at the step the run is on and stop (training/loop.py).
"""
from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from typing import Any

import jax
import ml_collections

from bert_jax import config_schema, config_utils, pretrained, workdir as workdir_lib
from bert_jax.data_pipelines.errors import DataError
from bert_jax.errors import UserError
from bert_jax.models import attention, families
from bert_jax.training import checkpoint, driver, finite, loop, memory, objectives, partitioning
from bert_jax.training.step import TrainSetup, TrainState, build_train_setup, eval_carry, summarize_eval


def make_inputs(config: ml_collections.ConfigDict, split: str, batch_size: int):
  from bert_jax.data_pipelines import pipeline  # TensorFlow is imported only when there is input to read
  if split == "eval" and config.data.num_workers:
    # Evaluation rewinds its input before every run; worker processes would restart each time.
    config = ml_collections.ConfigDict(config.to_dict())
    config.data.num_workers = 0
  return pipeline.for_config(config, split, batch_size, jax.process_index(), jax.process_count())


def restore_or_init(setup: TrainSetup, ckpt: checkpoint.Checkpointer, inputs: Any
                    ) -> tuple[TrainState, int]:
  """Own latest intact checkpoint > config.init_from > fresh init. Returns (state, first step)."""
  config = setup.config
  restored = ckpt.restore_latest(setup.abstract_state, data=inputs)
  if restored is not None:
    print(f"resumed from {ckpt.directory / str(restored[1])}", flush=True)
    return restored[0]["state"], restored[1]
  state = setup.init_state(jax.random.key(config.train.seed))
  if config.init_from:
    params = checkpoint.load_params_into(config.init_from, state.params)
    state = state.replace(params=params)
    print(f"initialised from {config.init_from}", flush=True)
  return state, 0


def _check_resumable(setup: TrainSetup, ckpt: checkpoint.Checkpointer, run_dir) -> None:
  """A checkpoint this config cannot continue (another optimizer) is refused before anything is written."""
  step = ckpt.latest_step()
  if step is None:
    return
  saved = run_dir / workdir_lib.CONFIG
  ckpt.check_resumable(step, setup.abstract_state, workdir_lib.read_json(saved) if saved.exists() else None,
                       setup.config)


def _check_eval_split(inputs: Any, data_cfg: ml_collections.ConfigDict, general: bool = False) -> None:
  """Pulls one held-out batch at start-up, so an empty split fails now, not after the first train steps."""
  try:
    next(inputs)
  except (DataError, StopIteration) as e:
    if general:
      raise UserError(f"data.general_eval_corpus={data_cfg.general_eval_corpus!r} gives no examples "
                      f"({e or 'no batch'}); give text files with enough documents for train.eval_steps batches, "
                      "or leave it empty") from None
    source = (f"data.eval_corpus={data_cfg.eval_corpus!r}" if data_cfg.eval_corpus
              else f"data.eval_fraction={data_cfg.eval_fraction} of the documents")
    raise UserError(f"the evaluation split ({source}) gives no examples ({e or 'no batch'}); raise "
                    "data.eval_fraction or set data.eval_corpus, or set train.eval_every_steps=0 to train "
                    "without evaluation") from None


def _general_inputs(config: ml_collections.ConfigDict) -> Any:
  """The second held-out set (data.general_eval_corpus), read as data.eval_corpus is, or None."""
  if not config.data.general_eval_corpus:
    return None
  general = ml_collections.ConfigDict(config.to_dict())
  general.data.eval_corpus = config.data.general_eval_corpus
  return make_inputs(general, "eval", config.train.eval_batch_size)


def _write_run_files(config: ml_collections.ConfigDict, run_dir, tokenizer_path: str | None) -> None:
  """config.json (with data.vocab pointing at the copy) and the vocabulary, so the run is self-contained."""
  if jax.process_index() != 0:
    return
  saved = config.to_dict()
  if tokenizer_path:
    name = workdir_lib.path(tokenizer_path).name
    workdir_lib.copy_file(tokenizer_path, run_dir / name)
    saved["data"]["vocab"] = name
  workdir_lib.write_json(run_dir / workdir_lib.CONFIG, saved)


def evaluate(setup: TrainSetup, params: Any, inputs: Any, start_dir: str) -> dict[str, float]:
  """Metrics over config.train.eval_steps held-out batches, the same batches at every evaluation; a
  CarryingObjective's state carried from batch to batch as in training, from zeros (XLNet's memory: row i of
  each eval batch continues row i of the last, data_pipelines/xlnet_stream.py)."""
  inputs.restore(start_dir)
  totals, carry = None, None
  for i in range(setup.config.train.eval_steps):
    batch = partitioning.global_batch(next(inputs), setup.mesh)
    if i == 0:
      carry = eval_carry(setup, jax.tree.leaves(batch)[0].shape[0])
    out = dict(setup.eval_step(params, batch if carry is None else {**batch, objectives.CARRY: carry}))
    carry = out.pop(objectives.CARRY, None)
    totals = out if totals is None else jax.tree.map(lambda a, b: a + b, totals, out)
  return summarize_eval(setup.objective, totals)


@dataclasses.dataclass
class _Pretraining:
  """Pretraining as the driver steps it (training/driver.py:segment): the corpus input, restored to its
  position, and the sharded step with its frozen inputs (a distillation teacher's params) bound."""
  setup: TrainSetup
  inputs: Any
  rng: jax.Array
  frozen: tuple
  tokens_per_step: int

  def batches(self, start: int, end: int) -> Any:
    del start, end  # the input was restored to the checkpoint's position
    return self.inputs

  def step(self, state: TrainState, batch: dict) -> tuple[TrainState, dict]:
    return self.setup.train_step(state, batch, self.rng, *self.frozen)


def pretrain(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs (or resumes) pretraining in `workdir` (a local path or gs://...), which it holds locked;
  returns {"step", "num_steps", "train", "eval", "stopped_by", "skipped_steps", "finished_before"}: the
  last train and eval metrics, and the signal that stopped it ("SIGTERM", "Ctrl-C"; None when it ran to
  the end). A workdir whose run finished at train.num_steps is not trained again (finished_before:
  its record), unless train.restart."""
  check_run_config(config)
  pretrained.check_init_from(config)
  continued = config.get("init_from_model", False)  # configs/continue.py: the model is init_from's
  setup = None
  if not continued:
    # Before the workdir exists: a step that cannot fit is one line now, not an out-of-memory traceback later.
    setup = build_train_setup(config)
    memory.check_fits(setup)
  with loop.hold(workdir, restart=config.train.restart) as (run_dir, signals):
    config = pretrained.native_init_from(config, run_dir)
    if continued:
      config = pretrained.with_init_from_model(config)
      setup = build_train_setup(config)
      memory.check_fits(setup)
    return pretrain_in(config, run_dir, signals, setup)


def pretrain_in(config: ml_collections.ConfigDict, run_dir, signals: loop.StopRequests,
                setup: TrainSetup | None = None) -> dict[str, Any]:
  """`pretrain` in a workdir the caller holds (loop.hold): general distillation resolves its student there
  first. `setup`: one already built for this very config (the memory check's), else built here."""
  before = loop.read_finished(run_dir)
  if before is not None and before["step"] >= config.train.num_steps:
    return {**before, "stopped_by": None, "finished_before": True}
  if setup is None or setup.config is not config:  # init_from converted into the workdir: a new config
    setup = build_train_setup(config)
  return _pretrain(setup, run_dir, signals)


def _pretrain(setup: TrainSetup, run_dir, signals: loop.StopRequests) -> dict[str, Any]:
  config = setup.config
  checkpoint.check_same_model(run_dir, config)
  train_cfg = config.train
  ckpt = checkpoint.Checkpointer.for_pretraining(run_dir, config.checkpoint)
  _check_resumable(setup, ckpt, run_dir)
  inputs = make_inputs(config, "train", train_cfg.batch_size)
  _write_run_files(config, run_dir, inputs.tokenizer.path)
  state, start = restore_or_init(setup, ckpt, inputs)
  frozen = setup.load_frozen()  # a distillation teacher's params; else ()
  evaluating = train_cfg.eval_every_steps > 0 and train_cfg.eval_steps > 0
  eval_inputs = make_inputs(config, "eval", train_cfg.eval_batch_size) if evaluating else None
  general_inputs = _general_inputs(config) if evaluating else None
  if isinstance(setup.objective, objectives.ScheduledObjective):  # each step's batch as its schedule says
    where = (jax.process_index(), jax.process_count())
    inputs = setup.objective.feed(inputs, start, "train", config, *where)
    if eval_inputs is not None:
      eval_inputs = setup.objective.feed(eval_inputs, 0, "eval", config, *where)
    if general_inputs is not None:
      general_inputs = setup.objective.feed(general_inputs, 0, "eval", config, *where)
  learner = _Pretraining(setup, inputs, jax.random.key(train_cfg.seed + 1), frozen,
                         train_cfg.batch_size * config.data.max_seq_length)
  guard = finite.DivergenceGuard(train_cfg.skip_nonfinite_steps)
  with contextlib.ExitStack() as stack:
    eval_start = stack.enter_context(tempfile.TemporaryDirectory())
    general_start = stack.enter_context(tempfile.TemporaryDirectory())
    stack.callback(ckpt.close)
    stack.callback(inputs.close)
    if eval_inputs is not None:
      stack.callback(eval_inputs.close)
      eval_inputs.save(eval_start)
      _check_eval_split(eval_inputs, config.data)
    if general_inputs is not None:
      stack.callback(general_inputs.close)
      general_inputs.save(general_start)
      _check_eval_split(general_inputs, config.data, general=True)

    def held_out(step: int, state) -> loop.Evaluation:
      del step
      scalars = evaluate(setup, state.params, eval_inputs, eval_start)
      if general_inputs is not None:
        general = evaluate(setup, state.params, general_inputs, general_start)
        scalars.update({f"general_{k}": v for k, v in general.items()})
      return loop.Evaluation(scalars)

    # The checkpoint is the run's output (and a longer run's start): saved at the end too.
    outcome = driver.segment(
        config, run_dir, learner, signals, guard, state=state, start=start, end=train_cfg.num_steps,
        save=lambda step, state: ckpt.save(step, state, force=True, data=inputs),
        evaluate=held_out if eval_inputs is not None else None, eval_every=train_cfg.eval_every_steps,
        save_at_end=True, last_saved=start or None, eval_at_start=train_cfg.eval_at_start)
    ckpt.wait()
    ckpt.keep_newest()
  result = {"step": outcome.step, "num_steps": train_cfg.num_steps, "train": outcome.train, "eval": outcome.eval}
  if outcome.step == train_cfg.num_steps:
    loop.write_finished(run_dir, result)
  return {**result, "stopped_by": outcome.stopped_by, "skipped_steps": guard.skipped,
          "finished_before": False}


def summary(config, workdir: str, result: dict) -> str:
  """The lines a pretraining (or general distillation) run ends with: where the checkpoint is, the final
  metrics and the next command; or where it stopped and how to resume; or that it had finished."""
  step = result["step"]
  where = f"checkpoint {workdir}/checkpoints/{step}"
  if result["stopped_by"]:
    return (f"stopped at step {step}/{config.train.num_steps} by {result['stopped_by']} | {where} | next: the same "
            "command resumes")
  lines = []
  if result["finished_before"]:
    lines.append(f"{workdir}: this run finished at step {step} of {result['num_steps']}; nothing to train. To train "
                 "it again from the start: the same command with --config.train.restart=true (this run's files move "
                 f"to {workdir}/previous-N/)")
  shown = [f"{k} {v:.4g}" for k, v in result.get("train", {}).items() if k.endswith(("loss", "accuracy"))]
  shown += [f"eval {k} {v:.4g}" for k, v in result.get("eval", {}).items() if k.endswith(("loss", "accuracy"))]
  embedded = not (config.data.corpus or config.data.tfds_name or config.data.prepared)
  task = "embedded" if embedded else "TASK"
  finetune_config = families.get(config.model.get("family") or "bert").finetune_config  # "": BERT
  lines.append(f"done: step {step} | {' | '.join(shown)} | {where} | next: bert-jax finetune --config "
               f"{finetune_config}:{task} --config.init_from={workdir} --workdir {workdir}-ft")
  return "\n".join(lines)


def load_run_config(spec: str, overrides: list[str]) -> ml_collections.ConfigDict:
  config = config_utils.load_config(spec, overrides)
  check_run_config(config)
  return config


def check_run_config(config: ml_collections.ConfigDict) -> None:
  """The shared blocks of a corpus job's config (bert_jax/config_schema.py; the model's are checked where
  built; its attention backend here, before the workdir is written)."""
  config_schema.of(config, config_schema.CORPUS).check(config)
  attention.check(config.model, config.data.max_seq_length)

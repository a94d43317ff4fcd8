"""XLNet pretraining with memory across steps (models/xlnet.py bi_data, training/objectives/xlnet.py,
data_pipelines/xlnet_stream.py): bi_data's relative positions against transformers' XLNetModel, the stream
layout on a hand-made corpus, the two permutation blocks of reuse_len, the memory carried by the train state
(plain; weekly, through the step's shard_map and micro-batches), and (weekly) exact resume."""
import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from core_helpers import slow
import test_xlnet

import bert_jax
from bert_jax import params_checkpoint
from bert_jax.config_utils import load_config
from bert_jax.data_pipelines import pipeline, shards, xlnet_stream
from bert_jax.data_pipelines.errors import DataError
from bert_jax.errors import UserError
from bert_jax.training import accumulate, objectives, partitioning, step, trainer
from bert_jax.training.objectives import xlnet as plm

VOCAB = 50


def test_bi_data_positions_match_transformers(tmp_path):
  """bi_data (and clamp_len) on a memory: the batch's second half reads its distances negated, as transformers'
  relative_positional_encoding."""
  hf = test_xlnet._hf_model(tmp_path, mem_len=3, n_layer=2, bi_data=True, clamp_len=5)  # pylint: disable=protected-access
  model, params = bert_jax.load_pretrained(str(tmp_path / "hf"))
  assert model.config.bi_data and model.config.clamp_len == 5
  rs = np.random.RandomState(0)
  ids = rs.randint(6, VOCAB, (4, 6))
  types = np.zeros_like(ids)
  types[:, 3:] = 1
  mems = rs.normal(size=(2, 4, 3, 32)).astype(np.float32)  # [L, B, M, H]
  with torch.no_grad():
    ref = hf(torch.tensor(ids), token_type_ids=torch.tensor(types), use_mems=True,
             mems=[torch.tensor(m).transpose(0, 1) for m in mems], output_hidden_states=True)
  out = model.apply({"params": params}, jnp.asarray(ids), None, jnp.asarray(types), mems=jnp.asarray(mems))
  np.testing.assert_allclose(np.asarray(out.last_hidden_state), ref.hidden_states[-1].numpy(), atol=1e-5)
  np.testing.assert_allclose(np.asarray(out.mlm_logits), ref.logits.numpy(), atol=1e-5)
  # the rows may say which of them read backwards (a device's or a micro-batch's share of the batch)
  order = np.array([2, 0, 3, 1])
  shuffled = model.apply({"params": params}, jnp.asarray(ids[order]), None, jnp.asarray(types[order]),
                         mems=jnp.asarray(mems[:, order]), backward_rows=jnp.asarray(order >= 2))
  np.testing.assert_allclose(shuffled.last_hidden_state, out.last_hidden_state[order], atol=1e-5)
  forward = model.clone(config=dataclasses.replace(model.config, bi_data=False))
  plain = forward.apply({"params": params}, jnp.asarray(ids), None, jnp.asarray(types), mems=jnp.asarray(mems))
  np.testing.assert_allclose(plain.last_hidden_state[:2], out.last_hidden_state[:2], atol=1e-6)
  assert np.abs(np.asarray(plain.last_hidden_state[2:] - out.last_hidden_state[2:])).max() > 1e-3  # what the test above checks


# --- The stream layout ------------------------------------------------------------------------------------------

SEQ, REUSE, MEM, B = 16, 4, 6, 8
SMALL = ["--config.model.hidden_size=32", "--config.model.num_heads=2", "--config.model.intermediate_size=48",
         "--config.model.num_layers=2", f"--config.data.max_seq_length={SEQ}", "--config.data.max_predictions_per_seq=2",
         "--config.data.eval_fraction=0",
         f"--config.xlnet.reuse_len={REUSE}", f"--config.xlnet.mem_len={MEM}", f"--config.train.batch_size={B}",
         "--config.model.hidden_dropout=0", "--config.model.attention_dropout=0"]


def _corpus(tmp_path):
  """A sentence-per-line corpus of single-token words (blank lines between documents) and the token stream it
  must give: each document's ids, then [SEP]."""
  tokenizer = shards.make_tokenizer(load_config("configs/xlnet.py:tiny").data)
  ids = {w: i for i, w in enumerate(tokenizer.vocab)}
  words = [w for w in tokenizer.vocab[1000:1400] if w.isalpha() and tokenizer.encode(w) == [ids[w]]]
  rs = np.random.RandomState(0)
  lines, expected = [], []
  for _ in range(12):  # documents
    for _ in range(rs.randint(3, 7)):  # sentences
      sentence = list(rs.choice(words, rs.randint(2, 8)))
      lines.append(" ".join(sentence))
      expected += [ids[w] for w in sentence]
    lines.append("")
    expected.append(tokenizer.special_ids["[SEP]"])
  (tmp_path / "corpus.txt").write_text("\n".join(lines) + "\n")
  return str(tmp_path / "corpus.txt"), np.array(expected)


def _config(tmp_path, *overrides):
  corpus, expected = _corpus(tmp_path)
  return load_config("configs/xlnet.py:tiny", SMALL + [f"--config.data.corpus={corpus}", *overrides]), expected


def test_each_row_continues_the_same_rows_stream(tmp_path):
  config, tokens = _config(tmp_path, "--config.xlnet.bi_data=true")
  inputs = pipeline.for_config(config, "train", B)
  assert config.data.example_builder == "xlnet_stream" and isinstance(inputs, xlnet_stream.StreamInput)
  n = len(tokens) // (B // 2)  # B / 2 forward streams, then the same reversed
  streams = [tokens[i * n:(i + 1) * n] for i in range(B // 2)]
  streams += [x[::-1] for x in streams]
  batches = [next(inputs) for _ in range(3)]
  sep, cls = 3, 2
  for s, batch in enumerate(batches):
    assert batch["input_ids"].shape == (B, SEQ) and (batch["input_mask"] == 1).all()
    for i in range(B):
      row, segments = batch["input_ids"][i], batch["segment_ids"][i]
      # row i of step s: stream i's tokens from s x reuse_len, then A (stream i just after them) [SEP] B [SEP] [CLS]
      np.testing.assert_array_equal(row[:REUSE], streams[i][s * REUSE:(s + 1) * REUSE])
      assert row[REUSE] == streams[i][(s + 1) * REUSE] and row[-1] == cls and row[-2] == sep
      a_end = int(np.flatnonzero(segments == 1)[0]) - 1  # A's [SEP]
      assert row[a_end] == sep and (segments[:a_end + 1] == 0).all() and segments[-1] == 2
      np.testing.assert_array_equal(row[REUSE:a_end], streams[i][(s + 1) * REUSE:(s + 1) * REUSE + a_end - REUSE])
      np.testing.assert_array_equal(batch["predictable"][i], (row != sep) & (row != cls))
      b = row[a_end + 1:-2]
      if batch["next_sentence_labels"][i] == 1:  # B: the text after A (from A's end before A was trimmed)
        start = (s + 1) * REUSE + a_end - REUSE
        assert any((streams[i][c:c + len(b)] == b).all() for c in range(start, start + SEQ))
  # the same (seed, step) gives the same batch; a restored position continues where the saved one was
  inputs.save(str(tmp_path / "position"))
  later = next(inputs)
  again = pipeline.for_config(config, "train", B)
  again.restore(str(tmp_path / "position"))
  for k, v in next(again).items():
    np.testing.assert_array_equal(v, later[k])


# --- Memory across steps ----------------------------------------------------------------------------------------

def _hidden_states(objective):
  """The model's hidden states under the step's factorisation, with the memory `mems` [B, L, M, H]: jitted
  once for every step of a test (not traced again each step)."""
  @jax.jit
  def hidden_states(params, batch, step_rng, mems):
    inputs, _ = objective._inputs(batch, jax.random.split(step_rng)[0])
    return objective.model.apply({"params": params}, **inputs, mems=jnp.swapaxes(mems, 0, 1),
                                 output_hidden_states=True).hidden_states
  return hidden_states


def _expected_memory(hidden_states, params, batch, step_rng, mems):
  """[B, L, M, H]: the last mem_len of [memory, each layer's input at the first reuse_len tokens], from the
  model's hidden states (not its `mems` output), under the step's factorisation."""
  layer_inputs = np.asarray(hidden_states(params, batch, step_rng, mems))[:-1, :, :REUSE]  # [L, B, reuse, H]
  both = np.concatenate([np.swapaxes(np.asarray(mems), 0, 1), layer_inputs], axis=2)
  return np.swapaxes(both[:, :, -MEM:], 0, 1)


def test_the_train_state_carries_the_previous_steps_hidden_states(tmp_path):
  config, _ = _config(tmp_path, "--config.xlnet.bi_data=true")
  setup = step.build_train_setup(config)
  assert isinstance(setup.objective, objectives.CarryingObjective) and setup.objective.config.bi_data
  state = setup.init_state(jax.random.key(0))
  assert state.carry.shape == (B, 2, MEM, 32) and not np.asarray(state.carry).any()  # zeros, as train_gpu.py
  inputs = pipeline.for_config(config, "train", B)
  rng = jax.random.key(1)
  sums = jax.jit(lambda params, batch, rng: setup.objective.sums(params, batch, rng, True))
  hidden_states = _hidden_states(setup.objective)
  carry = np.zeros((B, 2, MEM, 32), np.float32)
  history = []
  for s in range(2):
    batch = next(inputs)
    params = jax.device_get(state.params)
    step_rng = jax.random.fold_in(rng, s)
    expected = _expected_memory(hidden_states, params, batch, step_rng, carry)
    state, metrics = setup.train_step(state, partitioning.global_batch(batch, setup.mesh), rng)
    np.testing.assert_allclose(np.asarray(state.carry), expected, atol=1e-5)
    # the step's loss is the objective's with the previous step's memory (dropout is 0 here), not without it
    with_memory = sums(params, {**batch, objectives.CARRY: jnp.asarray(carry)}, step_rng)
    np.testing.assert_allclose(float(metrics["loss"]), with_memory["plm_loss"] / setup.objective.counts(batch)["plm"],
                               rtol=1e-5)
    history.append((batch, params, expected, float(metrics["loss"])))
    carry = expected
  assert np.abs(carry[:, :, -REUSE - 1]).min() > 0  # step 2's memory: step 1's reuse_len states, then step 2's
  without = sums(params, batch, step_rng)["plm_loss"]
  assert abs(float(without) - float(with_memory["plm_loss"])) > 1e-4
  if not os.environ.get("BERT_JAX_SLOW_TESTS"):
    return  # the shard_map path below compiles a second step: the weekly run's
  # through the step's shard_map (a bfloat16 gradient reduction): each device's rows, one here, read their own
  # way (the rows' backward_rows) and the memory comes back in row order
  first_batch, first_params, first_carry, first_loss = history[0]
  setup2 = step.build_train_setup(_config(tmp_path, "--config.xlnet.bi_data=true",
                                          "--config.train.grad_reduce_dtype=bfloat16")[0])
  state2, metrics2 = setup2.train_step(setup2.make_state(first_params),
                                       partitioning.global_batch(first_batch, setup2.mesh), rng)
  np.testing.assert_allclose(np.asarray(state2.carry), first_carry, atol=1e-5)
  np.testing.assert_allclose(float(metrics2["loss"]), first_loss, rtol=1e-5)


@slow  # one more compile (BERT_JAX_SLOW_TESTS=1)
def test_micro_batches_carry_each_rows_memory(tmp_path):
  """With grad_accum_steps (micro-batch a: rows a, a + A, ...) each row's memory comes back to its row: layer 0's
  is the row's first reuse_len embeddings (dropout is 0), after mem_len - reuse_len zeros."""
  config, _ = _config(tmp_path, "--config.xlnet.bi_data=true", "--config.train.batch_size=16",
                      "--config.train.grad_accum_steps=2")
  setup = step.build_train_setup(config)
  state = setup.init_state(jax.random.key(0))
  batch = next(pipeline.for_config(config, "train", 16))
  table = np.asarray(jax.device_get(state.params)["embeddings"]["word_embeddings"]["embedding"])
  state, metrics = setup.train_step(state, partitioning.global_batch(batch, setup.mesh), jax.random.key(1))
  carry = np.asarray(state.carry)
  assert carry.shape == (16, 2, MEM, 32) and np.isfinite(float(metrics["loss"]))
  np.testing.assert_allclose(carry[:, 0, MEM - REUSE:], table[batch["input_ids"][:, :REUSE]], atol=1e-6)
  assert not carry[:, :, :MEM - REUSE].any() and np.abs(carry[:, 1]).max() > 0.1


def test_micro_batches_rows_go_back_in_order():
  rows = jnp.arange(24).reshape(12, 2)
  micro = accumulate._split({"x": rows}, 3)["x"]
  assert micro[1, 0, 0] == 2 and micro[1, 1, 0] == 8  # micro-batch 1: rows 1, 4, 7, 10
  np.testing.assert_array_equal(accumulate._unsplit(micro), rows)


def test_with_reuse_len_the_reused_tokens_never_see_the_rest():
  """The released code's two permutation blocks: what becomes the next step's memory (the first reuse_len
  tokens) sees nothing after them; the rest see all of them; half the targets in each block, none at [SEP] or
  [CLS]."""
  t, reuse, k = 24, 10, 4
  predictable = np.ones((3, t), np.int32)
  predictable[:, [15, 22, 23]] = 0  # A's [SEP], B's [SEP], [CLS]
  mask = np.ones((3, t), np.int32)
  sample = jax.jit(plm.sample_plan, static_argnames=("k", "max_span", "context", "reuse_len"))
  plan = jax.tree.map(np.asarray, sample(jax.random.key(0), jnp.asarray(mask), k=k, max_span=3, context=1,
                                         predictable=jnp.asarray(predictable), reuse_len=reuse))
  for row in range(3):
    target = plan.target_mapping[row].sum(0) > 0
    perm = plan.perm_mask[row] > 0
    assert target[:reuse].sum() == (t // k) // 2 and target[reuse:].sum() == t // k - (t // k) // 2
    assert not target[[15, 22, 23]].any() and plan.weights[row].sum() == t // k
    assert perm[:reuse, reuse:].all()  # the reused tokens see nothing after them
    assert not perm[reuse:, :reuse].any()  # the rest see all of them, targets too
    for block in (slice(0, reuse), slice(reuse, t)):  # inside each block, XLNet's order
      p, tg = perm[block, block], target[block]
      assert not p[:, ~tg].any() and p[~tg][:, tg].all()
      np.testing.assert_array_equal(np.sort((~p[tg][:, tg]).sum(1)), np.arange(tg.sum()))
  assert int(plm.goals(jnp.asarray(mask), k, jnp.asarray(predictable), reuse).sum()) == 3 * (t // k)


def _run(tmp_path, workdir, steps):
  config, _ = _config(tmp_path, "--config.xlnet.bi_data=true", f"--config.train.num_steps={steps}",
                      "--config.train.log_every_steps=1", "--config.train.eval_every_steps=0",
                      "--config.checkpoint.every_steps=2", "--config.checkpoint.async_save=false",
                      "--config.train.tensorboard=false", "--config.optimizer.warmup_steps=0",
                      "--config.optimizer.decay=constant", "--config.model.hidden_dropout=0.1")
  result = trainer.pretrain(config, str(workdir))
  with open(workdir / "metrics.jsonl") as f:
    losses = {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}
  return result, losses


@slow  # three short runs (BERT_JAX_SLOW_TESTS=1)
def test_a_stopped_and_resumed_run_equals_the_uninterrupted_one(tmp_path):
  """The memory is checkpointed with the train state and the input position is the step: a run stopped at
  step 2 and resumed gives the uninterrupted run's losses and parameters, its memory included."""
  _, whole = _run(tmp_path, tmp_path / "whole", 4)
  _, first = _run(tmp_path, tmp_path / "parts", 2)
  saved = json.loads((tmp_path / "parts" / "checkpoints" / "2" / "state" / "_METADATA").read_text())
  assert "('carry',)" in saved["tree_metadata"]  # the memory is in the checkpoint
  _, parts = _run(tmp_path, tmp_path / "parts", 4)
  assert sorted(whole) == [1, 2, 3, 4] and {**first, **parts} == whole
  a, _ = params_checkpoint.load_params(str(tmp_path / "whole"))
  b, _ = params_checkpoint.load_params(str(tmp_path / "parts"))
  jax.tree.map(np.testing.assert_array_equal, a, b)


def test_what_memory_cannot_run_with_is_one_line():
  with pytest.raises(UserError, match="bi_data reads half the batch backwards"):
    objectives.make_objective(load_config("configs/xlnet.py:tiny", ["--config.train.batch_size=9"]))
  with pytest.raises(UserError, match="only the data.example_builder='xlnet_stream' rows continue"):
    objectives.make_objective(load_config("configs/xlnet.py:tiny", ["--config.data.example_builder=full_sentences"]))
  with pytest.raises(DataError, match="reuse_len=0"):
    xlnet_stream.for_config(load_config("configs/xlnet.py:tiny", ["--config.xlnet.reuse_len=0"]), "train", 8)

"""`bert-jax compile`: Cloud TPU names, collectives read from HLO, and the steps compiled for a TPU slice.

The compile tests need libtpu (the `[tpu]` extra) and skip without it; slice shapes and host counts
are checked against the Cloud TPU documentation's tables, memory against an AOT compile written out
here with plain JAX and against a hand count of the parameters and optimizer state.
"""
import importlib.util
import json
import os

import ml_collections
import numpy as np
import pytest

from bert_jax.cli import main
from bert_jax.errors import UserError
from bert_jax.tpu import hlo, slices
from core_helpers import TINY

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="libtpu is not installed (pip install 'bert_jax[tpu]')")
# Compiling BERT-large (1-2 CPU minutes) or several objectives for a slice: these run with BERT_JAX_SLOW_TESTS=1.
slow = pytest.mark.skipif(not os.environ.get("BERT_JAX_SLOW_TESTS"),
                          reason="compiles for a TPU slice (a minute or more); set BERT_JAX_SLOW_TESTS=1")


# (name, topology, chips, hosts) from cloud.google.com/tpu/docs/{v3,v4,v5e,v5p-training,v6e}.
@pytest.mark.parametrize("name,topology,chips,hosts", [
    ("v3-8", "v3:2x2", 4, 1), ("v3-32", "v3:4x4", 16, 4), ("v3-2048", "v3:32x32", 1024, 256),
    ("v4-8", "v4:2x2x1", 4, 1), ("v4-16", "v4:2x2x2", 8, 2), ("v4-32", "v4:2x2x4", 16, 4),
    ("v4-128", "v4:4x4x4", 64, 16), ("v4-1024", "v4:8x8x8", 512, 128), ("v4-4096", "v4:8x16x16", 2048, 512),
    ("v5p-8", "v5:2x2x1", 4, 1), ("v5p-128", "v5:4x4x4", 64, 16), ("v5p-256", "v5:4x4x8", 128, 32),
    ("v5p-512", "v5:4x8x8", 256, 64), ("v5p-4096", "v5:8x16x16", 2048, 512),
    ("v5p-12288", "v5:16x16x24", 6144, 1536),
    ("v5litepod-1", "v5e:1x1", 1, 1), ("v5litepod-8", "v5e:2x4", 8, 1), ("v5litepod-16", "v5e:4x4", 16, 2),
    ("v5litepod-256", "v5e:16x16", 256, 32), ("v6e-8", "v6e:2x4", 8, 1), ("v6e-256", "v6e:16x16", 256, 32),
])
def test_cloud_names_map_to_documented_slices(name, topology, chips, hosts):
  tpu = slices.parse(name)
  assert (tpu.topology_name, tpu.chips, tpu.hosts) == (topology, chips, hosts)


@pytest.mark.parametrize("name", ["v2-8", "v4-12", "v3-16", "v5litepod-512", "v4", "tpu"])
def test_names_cloud_tpu_does_not_offer_are_user_errors(name):
  with pytest.raises(UserError, match="Cloud TPU name"):
    slices.parse(name)


_LOOPED_HLO = """HloModule jit_step

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

%cond (p: (s32[], f32[1024])) -> pred[] {
  %p = (s32[], f32[1024]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(6)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (p: (s32[], f32[1024])) -> (s32[], f32[1024]) {
  %p = (s32[], f32[1024]) parameter(0)
  %x = f32[1024]{0:T(1024)} get-tuple-element(%p), index=1
  %r = f32[1024]{0:T(1024)} all-reduce(%x), channel_id=1, replica_groups=[2,4]<=[8], to_apply=%add
  %s = (bf16[64,8]{1,0}, bf16[64,8]{1,0}, u32[], u32[]) collective-permute-start(%y), source_target_pairs={{0,1},{1,0}}
  ROOT %t = (s32[], f32[1024]) tuple(%i, %r)
}

ENTRY %main (x: f32[1024]) -> f32[1024] {
  %w = (s32[], f32[1024]) while(%init), condition=%cond, body=%body
  %g = bf16[8,256]{1,0} all-gather(%z), channel_id=2, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
  ROOT %out = f32[1024] get-tuple-element(%w), index=1
}
"""


def test_collectives_count_loop_iterations_and_ring_bytes():
  found = {c["kind"]: c for c in hlo.collectives(_LOOPED_HLO, num_devices=8)}
  # all-reduce over groups of 4, 6 iterations: 2 * 3/4 * 4096 bytes each.
  assert found["all-reduce"] == {"kind": "all-reduce", "count": 6, "bytes": 6 * 2 * 3 / 4 * 4096}
  # the permute sends its bf16[64,8] buffer (1024 bytes) each iteration; its context scalars are not data.
  assert found["collective-permute"] == {"kind": "collective-permute", "count": 6, "bytes": 6 * 1024}
  # all-gather over 8 devices, outside the loop: 7/8 of the gathered bf16[8,256].
  assert found["all-gather"] == {"kind": "all-gather", "count": 1, "bytes": 7 / 8 * 4096}


_ESTIMATE_HLO = """HloModule est

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

%cond (p: (s32[], f32[256,256])) -> pred[] {
  %p = (s32[], f32[256,256]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(6)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (p: (s32[], f32[256,256])) -> (s32[], f32[256,256]) {
  %p = (s32[], f32[256,256]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[256,256] get-tuple-element(%p), index=1
  %d = f32[256,256] dot(%x, %x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %r = f32[256,256] all-reduce(%d), channel_id=1, replica_groups=[2,4]<=[8], to_apply=%add
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[256,256]) tuple(%j, %r)
}

ENTRY %main (x: f32[256,256]) -> f32[256,256] {
  %x = f32[256,256] parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[256,256]) tuple(%zero, %x)
  %w = (s32[], f32[256,256]) while(%init), condition=%cond, body=%body
  %y = f32[256,256] get-tuple-element(%w), index=1
  %g = f32[256,256] all-reduce(%y), channel_id=2, replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add
  ROOT %e = f32[256,256] exponential(%g)
}
"""


def test_step_estimate_multiplies_loops_and_overlaps_their_collectives():
  """tpu/estimate.py on a loop of 6 matmuls, each all-reduced over 4 devices, then an all-reduce over 8
  and an elementwise op, on a chip of 1 TFLOP/s, 100 GB/s HBM and 10 GB/s ICI: times by hand."""
  from bert_jax.tpu import estimate
  chip = slices.Chip("v4", 1, 1, "default", 2 ** 30, 1e12, 10e9, 4, 3, 64, 100e9)
  t = estimate.step_time(_ESTIMATE_HLO, chip, num_devices=8)
  matmul = 2 * 256 ** 3 / 1e12  # compute-bound: 3 x 256 KiB of HBM take 7.9 us, the FLOPs 33.6 us
  loop_reduce = 2 * 3 / 4 * 256 * 256 * 4 / 10e9  # 39.3 us: longer than the matmul it overlaps
  exponential = 2 * 256 * 256 * 4 / 100e9  # memory-bound: read and write 256 KiB
  final_reduce = 2 * 7 / 8 * 256 * 256 * 4 / 10e9  # outside the loop: exposed
  assert t.flops == pytest.approx(6 * 2 * 256 ** 3, rel=0.01)
  assert t.compute_bound == pytest.approx(6 * matmul, rel=0.01)
  assert t.memory_bound == pytest.approx(exponential, rel=0.05)  # + the loop counter's scalar adds
  assert t.exposed_comm == pytest.approx(6 * (loop_reduce - matmul) + final_reduce, rel=0.01)
  assert t.comm == pytest.approx(6 * loop_reduce + final_reduce, rel=0.01)
  assert t.seconds == pytest.approx(t.compute_bound + t.memory_bound + t.exposed_comm)


def test_an_uninitialised_allocation_moves_no_bytes_and_a_kernel_its_operands_and_result():
  """XLA replaces the zeroed buffer a scanned loop fills slot by slot (the layers' saved activations) with an
  "AllocateBuffer" custom call: no data moves (XLA's own cost analysis of it says -1, unknown), the loop's writes
  are counted where they happen. Counted as a kernel, BERT-large's 512-token step read 7.5 GB more HBM traffic
  per chip (6.3 of its 61 ms) than it does. A kernel's call (splash) still moves its operand and result."""
  from bert_jax.tpu import estimate
  text = "\n".join([
      "ENTRY %main (x: f32[1024,1024]) -> (f32[24,1024,1024], f32[1024,1024]) {",
      "  %x = f32[1024,1024]{1,0} parameter(0)",
      '  %a = f32[24,1024,1024]{2,1,0} custom-call(), custom_call_target="AllocateBuffer", backend_config={}',
      '  %k = f32[1024,1024]{1,0} custom-call(f32[1024,1024]{1,0} %x), custom_call_target="tpu_custom_call"',
      "  ROOT %t = (f32[24,1024,1024]{2,1,0}, f32[1024,1024]{1,0}) tuple(%a, %k)",
      "}"])
  chip = slices.Chip("v4", 1, 1, "default", 2 ** 30, 1e12, 10e9, 4, 3, 64, 100e9)
  t = estimate.step_time(text, chip, num_devices=1)
  assert t.hbm_bytes == 2 * 1024 * 1024 * 4  # the kernel's operand and result; nothing for the allocation
  assert t.memory_bound == pytest.approx(2 * 1024 * 1024 * 4 / 100e9)


def _compile_json(capsys, *argv):
  status = main(["compile", "--json", *argv])
  captured = capsys.readouterr()
  return status, json.loads(captured.out), captured.err


def _independent_train_step_bytes(config, topology, mesh_shape):
  """The train step compiled for `topology` with plain JAX: the slice, mesh and inputs built here."""
  import jax
  from jax.experimental import topologies
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  from bert_jax.training.objectives import example_batch
  from bert_jax.training.step import build_train_setup

  devices = topologies.get_topology_desc(platform="tpu", topology_name=topology, chip_config_name="megacore",
                                         chips_per_host_bounds=(2, 2, 1)).devices
  mesh = Mesh(np.asarray(devices).reshape(mesh_shape), ("data", "fsdp", "tensor"))
  setup = build_train_setup(config, mesh)
  state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                       setup.abstract_state, setup.state_shardings)
  rows = NamedSharding(mesh, PartitionSpec(("data", "fsdp")))
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=rows) for k, v in example_batch(
      config.train.batch_size, config.data.max_seq_length, config.data.max_predictions_per_seq).items()}
  key = jax.eval_shape(lambda: jax.random.key(0))
  key = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=NamedSharding(mesh, PartitionSpec()))
  memory = setup.train_step.lower(state, batch, key).compile().memory_analysis()
  return (memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes
          + memory.temp_size_in_bytes + memory.generated_code_size_in_bytes), memory.argument_size_in_bytes


# Dimensions in multiples of TPU tiles (8 x 128), so padding adds almost nothing to the hand count. One layer:
# the counts below take the layer count as it is, and a second layer made the two TPU compiles of the train step
# ~40% longer (test_small_model_...: 178 s -> 134 s wall on a loaded 2-core machine, 2026-11-30).
SMALL = ["--config.model.vocab_size=1024", "--config.model.hidden_size=256", "--config.model.num_heads=4",
         "--config.model.intermediate_size=1024", "--config.model.num_layers=1",
         "--config.model.max_position_embeddings=128", "--config.data.max_seq_length=128",
         "--config.data.max_predictions_per_seq=20", "--config.train.batch_size=8",
         "--config.model.dtype=bfloat16", "--config.mesh.data=4"]


def _hand_count_params(cfg):
  h, i, v, layers = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_layers
  layer = 4 * h * h + 4 * h + 2 * h * i + i + h + 4 * h  # q,k,v,out; FFN; two LayerNorms
  embeddings = v * h + cfg.max_position_embeddings * h + cfg.type_vocab_size * h + 2 * h
  heads = (h * h + h) + (2 * h + 2) + (h * h + h + 2 * h + v)  # pooler, NSP, MLM transform + LayerNorm + bias
  return embeddings + layers * layer + heads


@needs_libtpu
def test_small_model_compiles_for_v4_8_and_agrees_with_plain_jax(capsys):
  from bert_jax.config_utils import load_config
  status, report, err = _compile_json(capsys, "--config", "configs/bert.py:tiny", "--topology", "v4-8", *SMALL)
  assert status == 0 and report["fits"]
  # Progress on stderr while it compiles: what, for which batch and sequence length, and when each ends.
  progress = [line for line in err.splitlines() if not line.startswith("  still compiling")]
  assert progress == [
      "compiling the train step for v4-8 (4 devices, mesh data=4 fsdp=1 tensor=1): batch 8 (2 rows per device at "
      "a time), sequence length 128, 20 predictions per row",
      f"compiled the train step in {report['train_step']['compile_seconds']:.1f} s; compiling the eval step: "
      "batch 8 (2 rows per device at a time), sequence length 128, 20 predictions per row",
      f"compiled the eval step in {report['eval_step']['compile_seconds']:.1f} s"]
  assert (report["batch_size"], report["eval_batch_size"], report["seq_length"]) == (8, 8, 128)
  for key in ("topology", "chips", "hosts", "mesh", "fits", "hbm_per_chip_bytes", "hbm_capacity_bytes",
              "compile_seconds", "collectives", "estimated_step_seconds", "estimated_mfu"):
    assert key in report
  assert (report["topology"], report["chips"], report["hosts"]) == ("v4-8", 4, 1)
  assert report["mesh"] == {"data": 4, "fsdp": 1, "tensor": 1}
  assert report["hbm_capacity_bytes"] == 32 * 2 ** 30
  config = load_config("configs/bert.py:tiny", SMALL)
  total, arguments = _independent_train_step_bytes(config, "v4:2x2x1", (4, 1, 1))
  assert report["train_step"]["device_bytes"] == total
  assert report["train_step"]["argument_bytes"] == arguments
  assert report["hbm_per_chip_bytes"] >= total  # the larger of the train and eval steps
  # Arguments by hand: replicated f32 parameters and AdamW's two moments, plus this device's quarter of
  # the batch (2 rows: 3 int32 features of 128 tokens, 3 of 20 predictions, 1 label).
  params = _hand_count_params(config.model)
  expected = 3 * 4 * params + 2 * (128 * 3 + 20 * 3 + 1) * 4
  assert expected <= arguments <= 1.03 * expected
  # Pure data parallelism: the gradients' all-reduce is the only collective traffic; each device
  # sends 2 x 3/4 of the gradients (in bf16 or f32) per step.
  sent = sum(c["bytes"] for c in report["collectives"])
  assert {c["kind"] for c in report["collectives"]} == {"all-reduce"}
  assert 1.5 * 2 * params <= sent <= 1.5 * 4 * params * 1.05
  assert 0 < report["estimated_mfu"] < 1
  # The estimate's parts: shares of one step; the compiled FLOPs at least the model's (remat, softmax,
  # optimizer on top) and within 1.5x of them.
  estimate = report["estimate"]
  assert sum(estimate[f"{k}_share"] for k in ("compute_bound", "memory_bound", "comm_bound")) == pytest.approx(1)
  model_flops_per_chip = report["model_flops_per_step"] / report["chips"]
  assert model_flops_per_chip <= estimate["hlo_flops_per_chip"] <= 1.5 * model_flops_per_chip
  assert estimate["hbm_bytes_per_chip"] > 0
  # libtpu's settings were for the compile only: left set, later runs in this process and its children
  # would take themselves for a TPU VM and call jax.distributed.initialize.
  assert not {"TPU_WORKER_HOSTNAMES", "TPU_ACCELERATOR_TYPE", "CLOUD_TPU_TASK_ID"} & set(os.environ)


@pytest.mark.parametrize("overrides,topology,step_ms,needed,shards,cores,fed", [
    # BENCHMARKS.md's TPU slices table: BERT-large's 32k batch on v4-32 at its 1,871 ms roofline step:
    # 32768 x 128 tokens / 1.871 s / 4 hosts = 0.56M tokens/s per host = 2.4 workers of 0.23M; the default
    # 8 shards give each of the 4 hosts 2, so 16 (a multiple of 4 dividing the batch) are needed.
    (["--config.train.batch_size=32768"], "v4-32", 1871, 3, 16, 1, None),
    (["--config.train.batch_size=32768", "--config.data.num_shards=32"], "v4-32", 1871, 3, None, 1, None),
    # The notebook's tiny model on v4-8 at a 0.1 ms step: 32 x 128 / 1e-4 s = 41M tokens/s, 179 workers'
    # worth, but 32 rows allow at most 32 shards (and so workers): 32 x 0.23M / 4096 tokens = 1,797 steps/s.
    (["--config.train.batch_size=32"], "v4-8", 0.1, 179, 32, 14, 1796.9),
    (["--config.train.batch_size=32", "--config.data.format=bert_tfrecord"], "v4-8", 0.1, 0, None, 14, None),
])
def test_input_workers_per_host_at_the_estimated_step_rate(overrides, topology, step_ms, needed, shards, cores, fed):
  from bert_jax.config_utils import load_config
  from bert_jax.tpu import aot
  need = aot.input_need(load_config("configs/bert.py:tiny", overrides), slices.parse(topology), step_ms / 1e3)
  assert (need["input_workers_needed"], need["input_num_shards"], need["input_cores_per_host"]) == (
      needed, shards, cores)
  workers = 32 if fed else needed
  assert need["input_workers_per_host"] == workers
  assert need["input_steps_per_second"] == (pytest.approx(fed, abs=0.1) if fed else None)
  line = aot._input_line(need)  # pylint: disable=protected-access
  assert ("INPUT-BOUND" in line) == bool(fed)
  assert (f"--config.data.num_workers={workers}" in line) == (workers > 0)
  assert (f"--config.data.num_shards={shards}" in line) == bool(shards)


@needs_libtpu
@pytest.mark.parametrize("argv,message", [
    (["--topology", "v9-8"], "unknown TPU topology 'v9-8'"),
    (["--topology", "v4-8", "--config.mesh.data=3"], "v4-8 has 4 devices"),
    (["--topology", "v4-16", "--config.train.batch_size=9"], "must be divisible by data-parallel size"),
    (["--topology", "v4-8", "--config.model.attention=cudnn", "--config.model.attention_dropout=0"],
     "model.attention='cudnn' needs a GPU with cuDNN and the step runs on tpu"),
    (["--topology", "v4-8", "--config.model.attention=splash", "--config.model.attention_dropout=0",
      "--config.data.max_seq_length=100"], "the length 100 is not a multiple of 128"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
  assert main(["compile", "--config", "configs/bert.py:tiny", *TINY, *argv]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and message in err


# spanbert in the suite; the other objectives' features take the same path (weekly)
@pytest.mark.parametrize("family,feature", [("spanbert", "masked_lm_span_offset"),
                                            pytest.param("structbert", "shuffled_positions", marks=slow),
                                            pytest.param("ernie", "task_ids", marks=slow),
                                            pytest.param("ernie_thu", "entity_candidates", marks=slow)])
def test_steps_are_lowered_with_the_features_the_objective_reads(family, feature):
  """`compile`'s abstract batch is the input pipeline's contract for the config (span and trigram
  features included; before, the spanbert step raised a KeyError): lowered here on the CPU mesh."""
  import jax
  from bert_jax.config_utils import load_config
  from bert_jax.data_pipelines import features
  from bert_jax.tpu import aot
  from bert_jax.training import partitioning
  from bert_jax.training.step import build_train_setup
  config = load_config(f"configs/{family}.py:tiny", TINY)
  mesh = partitioning.make_mesh(config.mesh)
  setup = build_train_setup(config, mesh)
  batch = aot._abstract_batch(config, 8, mesh, setup.objective)  # pylint: disable=protected-access
  assert feature in batch
  added = setup.objective.feature_shapes(8, config.data.max_seq_length) if family == "ernie_thu" else {}
  assert {k: (str(v.dtype), v.shape) for k, v in batch.items()} == {**features.feature_shapes(config.data, 8), **added}
  setup.train_step.lower(setup.abstract_state, batch, jax.random.key(0))
  setup.eval_step.lower(setup.abstract_state.params, batch)


@slow  # ~30 s of TPU compilation each
@needs_libtpu
@pytest.mark.parametrize("config", ["configs/ernie.py:tiny", "configs/ernie_thu.py:tiny", "configs/ltr.py:tiny",
                                    "configs/structbert.py:tiny"])
def test_the_lectures_objectives_compile_for_a_v4_8_slice(capsys, config):
  """ERNIE 2.0 (five task heads, task embeddings), ERNIE-THU (fusion layers; the entity features its feed
  adds), the LTR ablation (causal mask) and StructBERT compile for TPU through `bert-jax compile`, at TINY's
  sizes, and fit."""
  status, report, err = _compile_json(capsys, "--config", config, "--topology", "v4-8", *TINY)
  assert status == 0 and report["fits"], err
  assert report["train_step"]["device_bytes"] > 0 and report["eval_step"]["device_bytes"] > 0


def test_missing_libtpu_names_the_tpu_extra(capsys, monkeypatch):
  monkeypatch.setitem(__import__("sys").modules, "libtpu", None)  # import libtpu now raises ImportError
  assert main(["compile", "--config", "configs/bert.py:tiny", "--topology", "v4-8", *TINY]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "bert_jax[tpu]" in err


@needs_libtpu
@slow
def test_bert_large_batch_256_fits_on_v4_16_and_agrees_with_plain_jax(capsys):
  from bert_jax.config_utils import load_config
  overrides = ["--config.model.dtype=bfloat16", "--config.train.batch_size=256", "--config.data.max_seq_length=128",
               "--config.data.max_predictions_per_seq=20", "--config.model.remat=none",
               "--config.train.grad_accum_steps=1", "--config.mesh.data=8", "--config.mesh.fsdp=1",
               "--config.train.eval_batch_size=256"]
  status, report, err = _compile_json(capsys, "--config", "configs/bert.py:large", "--topology", "v4-16", *overrides)
  assert status == 0 and report["fits"] and (report["chips"], report["hosts"]) == (8, 2)
  total, _ = _independent_train_step_bytes(load_config("configs/bert.py:large", overrides), "v4:2x2x2", (8, 1, 1))
  assert report["train_step"]["device_bytes"] == total
  assert report["hbm_per_chip_bytes"] == max(total, report["eval_step"]["device_bytes"]) < 32 * 2 ** 30


@needs_libtpu
@slow  # the one-line advice is test_the_fix_for_a_step_that_does_not_fit's; this is BERT-large's compile
def test_bert_large_8k_by_512_without_remat_does_not_fit_on_8_chips(capsys):
  # The compiler gives up on the temporaries early: ~30 CPU seconds with the eval step's compile.
  status, report, err = _compile_json(
      capsys, "--config", "configs/bert.py:large", "--topology", "v4-16", "--config.model.dtype=bfloat16",
      "--config.train.batch_size=8192", "--config.data.max_seq_length=512",
      "--config.data.max_predictions_per_seq=80", "--config.model.remat=none",
      "--config.train.grad_accum_steps=1", "--config.mesh.data=8", "--config.mesh.fsdp=1",
      "--config.train.eval_batch_size=256")
  assert status == 1 and not report["fits"]
  assert report["hbm_per_chip_bytes"] > report["hbm_capacity_bytes"] == 32 * 2 ** 30
  last = err.strip().splitlines()[-1]  # after the compile's progress lines
  assert "does not fit" in last and "--config." in last
  assert report["chips"] == 8 and report["mesh"] == {"data": 8, "fsdp": 1, "tensor": 1}


@pytest.mark.parametrize("overrides,state_gib,used_gib,fix", [
    ([], 20, 40, "--config.mesh.fsdp=-1 --config.mesh.data=1"),  # the state alone is most of HBM
    (["--config.mesh.fsdp=4"], 20, 40, "--config.model.remat=full"),
    (["--config.model.remat=full"], 4, 40, "--config.train.grad_accum_steps=2"),  # 36 GiB of activations, 28 free
    (["--config.model.remat=full", "--config.train.grad_accum_steps=4"], 4, 100, "grad_accum_steps=16"),
])
def test_the_fix_for_a_step_that_does_not_fit(overrides, state_gib, used_gib, fix):
  from bert_jax.config_utils import load_config
  from bert_jax.tpu import aot
  config = load_config("configs/bert.py:tiny", overrides)
  assert fix in aot.suggest_fix(config, state_gib * 2 ** 30, 32 * 2 ** 30, used_gib * 2 ** 30)


@slow  # two TPU compiles (~35 s); pruning's shapes and FLOPs on CPU: test_bertology_*
@needs_libtpu
def test_pruned_heads_shrink_the_compiled_step_and_its_flop_count(capsys):
  """The TPU estimate of a head-pruned model (issue 13): `compile` with model.pruned_heads."""
  unrolled = [*SMALL, "--config.model.num_layers=2", "--config.model.scan_layers=False"]
  pruned_heads = '{"0": [0, 1], "1": [3]}'
  full = _compile_json(capsys, "--config", "configs/bert.py:tiny", "--topology", "v4-8", *unrolled)[1]
  status, pruned, err = _compile_json(capsys, "--config", "configs/bert.py:tiny", "--topology", "v4-8", *unrolled,
                                      f"--config.model.pruned_heads={pruned_heads}")
  assert status == 0 and pruned["fits"]
  assert all(line.startswith(("compil", "  still compiling")) for line in err.splitlines())  # progress only
  # FLOPs by hand (3 x forward): hidden 256, heads of 64, FFN 1024, 8 rows of 128 tokens, 20 predictions,
  # vocab 1024. Layer 0 keeps 2 heads (128 columns), layer 1 keeps 3 (192).
  h, i, seq, tokens = 256, 1024, 128, 8 * 128
  def layer(width):
    return 2 * 4 * h * width + 2 * 2 * h * i + 2 * 2 * seq * width
  def skipped(width):  # the last layer's q, output projection, FFN and attention rows off [CLS] and the predictions
    return (tokens - 8 * (1 + 20)) * (2 * 2 * h * width + 2 * 2 * h * i + 2 * 2 * seq * width)
  rest = 8 * 2 * h * h + 8 * 2 * h * 2 + 8 * 20 * (2 * h * h + 2 * h * 1024)  # pooler, NSP, MLM
  assert pruned["model_flops_per_step"] == 3 * (tokens * (layer(128) + layer(192)) - skipped(192) + rest)
  assert full["model_flops_per_step"] == 3 * (tokens * 2 * layer(256) - skipped(256) + rest)
  # Each pruned head takes its q, k, v columns (64 x 256 weights + 64 biases each) and its 64 rows of the
  # output kernel out of the parameters, AdamW's two moments too: 3 heads x 3 copies x 4 bytes.
  removed = 3 * 3 * 4 * (4 * 64 * h + 3 * 64)
  dropped = full["train_step"]["argument_bytes"] - pruned["train_step"]["argument_bytes"]
  assert 0.97 * removed <= dropped <= 1.03 * removed
  assert pruned["estimated_step_seconds"] < full["estimated_step_seconds"]


@needs_libtpu
def test_the_int8_model_compiles_to_int8_matmuls_on_v5e():
  """`quantize`'s int8 model (qwix, int8 weights and activations) as libtpu compiles it for a v5e chip:
  every matmul is s8 x s8 -> s32, which the int8 MXU runs; the float model's take bf16 operands."""
  pytest.importorskip("qwix")
  from bert_jax.models.config import ModelConfig
  from bert_jax.tpu import aot
  config = ModelConfig(vocab_size=128, hidden_size=32, num_heads=4, intermediate_size=64, num_layers=2,
                       max_position_embeddings=32)  # float32, as fine-tuning writes it
  int8 = aot.compile_forward(config, "classification", 3, "v5litepod-1", 8, 16, int8=True)
  assert int8["device_kind"] == "TPU v5 lite"
  assert set(int8["matmuls"]) == {"s32 <- s8 x s8"} and sum(int8["matmuls"].values()) >= 6, int8["matmuls"]
  plain = aot.compile_forward(config, "classification", 3, "v5litepod-1", 8, 16)
  assert not any("s8" in k for k in plain["matmuls"]) and any("bf16 x bf16" in k for k in plain["matmuls"])
  # By hand, per token and layer: q, k, v, out 4 x 2 x 32 x 32; FFN 2 x 2 x 32 x 64; scores and sum
  # 2 x 2 x 16 x 32; 128 tokens x 2 layers; then the pooler (2 x 32 x 32) and classifier (2 x 32 x 3) per row.
  assert plain["flops"] == 128 * 2 * (8192 + 8192 + 2048) + 8 * (2048 + 192) == int8["flops"]


# ModernBERT's tiny model at 1024 tokens: the splash kernel (Pallas, Mosaic) compiled for a TPU chip. Four rows
# per chip: at one, splash's fixed workspace (10.4 MB) outweighs dot's scores (6.0 MB).
LONG = ["--config.model.num_layers=2", "--config.data.max_seq_length=1024", "--config.train.batch_size=16",
        "--config.data.max_predictions_per_seq=8", "--config.train.batch_warmup_steps=0",
        "--config.model.dtype=bfloat16", "--config.mesh.data=4", "--config.data.num_shards=4"]


@needs_libtpu
def test_splash_compiles_for_tpu(capsys):
  """`auto` (no attention dropout, a multiple of 128 tokens) compiled for TPU is splash's kernel."""
  status, report, _ = _compile_json(capsys, "--config", "configs/modernbert.py:tiny", "--topology", "v4-8", *LONG,
                                    "--config.model.attention=auto", "--config.model.attention_dropout=0")
  assert status == 0 and report["fits"] and (report["attention"], report["attention_setting"]) == ("splash", "auto")
  # XLA's cost analysis cannot read the kernel, so compile counts its FLOPs from the model, by hand: 16 rows x
  # 1024 queries, 2 x 2 x keys x 128 per head-summed query (q k^T and p v), keys 1024 (layer 0, global) and
  # 2 x 16 + 1 (layer 1, window 32); x 18 / 4 for the forward, dq and dkv kernels of a train step.
  from bert_jax.config_utils import load_config
  remat = load_config("configs/modernbert.py:tiny", LONG).model.remat != "none"
  kernel = 16 * 1024 * 4 * 128 * (1024 + 33) * (18 / 4 + remat)
  estimate = report["estimate"]
  assert estimate["kernel_flops_per_chip"] * 4 == pytest.approx(kernel)
  assert estimate["kernel_seconds"] == pytest.approx(kernel / 4 / 275e12)
  assert report["estimated_step_seconds"] == pytest.approx(estimate["compute_bound_seconds"] + estimate[
      "memory_bound_seconds"] + estimate["exposed_comm_seconds"]) and 0 < report["estimated_mfu"] < 1


@slow  # a second TPU compile of the same model (dot, ~25 s); the splash compile stays in the default suite
@needs_libtpu
def test_splash_holds_less_than_dot_on_tpu(capsys):
  reports = {}
  for backend in ("splash", "dot"):
    status, reports[backend], _ = _compile_json(capsys, "--config", "configs/modernbert.py:tiny", "--topology",
                                                "v4-8", *LONG, f"--config.model.attention={backend}")
    assert status == 0 and reports[backend]["fits"] and reports[backend]["attention"] == backend
  # dot keeps each layer's [rows, heads, T, T] probabilities for the backward pass; splash keeps none.
  assert reports["splash"]["train_step"]["temp_bytes"] < reports["dot"]["train_step"]["temp_bytes"]


def test_a_long_dot_step_that_does_not_fit_is_told_to_use_splash():
  from bert_jax.config_utils import load_config
  from bert_jax.tpu import aot
  config = load_config("configs/modernbert.py:base", ["--config.model.attention=dot",
                                                      "--config.data.max_seq_length=8192"])
  assert "--config.model.attention=splash" in aot.suggest_fix(config, 2e9, 32 * 2 ** 30, 255 * 2 ** 30)
  config.data.max_seq_length = 512
  assert "splash" not in aot.suggest_fix(config, 2e9, 32 * 2 ** 30, 255 * 2 ** 30)


@needs_libtpu
def test_matmuls_take_flattened_rows_off_tpu_only():
  """models/bert.py's on_rows: 2-D rows for XLA:CPU; on TPU (also a topology compiled from this CPU host,
  as `bert-jax compile` does) the N-D input as it is, where [B, 20, H] -> [B * 20, H] is a relayout copy."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import Mesh
  from bert_jax.models.bert import on_rows
  seen = []
  fn = lambda rows: seen.append(rows.shape) or jnp.ones(rows.shape[:-1] + (3,))  # noqa: E731
  x = jnp.zeros((2, 20, 8))
  tpu = Mesh(np.asarray(slices.compile_only_devices(slices.parse("v4-8"))), ("data",))
  with jax.sharding.use_abstract_mesh(tpu.abstract_mesh):
    assert on_rows(fn, x).shape == (2, 20, 3)
  cpu = Mesh(np.asarray(jax.devices()[:1]), ("data",))
  with jax.sharding.use_abstract_mesh(cpu.abstract_mesh):
    assert on_rows(fn, x).shape == (2, 20, 3)
  assert on_rows(fn, x).shape == (2, 20, 3)
  assert seen == [(2, 20, 8), (40, 8), (40, 8)]


def test_a_step_that_does_not_fit_is_not_said_to_have_compiled():
  """Before: "compiled the train step in 2.7 s" for a step the compiler ran out of memory on."""
  from bert_jax.tpu import aot
  oom = {"compile_seconds": 2.7, "oom": True, "device_bytes": 40 * 2 ** 30, "available_bytes": 16 * 2 ** 30}
  assert aot.compiled_line("train step", oom, 2, 32 * 2 ** 30) == (
      "the train step does not fit: the compiler ran out of memory after 2.7 s (it needs 80.00 GiB per chip, "
      "32.00 GiB available)")
  too_big = {"compile_seconds": 3.1, "oom": False, "device_bytes": 20 * 2 ** 30}
  assert aot.compiled_line("eval step", too_big, 2, 32 * 2 ** 30) == (
      "compiled the eval step in 3.1 s: it does not fit (it needs 40.00 GiB per chip of 32.00 GiB)")
  assert aot.compiled_line("eval step", {**too_big, "device_bytes": 2 ** 30}, 2, 32 * 2 ** 30) == (
      "compiled the eval step in 3.1 s")


def test_a_kernels_backend_config_over_several_lines_does_not_end_its_computation():
  """A Pallas kernel's custom call prints its xprof_metadata over three lines, one starting with "}}": the
  computation goes on after it (before, the parser stopped there and the estimate lost the rest of the step:
  a splash step's FLOPs read as 2% of dot's)."""
  text = "\n".join([
      "ENTRY %main (p0: f32[8,8]) -> f32[8,8] {",
      "  %p0 = f32[8,8]{1,0} parameter(0)",
      '  %k = f32[8,8]{1,0} custom-call(f32[8,8]{1,0} %p0), custom_call_target="tpu_custom_call", backend_config={'
      '"custom_call_config": {"body": "x"},',
      '"xprof_metadata":"{\\"block_q\\": 512,',
      '}}, metadata={op_name="splash"}',
      "  ROOT %d = f32[8,8]{1,0} dot(f32[8,8]{1,0} %k, f32[8,8]{1,0} %p0), lhs_contracting_dims={1}, "
      "rhs_contracting_dims={0}",
      "}"])
  module = hlo.parse(text)
  opcodes = [match.group(2) for _, _, match, _, _ in hlo.walk(module)]
  assert opcodes == ["parameter", "custom-call", "dot"]
  assert "op_name" not in module.bodies["main"][1] and "block_q" in module.bodies["main"][1]


def test_a_mesh_the_torus_cannot_hold_is_one_line():
  """v4-128's 64 chips are a 4x4x4 torus: data=8 x fsdp=8 splits a physical axis, which jax.make_mesh refuses
  with a NotImplementedError traceback; the compile command says it in one line instead."""
  from bert_jax.configs import common  # pylint: disable=import-outside-toplevel
  from bert_jax.tpu import aot  # pylint: disable=import-outside-toplevel
  tpu = slices.parse("v4-128")
  devices = slices.compile_only_devices(tpu)
  mesh = common.mesh_config()
  mesh.data, mesh.fsdp = 8, 8
  with pytest.raises(UserError, match=r"v4-128: mesh \{'data': 8, 'fsdp': 8, 'tensor': 1\} does not lay out on "
                                      r"these 64 devices \(4x4x4 torus\)"):
    aot._slice_mesh(ml_collections.ConfigDict({"mesh": mesh}), tpu, devices)  # pylint: disable=protected-access
  mesh.data, mesh.fsdp = 4, 16
  assert dict(aot._slice_mesh(ml_collections.ConfigDict({"mesh": mesh}), tpu, devices).shape) == {  # pylint: disable=protected-access
      "data": 4, "fsdp": 16, "tensor": 1}

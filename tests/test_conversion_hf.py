"""Hugging Face checkpoints: parity with the transformers PyTorch models, exact round trips, bad input."""
import collections
import io
import json
import os
import pickle
import re
import struct
import subprocess
import sys
import zipfile
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import safetensors.numpy  # noqa: E402

import bert_jax  # noqa: E402
from bert_jax.conversion import hf  # noqa: E402
from bert_jax.errors import UserError  # noqa: E402

TOL = 1e-5
SIZES = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
# family: (transformers model class, config class, config overrides, {bert_jax output: HF output})
FAMILIES = {
    "bert": ("BertForPreTraining", "BertConfig", dict(max_position_embeddings=64),
             {"mlm_logits": "prediction_logits", "nsp_logits": "seq_relationship_logits"}),
    "roberta": ("RobertaForMaskedLM", "RobertaConfig", dict(max_position_embeddings=66, pad_token_id=1,
                                                             type_vocab_size=1, layer_norm_eps=1e-5),
                {"mlm_logits": "logits"}),
    "albert": ("AlbertForPreTraining", "AlbertConfig", dict(embedding_size=16, max_position_embeddings=64),
               {"mlm_logits": "prediction_logits", "sop_logits": "sop_logits"}),
    "electra_generator": ("ElectraForMaskedLM", "ElectraConfig", dict(embedding_size=16, max_position_embeddings=64),
                          {"mlm_logits": "logits"}),
    "electra_discriminator": ("ElectraForPreTraining", "ElectraConfig",
                              dict(embedding_size=32, max_position_embeddings=64), {"rtd_logits": "logits"}),
}


def build_hf(family, seed=0, **overrides):
  cls_name, config_name, extra, _ = FAMILIES[family]
  torch.manual_seed(seed)
  config = getattr(transformers, config_name)(**{**SIZES, **extra, **overrides})
  model = getattr(transformers, cls_name)(config).eval()
  with torch.no_grad():  # random, non-trivial LayerNorms and biases, so a swapped tensor shows
    for name, p in model.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name:
        p.add_(torch.randn_like(p) * 0.1)
  return model


def padded_batch(pad_id=0, type_vocab=2, vocab=100):
  """Right-padded rows of different lengths with two segments."""
  rng = np.random.RandomState(1)
  lengths = np.array([9, 5, 7])
  mask = (np.arange(9)[None] < lengths[:, None]).astype(np.int64)
  ids = np.where(mask, rng.randint(3, vocab, (3, 9)), pad_id)
  types = ((np.arange(9)[None] >= lengths[:, None] // 2) * mask) if type_vocab > 1 else np.zeros_like(ids)
  return ids, mask, types


def hf_outputs(model, family, ids, mask, types):
  with torch.no_grad():
    out = model(torch.tensor(ids), attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(types),
                output_hidden_states=True)
  result = {"last_hidden_state": out.hidden_states[-1].numpy()}
  result.update({ours: getattr(out, theirs).numpy() for ours, theirs in FAMILIES[family][3].items()})
  if family in ("bert", "albert"):
    base = model.bert if family == "bert" else model.albert
    with torch.no_grad():
      result["pooled_output"] = base(torch.tensor(ids), attention_mask=torch.tensor(mask),
                                     token_type_ids=torch.tensor(types)).pooler_output.numpy()
  return result


def max_differences(model, params, reference, ids, mask, types):
  out = model.apply({"params": params}, jnp.asarray(ids), attention_mask=jnp.asarray(mask),
                    token_type_ids=jnp.asarray(types), deterministic=True)
  present = {k for k in ("pooled_output", "mlm_logits", "nsp_logits", "sop_logits", "rtd_logits")
             if getattr(out, k) is not None}
  assert present | {"last_hidden_state"} == set(reference)
  return {k: float(np.abs(np.asarray(getattr(out, k)) - v).max()) for k, v in reference.items()}


@pytest.mark.parametrize("scan_layers", [True, False])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_parity_with_transformers(tmp_path, family, scan_layers):
  if scan_layers and family != "bert" and not os.environ.get("BERT_JAX_SLOW_TESTS"):
    pytest.skip("scanned layers of the other families: weekly (BERT_JAX_SLOW_TESTS=1); the mapping is the same")
  hf_model = build_hf(family)
  hf_model.save_pretrained(tmp_path)
  cfg = hf_model.config
  ids, mask, types = padded_batch(cfg.pad_token_id or 0, cfg.type_vocab_size)
  model, params = bert_jax.load_pretrained(str(tmp_path), scan_layers=scan_layers)
  assert model.config.scan_layers == scan_layers
  assert ("layers" in params["encoder"]) == scan_layers
  diffs = max_differences(model, params, hf_outputs(hf_model, family, ids, mask, types), ids, mask, types)
  print(family, scan_layers, diffs)
  assert max(diffs.values()) <= TOL, diffs


def _state(directory):
  return safetensors.numpy.load_file(os.path.join(directory, "model.safetensors"))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_hf_round_trip_is_exact(tmp_path, family):
  hf_model = build_hf(family, seed=3)
  hf_model.save_pretrained(tmp_path / "src")
  hf.write(str(tmp_path / "dst"), hf.read(str(tmp_path / "src")))
  original, written = _state(tmp_path / "src"), _state(tmp_path / "dst")
  assert sorted(written) == sorted(original)
  for name, value in original.items():
    np.testing.assert_array_equal(written[name], value, err_msg=name)
  reloaded = type(hf_model).from_pretrained(tmp_path / "dst").eval()
  ids, mask, types = padded_batch(hf_model.config.pad_token_id or 0, hf_model.config.type_vocab_size)
  for key, value in hf_outputs(hf_model, family, ids, mask, types).items():
    np.testing.assert_array_equal(hf_outputs(reloaded, family, ids, mask, types)[key], value, err_msg=key)


def save_as_bin(model, directory):
  """The pre-safetensors layout: config.json + a torch.save'd state dict."""
  model.config.save_pretrained(directory)
  torch.save(model.state_dict(), os.path.join(directory, "pytorch_model.bin"))


def test_pytorch_bin_reads_like_safetensors(tmp_path):
  hf_model = build_hf("bert")
  hf_model.save_pretrained(tmp_path / "st")
  save_as_bin(hf_model, tmp_path / "bin")
  from_bin, from_st = hf.read_weights(str(tmp_path / "bin")), hf.read_weights(str(tmp_path / "st"))
  for name, value in from_st.items():
    np.testing.assert_array_equal(from_bin[name], value, err_msg=name)


def test_bare_model_heads_are_off_or_fresh(tmp_path, capsys):
  torch.manual_seed(0)
  transformers.BertModel(transformers.BertConfig(**SIZES)).save_pretrained(tmp_path)
  model, params = bert_jax.load_pretrained(str(tmp_path))
  assert "no weights for mlm, sentence" in capsys.readouterr().out
  assert (model.config.use_pooler, model.config.mlm_head, model.config.sentence_head) == (True, False, "none")
  model, params = bert_jax.load_pretrained(str(tmp_path), init_missing_heads=True)
  assert "initialised fresh" in capsys.readouterr().out
  assert (model.config.mlm_head, model.config.sentence_head) == (True, "nsp")
  assert jax.tree.map(np.shape, params) == jax.tree.map(np.shape, nn.meta.unbox(jax.eval_shape(
      lambda: model.init(jax.random.key(0), jnp.ones((1, 4), jnp.int32))))["params"])


def _saved_bert(tmp_path):
  build_hf("bert").save_pretrained(tmp_path)
  return str(tmp_path), os.path.join(tmp_path, "model.safetensors")


def test_unknown_architecture(tmp_path):
  directory, _ = _saved_bert(tmp_path)
  with open(os.path.join(directory, "config.json")) as f:
    config = json.load(f)
  config.update(model_type="gpt2", architectures=["GPT2LMHeadModel"])
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(config, f)
  with pytest.raises(UserError, match="unknown architecture GPT2LMHeadModel"):
    bert_jax.load_pretrained(directory)


def test_missing_tensor_is_named(tmp_path):
  directory, weights = _saved_bert(tmp_path)
  tensors = safetensors.numpy.load_file(weights)
  del tensors["bert.encoder.layer.1.output.dense.bias"]
  safetensors.numpy.save_file(tensors, weights, metadata={"format": "pt"})
  with pytest.raises(UserError, match=r"missing tensors bert\.encoder\.layer\.1\.output\.dense\.bias"):
    bert_jax.load_pretrained(directory)


def test_shape_mismatch_names_tensor_and_shapes(tmp_path):
  directory, weights = _saved_bert(tmp_path)
  tensors = safetensors.numpy.load_file(weights)
  tensors["bert.encoder.layer.0.intermediate.dense.weight"] = np.zeros((40, 32), np.float32)
  safetensors.numpy.save_file(tensors, weights, metadata={"format": "pt"})
  with pytest.raises(UserError, match=r"intermediate\.dense\.weight: checkpoint \(40, 32\) vs config \(37, 32\)"):
    bert_jax.load_pretrained(directory)


@pytest.mark.parametrize("safe", [True, False])
def test_truncated_weights(tmp_path, safe):
  if safe:
    build_hf("bert").save_pretrained(tmp_path)
  else:
    save_as_bin(build_hf("bert"), tmp_path)
  weights = os.path.join(tmp_path, "model.safetensors" if safe else "pytorch_model.bin")
  with open(weights, "rb") as f:
    data = f.read()
  with open(weights, "wb") as f:
    f.write(data[:len(data) // 2])
  with pytest.raises(UserError, match="truncated"):
    bert_jax.load_pretrained(str(tmp_path))


def test_pickle_with_code_is_refused(tmp_path):
  torch.save({"w": torch.zeros(2), "evil": print}, tmp_path / "pytorch_model.bin")
  from bert_jax.conversion.torch_zip import load_torch_zip
  with pytest.raises(UserError, match="refusing to unpickle .*print"):
    load_torch_zip(str(tmp_path / "pytorch_model.bin"))


class _Storage:
  def __init__(self, key, dtype_name, numel):
    self.key, self.dtype_name, self.numel = key, dtype_name, numel


class _View:
  """Pickles as torch's _rebuild_tensor_v2 call: a tensor claiming any offset, size and stride."""

  def __init__(self, storage, offset, size, stride):
    self.args = (storage, offset, tuple(size), tuple(stride), False, collections.OrderedDict())

  def __reduce__(self):
    return torch._utils._rebuild_tensor_v2, self.args


class _Pickler(pickle.Pickler):

  def persistent_id(self, obj):
    if isinstance(obj, _Storage):
      return ("storage", getattr(torch, obj.dtype_name), obj.key, "cpu", obj.numel)
    return None


def write_crafted_bin(path, views, storages):
  """A torch.save zip archive whose state dict maps names to `views` over raw `storages` {key: array}."""
  buffer = io.BytesIO()
  _Pickler(buffer, protocol=2).dump(collections.OrderedDict(views))
  with zipfile.ZipFile(path, "w") as archive:
    archive.writestr("archive/data.pkl", buffer.getvalue())
    archive.writestr("archive/byteorder", "little")
    for key, data in storages.items():
      archive.writestr(f"archive/data/{key}", np.ascontiguousarray(data).tobytes())


def _float_view(key, numel, offset, size, stride):
  return _View(_Storage(key, "FloatStorage", numel), offset, size, stride)


@pytest.mark.parametrize("view, dtype_pair, message", [
    (dict(offset=0, size=(32,), stride=(1,)), None, r"reaches element 31 of a storage holding 4"),
    (dict(offset=3, size=(2,), stride=(1,)), None, r"reaches element 4 of a storage holding 4"),
    (dict(offset=3, size=(2,), stride=(-1,)), None, r"negative or non-integer"),
    (dict(offset=-1, size=(2,), stride=(1,)), None, r"negative or non-integer"),
    (dict(offset=0, size=(2, 2), stride=(2, 1)), "IntStorage", r"storage 0 is read as float32 and as int32"),
])
def test_crafted_views_are_refused(tmp_path, view, dtype_pair, message):
  path = str(tmp_path / "pytorch_model.bin")
  views = {"w": _float_view("0", 4, **view)}
  if dtype_pair:
    views["v"] = _View(_Storage("0", dtype_pair, 4), 0, (4,), (1,))
  write_crafted_bin(path, views, {"0": np.arange(4, dtype=np.float32)})
  from bert_jax.conversion.torch_zip import load_torch_zip
  with pytest.raises(UserError, match=message):
    load_torch_zip(path)


def test_exact_fit_and_zero_stride_views_read(tmp_path):
  path = str(tmp_path / "pytorch_model.bin")
  storage = np.arange(6, dtype=np.float32)
  write_crafted_bin(path, {"t": _float_view("0", 6, 1, (2, 2), (1, 2)), "b": _float_view("0", 6, 5, (3,), (0,))},
                    {"0": storage})
  from bert_jax.conversion.torch_zip import load_torch_zip
  tensors = load_torch_zip(path)
  np.testing.assert_array_equal(tensors["t"], [[1, 3], [2, 4]])  # the last element read is storage[5]
  np.testing.assert_array_equal(tensors["b"], [5, 5, 5])


def _bin_with_one_view(tmp_path, name, view):
  """A saved HF BERT as pytorch_model.bin, every tensor intact except `name`, rebuilt as `view`."""
  directory = tmp_path / "model"
  save_as_bin(build_hf("bert"), directory)
  state = torch.load(directory / "pytorch_model.bin")
  views, storages = {}, {}
  for i, (key, tensor) in enumerate(state.items()):
    data = tensor.contiguous().numpy().ravel()
    storages[str(i)] = data[:4] if key == name else data
    views[key] = (_float_view(str(i), 4, *view) if key == name else
                  _float_view(str(i), data.size, 0, tuple(tensor.shape), tuple(tensor.contiguous().stride())))
  write_crafted_bin(directory / "pytorch_model.bin", views, storages)
  return str(directory)


def test_undersized_storage_is_refused_not_read_past(tmp_path):
  directory = _bin_with_one_view(tmp_path, "bert.embeddings.LayerNorm.bias", (0, (32,), (1,)))
  with pytest.raises(UserError, match=r"pytorch_model\.bin: a tensor of size \(32,\) .* storage holding 4"):
    bert_jax.load_pretrained(directory)


def test_convert_refuses_a_view_of_two_billion_elements(tmp_path, capsys):
  """Before the bounds check this read 8 GB past a 16-byte storage and the process died (SIGSEGV). In this
  process, not a new one (which imported jax, TF and torch again): a regression would crash the test worker,
  which pytest reports as this test's failure."""
  from bert_jax import cli  # pylint: disable=import-outside-toplevel
  directory = _bin_with_one_view(tmp_path, "bert.pooler.dense.bias", (0, (2_000_000_000,), (1,)))
  capsys.readouterr()
  assert cli.main(["convert", "--from", "hf", directory, str(tmp_path / "out")]) == 2
  assert capsys.readouterr().err.strip().splitlines() == [
      f"bert-jax convert: error: {directory}/pytorch_model.bin: a tensor of size (2000000000,) (offset 0, "
      "stride (1,)) reaches element 1999999999 of a storage holding 4: the file is damaged or crafted"]
  assert not os.path.exists(tmp_path / "out")


def test_config_with_fewer_layers_than_the_weights_is_refused(tmp_path):
  directory, _ = _saved_bert(tmp_path)  # 2 layers
  with open(os.path.join(directory, "config.json")) as f:
    config = json.load(f)
  config["num_hidden_layers"] = 1
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(config, f)
  with pytest.raises(UserError, match=r"config\.json does not match the weights, which hold tensors it leaves "
                                      r"unused: bert\.encoder\.layer\.1\.attention\.output\.LayerNorm\.bias, .*"
                                      r"\(\+10 more\); config\.json says num_hidden_layers=1 but the weights hold "
                                      r"2 layers"):
    bert_jax.load_pretrained(directory)


def test_half_a_head_is_refused_and_foreign_heads_are_noted(tmp_path, capsys):
  directory, weights = _saved_bert(tmp_path)
  tensors = safetensors.numpy.load_file(weights)
  tensors["classifier.weight"] = np.zeros((3, 32), np.float32)  # a fine-tuned head bert_jax has no slot for
  safetensors.numpy.save_file(tensors, weights, metadata={"format": "pt"})
  bert_jax.load_pretrained(directory)
  assert "ignored tensors without a bert_jax counterpart: classifier.weight" in capsys.readouterr().out
  del tensors["cls.predictions.transform.dense.weight"]  # the MLM head now reads as absent
  safetensors.numpy.save_file(tensors, weights, metadata={"format": "pt"})
  with pytest.raises(UserError, match=r"leaves unused: cls\.predictions\.bias, "
                                      r"cls\.predictions\.transform\.LayerNorm\.bias, .*dense\.bias$"):
    bert_jax.load_pretrained(directory)


def _deflated_zeros(mib):
  """A raw deflate stream of `mib` MiB of zeros, built in milliseconds: one MiB compressed and fully
  flushed (which resets the compressor), that block repeated, then an empty final block."""
  compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
  block = compressor.compress(bytes(1 << 20)) + compressor.flush(zlib.Z_FULL_FLUSH)
  return block * mib + b"\x03\x00"


def write_zip(path, members):
  """A zip archive written by hand, so that a member's header can declare any uncompressed size.

  members: (name, stored bytes, compression method (0 stored, 8 deflated), declared size). A deflated
  member's CRC is left 0: zipfile checks it only once the member is read to its end."""
  local, central = b"", b""
  for name, stored, method, declared in members:
    name, crc = name.encode(), zlib.crc32(stored) if method == 0 else 0
    central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0, crc, len(stored),
                           declared, len(name), 0, 0, 0, 0, 0, len(local)) + name
    local += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0, crc, len(stored), declared,
                         len(name), 0) + name + stored
  end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(central), len(local), 0)
  with open(path, "wb") as f:
    f.write(local + central + end)


def _index(views):
  buffer = io.BytesIO()
  _Pickler(buffer, protocol=2).dump(collections.OrderedDict(views))
  return buffer.getvalue()


def _hostile_bins(directory):
  """{case: (pytorch_model.bin, the error it must end in)}: the issue's cases, each a few MB on disk."""
  one_kib = _index({"w": _float_view("0", 1024, 0, (1024,), (1,))})
  bomb = _deflated_zeros(2048)  # 2 GiB of zeros in 2 MB
  cases = {
      "member inflates to 2 GiB": (
          [("archive/data.pkl", one_kib, 0, len(one_kib)), ("archive/data/0", bomb, 8, 2 << 30)],
          r"storage 0 \(1024 x float32\) should take 4,096 bytes, but its zip member archive/data/0 declares "
          r"2,147,483,648 \(stored in 2,\d{3},\d{3}\): the file is damaged or crafted"),
      "member header lies": (  # zipfile inflates only the 4 KB declared, then finds the CRC wrong
          [("archive/data.pkl", one_kib, 0, len(one_kib)), ("archive/data/0", bomb, 8, 4096)],
          r"cannot read the PyTorch checkpoint \(BadZipFile: Bad CRC-32 for file 'archive/data/0'\)"),
      "stride 0 over one float": (
          [("archive/data.pkl", _index({"w": _float_view("0", 1, 0, (1 << 28,), (0,))}), 0, None),
           ("archive/data/0", b"\0" * 4, 0, 4)],
          r"a tensor of size \(268435456,\) \(stride \(0,\)\) has 268435456 elements over a storage holding 1: "
          r"it would take 1,073,741,824 bytes"),
      "declared size past the stored bytes": (
          [("archive/data.pkl", _index({"w": _float_view("0", 1 << 33, 0, (1 << 33,), (1,))}), 0, None),
           ("archive/data/0", b"\0" * 4, 0, 4)],
          r"storage 0 \(8589934592 x float32\) should take 34,359,738,368 bytes, but its zip member "
          r"archive/data/0 declares 4"),
      "index declares 128 MiB": (
          [("archive/data.pkl", _deflated_zeros(128), 8, 128 << 20)],
          r"its archive/data.pkl declares 134,217,728 bytes, more than a state dict's index ever takes "
          r"\(67,108,864\): the file is crafted"),
  }
  files = {}
  for number, (case, (members, message)) in enumerate(cases.items()):
    path = os.path.join(directory, str(number), "pytorch_model.bin")
    os.makedirs(os.path.dirname(path))
    write_zip(path, [(n, b, m, len(b) if size is None else size) for n, b, m, size in members])
    files[case] = (path, message)
  return files


def test_deflated_zeros_inflate_to_zeros():
  assert zlib.decompress(_deflated_zeros(3), -15) == bytes(3 << 20)


LOAD_UNDER_1_GIB = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # address space: the whole process, 1 GiB
from bert_jax.conversion.torch_zip import load_torch_zip
from bert_jax.errors import UserError
for path in sys.argv[1:]:
  try:
    load_torch_zip(path)
    print("loaded", path)
  except UserError as e:
    print(e)
"""


def test_hostile_bins_are_refused_in_under_1_gib(tmp_path):
  """Before the checks: 4.3 GB for the inflating member, 1.25 GB for the stride-0 view. Now every case
  ends in its one line with the process's address space capped at 1 GiB."""
  files = _hostile_bins(tmp_path)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  done = subprocess.run([sys.executable, "-c", LOAD_UNDER_1_GIB, *(p for p, _ in files.values())],
                        capture_output=True, text=True, timeout=120, cwd=root,
                        env=dict(os.environ, PYTHONPATH=root, OPENBLAS_NUM_THREADS="1"))
  assert done.returncode == 0, done.stderr[-3000:]
  lines = done.stdout.splitlines()
  assert len(lines) == len(files), done.stdout
  for line, (case, (path, message)) in zip(lines, files.items()):
    assert line.startswith(f"{path}: ") and re.search(message, line), (case, line)


def test_convert_refuses_an_inflating_bin_in_one_line(tmp_path):
  """The CLI path: one line, exit 2, nothing written, and the process's peak RSS far under 1 GB."""
  path, message = _hostile_bins(tmp_path)["member inflates to 2 GiB"]
  build_hf("bert").config.save_pretrained(os.path.dirname(path))
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  # VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so it would report pytest's own peak.
  code = ("import re, sys\nfrom bert_jax import cli\ncode = cli.main(sys.argv[1:])\n"
          "print(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))\nsys.exit(code)")
  done = subprocess.run([sys.executable, "-c", code, "convert", "--from", "hf", os.path.dirname(path),
                         str(tmp_path / "out")], capture_output=True, text=True, timeout=300, cwd=root,
                        env=dict(os.environ, PYTHONPATH=root))
  assert done.returncode == 2, done.stderr[-3000:]
  error = [line for line in done.stderr.splitlines() if "error" in line]
  assert len(error) == 1 and error[0].startswith(f"bert-jax convert: error: {path}: ") and \
      re.search(message, error[0]), done.stderr[-3000:]
  assert int(done.stdout.split()[-1]) < 1 << 20  # VmHWM, KiB
  assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("tensor, header_size, message", [
    ({"dtype": "F32", "shape": [1 << 28], "data_offsets": [0, 4]}, None, "invalid shape, data type, or offset"),
    ({"dtype": "F32", "shape": [1 << 28], "data_offsets": [0, 1 << 30]}, None, "file not fully covered"),
    ({"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, 1 << 40, "header too large"),
])
def test_hostile_safetensors_are_refused(tmp_path, tensor, header_size, message):
  """safetensors checks declared shapes and offsets against the file before it allocates: one line each."""
  header = json.dumps({"w": tensor}).encode()
  path = tmp_path / "model.safetensors"
  path.write_bytes(struct.pack("<Q", header_size or len(header)) + header + b"\0" * 4)
  with pytest.raises(UserError, match=f"model.safetensors: cannot read safetensors .*{message}"):
    hf.read_weights(str(tmp_path))

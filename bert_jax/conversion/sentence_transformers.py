"""sentence-transformers folders: the modules around a Hugging Face model that make it a sentence
embedding model, read into a `Pooling` record and written back.

A sentence-transformers folder is a HF model directory (the `Transformer` module, at the folder's root
or in a sub-folder such as 0_Transformer/) plus:
  modules.json                   the module chain: Transformer, Pooling, optionally Normalize
  1_Pooling/config.json          the pooling modes: either sentence-transformers 6's "pooling_mode" (a
                                 name or a list) or the older "pooling_mode_<mode>" booleans
  2_Normalize/                   (no files needed) L2 normalisation of the pooled vector
  sentence_bert_config.json      the Transformer's max_seq_length (else the tokenizer's model_max_length,
                                 capped at max_position_embeddings, as sentence-transformers does) and
                                 do_lower_case (lower-casing before the tokenizer: a no-op before one
                                 that lower-cases, refused before a cased one)
Any other module (Dense, LayerNorm, a router) has no bert_jax counterpart and is refused. The export
writes the format sentence-transformers 2-5 write and 6 reads (the legacy module type names and
pooling keys), so every version since 2.0 loads it; only modes concatenated in another order than
cls, max, mean, mean_sqrt_len_tokens need version 6's "pooling_mode" list. sentence-transformers itself
is never imported.
"""
from __future__ import annotations

from etils import epath

from bert_jax import workdir
from bert_jax.errors import UserError
from bert_jax.models.pooling import MODES, Pooling

MODULES = "modules.json"
_ST_CONFIG = "sentence_bert_config.json"
_LEGACY_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                 "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens"}
_UNSUPPORTED_MODES = ("pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")
_KINDS = {"Transformer": "transformer", "Pooling": "pooling", "Normalize": "normalize"}
_CHAINS = (("transformer",), ("transformer", "pooling"), ("transformer", "pooling", "normalize"))
_TYPES = {"transformer": "sentence_transformers.models.Transformer",
          "pooling": "sentence_transformers.models.Pooling",
          "normalize": "sentence_transformers.models.Normalize"}


def is_sentence_transformers(path: str) -> bool:
  return (workdir.path(path) / MODULES).exists()


def _modules(folder: epath.Path) -> list[tuple[str, epath.Path]]:
  """(kind, its folder) per entry of modules.json, in order; UserError for a module bert_jax lacks."""
  entries = workdir.read_json(folder / MODULES)
  if not isinstance(entries, list) or not all(isinstance(e, dict) and "type" in e for e in entries):
    raise UserError(f"{folder / MODULES}: expected a list of {{\"type\", \"path\"}} entries")
  modules = []
  for entry in entries:
    kind = _KINDS.get(entry["type"].rsplit(".", 1)[-1])
    if kind is None:
      raise UserError(f"{folder}: module {entry['type']} has no bert_jax counterpart; only Transformer, "
                      "Pooling and Normalize convert")
    modules.append((kind, folder / entry["path"] if entry.get("path") else folder))
  kinds = tuple(k for k, _ in modules)
  if kinds not in _CHAINS:
    raise UserError(f"{folder / MODULES}: expected Transformer, then Pooling, then optionally Normalize; "
                    f"found {list(kinds)}")
  return modules


def transformer_dir(path: str) -> str:
  """The HF model directory inside a sentence-transformers folder (the folder itself for most)."""
  return str(_modules(workdir.path(path))[0][1])


def _pooling_modes(config: dict, source: epath.Path) -> tuple[str, ...]:
  if "pooling_mode" in config:
    mode = config["pooling_mode"]
    modes = (mode,) if isinstance(mode, str) else tuple(mode)
  else:
    modes = tuple(mode for key, mode in _LEGACY_MODES.items() if config.get(key))
    modes += tuple(key for key in _UNSUPPORTED_MODES if config.get(key))
  bad = [m for m in modes if m not in MODES]
  if bad:
    raise UserError(f"{source}: pooling mode {bad[0]} has no bert_jax counterpart; modes that convert: {MODES}")
  return modes or ("mean",)


def _settings(model_dir: epath.Path) -> dict:
  return workdir.read_json(model_dir / _ST_CONFIG) if (model_dir / _ST_CONFIG).exists() else {}


def _max_seq_length(model_dir: epath.Path, max_positions: int) -> int:
  """max_seq_length as sentence-transformers' Transformer module reads it."""
  length = _settings(model_dir).get("max_seq_length")
  if length is None:
    tokenizer = model_dir / "tokenizer_config.json"
    length = workdir.read_json(tokenizer).get("model_max_length") if tokenizer.exists() else None
    length = min(int(length), max_positions) if length else max_positions
  return int(length)


def lower_cases(path: str) -> bool:
  """Whether the folder lower-cases text before its tokenizer (sentence_bert_config.json's do_lower_case)."""
  return bool(_settings(epath.Path(transformer_dir(path))).get("do_lower_case", False))


def read(path: str, max_positions: int) -> Pooling:
  """The folder's pooling; mean pooling when it has no Pooling module (sentence-transformers' default)."""
  folder = workdir.path(path)
  modules = dict(_modules(folder))
  modes = ("mean",)
  if "pooling" in modules:
    config_file = modules["pooling"] / "config.json"
    if not config_file.exists():
      raise UserError(f"{modules['pooling']}: the Pooling module has no config.json")
    modes = _pooling_modes(workdir.read_json(config_file), config_file)
  length = _max_seq_length(modules["transformer"], max_positions)
  if not 2 <= length <= max_positions:
    raise UserError(f"{path}: max_seq_length {length} must be between 2 and max_position_embeddings={max_positions}")
  return Pooling(modes, "normalize" in modules, length)


def write(directory: str, pooling: Pooling, hidden_size: int) -> None:
  """Makes the HF model directory `directory` (already written) a sentence-transformers folder."""
  out = workdir.path(directory)
  chain = [("transformer", ""), ("pooling", "1_Pooling")]
  chain += [("normalize", "2_Normalize")] if pooling.normalize else []
  workdir.write_json(out / MODULES, [{"idx": i, "name": str(i), "path": where, "type": _TYPES[kind]}
                                     for i, (kind, where) in enumerate(chain)])
  legacy = list(pooling.modes) == [m for m in _LEGACY_MODES.values() if m in pooling.modes]
  # The booleans fix the concatenation order; another order needs sentence-transformers 6's list.
  modes = ({key: mode in pooling.modes for key, mode in _LEGACY_MODES.items()} if legacy
           else {"pooling_mode": list(pooling.modes)})
  workdir.write_json(out / "1_Pooling" / "config.json", {"word_embedding_dimension": hidden_size, **modes})
  if pooling.normalize:
    (out / "2_Normalize").mkdir(parents=True, exist_ok=True)
  workdir.write_json(out / _ST_CONFIG, {"max_seq_length": pooling.max_seq_length, "do_lower_case": False})
  workdir.write_json(out / "config_sentence_transformers.json", {"__version__": {"sentence_transformers": "2.0.0"}})


def check_lower_case(tokenizer, path: str):
  """The tokenizer record as it is; UserError where the folder lower-cases text before a tokenizer that
  keeps case (sentence_bert_config.json's do_lower_case): a lower-casing WordPiece also strips accents,
  so no bert_jax tokenizer does exactly that."""
  if tokenizer is not None and not tokenizer.lower_case and lower_cases(path):
    raise UserError(f"{path}: sentence_bert_config.json lower-cases text before a cased tokenizer; bert_jax's "
                    "tokenizers lower-case only together with stripping accents, so this folder does not convert")
  return tokenizer

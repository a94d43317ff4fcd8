"""`bert-jax presets`: every preset of every config file, read from the files themselves.

Each config file (configs/<file>.py) names its presets and what each is for in `PRESETS`, the same table
its `get_config` checks a name against; the sizes, sequence length and schedule shown are those
`get_config(preset)` returns. Parameter counts are the backbone's, as `bert-jax info` prints them
(embeddings, encoder and pooler; ELECTRA's discriminator), counted from the model section's sizes.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import ml_collections

from bert_jax import config_schema, configs, jobs
from bert_jax.errors import UserError
from bert_jax.models import families


def backbone_params(model: ml_collections.ConfigDict) -> int:
  """Embeddings (+ the E -> H projection) + layers (shared ones once) + pooler, from the model section
  (a family whose record has its own `backbone_params`, e.g. ModernBERT, MobileBERT, XLNet, counts itself)."""
  own = families.get(model.get("family") or "bert").backbone_params
  if own is not None:
    return own(model)
  h, i, e = model.hidden_size, model.intermediate_size, model.embedding_size or model.hidden_size
  embeddings = (model.vocab_size + model.max_position_embeddings + model.type_vocab_size) * e + 2 * e
  if e != h:
    embeddings += e * h + h
  attention = 4 * (h * h + h) + 2 * h  # q, k, v, out; LayerNorm
  ffn = 2 * h * i + i + h + 2 * h
  copies = {"none": (model.num_layers, model.num_layers), "all": (1, 1),
            "attention": (1, model.num_layers), "ffn": (model.num_layers, 1)}[model.share_layers]
  pooler = h * h + h if model.use_pooler else 0
  fused = 0  # ERNIE-THU's fusion layers (model.entity_layers): in place of K feed-forward sublayers
  if model.get("entity_layers", 0):
    d = model.entity_dim
    fusion = (h * i + i) + d * i + (i * h + h) + (i * d + d)  # token_fusion, entity_fusion, token/entity_output
    fusion += 4 * (d * d + d) + 2 * d  # the entity self-attention and its LayerNorm
    fusion += 2 * h + 2 * d if model.get("entity_fusion", "paper") == "residual" else 0
    fused = model.entity_layers * (fusion - ffn)
  return embeddings + copies[0] * attention + copies[1] * ffn + pooler + fused


def _family(c: ml_collections.ConfigDict, job: jobs.Job) -> str:
  if job.command == "distill":
    return "distill"
  if job.schema.kind == config_schema.DATASET:
    return c.task.family
  if c.model.get("family") or c.objective == "bert":  # the family the model section names or its switches make
    return families.model_config(c.model.to_dict()).family
  return c.objective


def _row(file: str, name: str, purpose: str, c: ml_collections.ConfigDict) -> dict[str, Any]:
  job = jobs.get(c, f"configs/{file}.py:{name}")  # the config's `job`, not its other keys, says what it is
  finetuning, distills = job.schema.kind == config_schema.DATASET, job.command == "distill"
  row = {"config": f"configs/{file}.py:{name}", "file": file, "preset": name, "for": purpose,
         "kind": "fine-tuning" if finetuning else "pretraining", "family": _family(c, job),
         "seq_length": c.data.max_seq_length, "batch_size": c.train.batch_size}
  if finetuning:
    row["epochs"] = c.train.epochs
  else:
    row["num_steps"] = c.train.num_steps
  if distills and (c.distill.get("student_layers") or c.job == "theseus"):  # some of the teacher's layers
    row.update(model_from="the teacher")
  elif (finetuning and not distills) or c.get("init_from_model"):  # the model is init_from's
    row.update(model_from="init_from")
  else:
    row.update(layers=c.model.num_layers, hidden=c.model.hidden_size, params=backbone_params(c.model))
  return row


def _spec(text: str) -> tuple[str, str]:
  """(file, preset or "") of a name as the listing and --config write it: "xlnet", "configs/xlnet.py" or
  "configs/xlnet.py:tiny"."""
  file, _, preset = text.partition(":")
  file = file.rsplit("/", 1)[-1]
  return file[:-3] if file.endswith(".py") else file, preset


def list_presets(files: tuple[str, ...] = ()) -> list[dict[str, Any]]:
  """One row per preset of each config file (all of them, or those named: "bert", "configs/bert.py", or
  one preset: "configs/bert.py:tiny")."""
  known = sorted(m.name for m in pkgutil.iter_modules(configs.__path__)
                 if hasattr(importlib.import_module(f"bert_jax.configs.{m.name}"), "PRESETS"))
  specs = [_spec(f) for f in files] or [(file, "") for file in known]
  unknown = [text for text, (file, _) in zip(files, specs) if file not in known]
  if unknown:
    raise UserError(f"{unknown[0]}: no config file with presets by that name; choose among {known} (or "
                    "configs/FILE.py, configs/FILE.py:PRESET)")
  rows = []
  for file, preset in specs:
    module = importlib.import_module(f"bert_jax.configs.{file}")
    if preset and preset not in module.PRESETS:
      raise UserError(f"configs/{file}.py has no preset {preset!r}; its presets: {', '.join(module.PRESETS)}")
    rows += [_row(file, name, purpose, module.get_config(name)) for name, purpose in module.PRESETS.items()
             if name == preset or not preset]
  return rows


def _size(row: dict[str, Any]) -> str:
  if "model_from" in row:
    return f"model from {row['model_from']}"
  return f"L{row['layers']} H{row['hidden']} {row['params'] / 1e6:.1f}M"


def _schedule(row: dict[str, Any]) -> str:
  if "epochs" in row:
    return f"batch {row['batch_size']} x {row['epochs']:g} epochs"
  return f"batch {row['batch_size']:,} x {row['num_steps']:,} steps"


def format_presets(rows: list[dict[str, Any]]) -> str:
  """A table per config file: preset, family, size (layers, hidden, parameters), sequence length, the
  schedule, and what the preset is for."""
  width = {key: max(len(f(r)) for r in rows) for key, f in
           (("preset", lambda r: r["preset"]), ("family", lambda r: r["family"]), ("size", _size),
            ("schedule", _schedule))}
  lines = []
  for file in dict.fromkeys(r["file"] for r in rows):
    module = importlib.import_module(f"bert_jax.configs.{file}")
    lines.append(f"configs/{file}.py  {(module.__doc__ or '').strip().splitlines()[0]}")
    for r in (r for r in rows if r["file"] == file):
      lines.append(f"  {r['preset']:<{width['preset']}}  {r['family']:<{width['family']}}  "
                   f"{_size(r):<{width['size']}}  seq {r['seq_length']:<3}  {_schedule(r):<{width['schedule']}}  "
                   f"{r['for']}")
  lines.append("Run one: --config configs/FILE.py:PRESET; see a preset in full: bert-jax config show --config ...")
  return "\n".join(lines)

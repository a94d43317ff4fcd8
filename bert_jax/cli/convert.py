"""`bert-jax convert`: checkpoints between Hugging Face, original TF and bert_jax formats."""
from __future__ import annotations

from bert_jax.errors import UserError


def _convert(args):
  from bert_jax import pretrained  # pylint: disable=import-outside-toplevel
  from bert_jax.conversion import hf, native, tf_checkpoint  # pylint: disable=import-outside-toplevel
  if (args.source_format is None) == (args.target_format is None):
    raise UserError("say one direction: --from hf|tf (into bert_jax) or --to hf|tf (from bert_jax)")
  kind = pretrained.source_kind(args.src)
  expected = args.source_format or "bert_jax"
  if kind != expected:
    raise UserError(f"{args.src} is a {kind} checkpoint, not {expected}")
  converted = pretrained.read_checkpoint(args.src, electra_part=args.electra_part, task=args.task)
  notes = list(converted.notes)
  if args.target_format is None:
    native.write(args.dst, converted)
    if converted.missing_heads:
      notes.append(f"no weights for {', '.join(converted.missing_heads)} in {args.src}; "
                   "fine-tuning initialises what it needs")
  else:
    writer = hf.write if args.target_format == "hf" else tf_checkpoint.write
    notes += writer(args.dst, converted)
  for note in notes:
    print(note)
  print(f"wrote {args.dst} ({converted.family}, {'tokenizer included' if converted.tokenizer else 'no tokenizer files'})")


def register(subparsers) -> None:
  p = subparsers.add_parser("convert", help="convert checkpoints: --from hf|tf SRC DST, or --to hf|tf SRC DST",
                            description="--from hf|tf: a HF directory or original TF checkpoint -> a bert_jax "
                                        "params checkpoint (for --config.init_from). --to hf|tf: a bert_jax "
                                        "checkpoint -> a HF directory or an original-style TF checkpoint.")
  p.add_argument("--from", dest="source_format", choices=("hf", "tf"))
  p.add_argument("--to", dest="target_format", choices=("hf", "tf"))
  p.add_argument("--electra-part", choices=("discriminator", "generator"),
                 help="which model of an original ELECTRA checkpoint holding both")
  p.add_argument("--task", help="the task whose head to export, from a multi-task (MT-DNN) workdir")
  p.add_argument("src")
  p.add_argument("dst")
  p.set_defaults(handler=_convert)

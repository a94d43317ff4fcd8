"""`bert-jax analyze attention|heads|change`: BERTology on any checkpoint (bert_jax/analysis)."""
from __future__ import annotations

import json


def _attention(args) -> int:
  from bert_jax.analysis import maps  # pylint: disable=import-outside-toplevel
  report = maps.analyze_attention(args.checkpoint, args.text, args.out, max_inputs=args.max_inputs,
                                  max_length=args.max_length, batch_size=args.batch_size,
                                  sentence=args.sentence, length_bin=args.length_bin)
  print(json.dumps({"out": args.out, "inputs": report["inputs"], "patterns": report["patterns"]["overall"],
                    "mean_attention_by_layer": {k: report["statistics_by_layer"][k]
                                                for k in ("cls", "sep", "punctuation")}}))
  return 0


def _heads(args) -> int:
  from bert_jax.analysis import importance  # pylint: disable=import-outside-toplevel
  report = importance.analyze_heads(args.checkpoint, args.out, eval_limit=args.eval_limit,
                                    ablations=not args.skip_ablations, step=args.step)
  print(json.dumps({"out": args.out, "task": report["task"], "base_score": report["base_score"],
                    "pruning_curve": report["pruning_curve"]}))
  return 0


def _change(args) -> int:
  from bert_jax.analysis import change  # pylint: disable=import-outside-toplevel
  report = change.analyze_change(args.pretrained, args.finetuned, args.text, args.out,
                                 max_inputs=args.max_inputs, max_length=args.max_length,
                                 batch_size=args.batch_size)
  print(json.dumps({k: report[k] for k in ("attention_cosine_distance", "weight_cosine_distance")}))
  return 0


def _text_options(p, max_inputs: int) -> None:
  p.add_argument("--text", required=True, help="one sentence, or two tab-separated segments, per line")
  p.add_argument("--max-inputs", type=int, default=max_inputs, help="read at most this many lines")
  p.add_argument("--max-length", type=int, default=128, help="tokens per input, [CLS]/[SEP] included")
  p.add_argument("--batch-size", type=int, default=16)


def register(subparsers) -> None:
  p = subparsers.add_parser("analyze", help="what the heads do: attention statistics and patterns, head "
                                            "importance and pruning, change from fine-tuning")
  sub = p.add_subparsers(dest="analysis", required=True)
  a = sub.add_parser("attention", help="per-head statistics (Clark et al.), pattern classes (Kovaleva et al.) "
                                       "and effective attention (Brunner et al.) over a text file")
  a.add_argument("--checkpoint", required=True, help="a HF directory, TF checkpoint or bert_jax checkpoint")
  _text_options(a, 1000)
  a.add_argument("--sentence", default="", help="the input whose maps attention_maps.png shows "
                                                "(default: the first line of --text)")
  a.add_argument("--length-bin", type=int, default=8, help="token-length bin width for effective attention")
  a.add_argument("--out", required=True, help="directory for attention.json and the plots")
  a.set_defaults(handler=_attention)
  h = sub.add_parser("heads", help="head importance, disable-one / keep-one deltas and the pruning curve "
                                   "(Michel et al.) on a fine-tuned workdir's dev set")
  h.add_argument("--checkpoint", required=True, help="a `bert-jax finetune` workdir")
  h.add_argument("--out", required=True, help="directory for heads.json and the plots")
  h.add_argument("--eval-limit", type=int, default=0, help="use the first N dev examples (0: all)")
  h.add_argument("--step", type=float, default=0.1, help="share of the heads masked per pruning step")
  h.add_argument("--skip-ablations", action="store_true",
                 help="skip the disable-one and keep-one deltas (2 dev evaluations per head)")
  h.set_defaults(handler=_heads)
  c = sub.add_parser("change", help="per-layer cosine distance of attention maps and weights, pretrained "
                                    "vs fine-tuned (Kovaleva et al.)")
  c.add_argument("--pretrained", required=True)
  c.add_argument("--finetuned", required=True)
  _text_options(c, 200)
  c.add_argument("--out", required=True, help="directory for change.json and change.png")
  c.set_defaults(handler=_change)

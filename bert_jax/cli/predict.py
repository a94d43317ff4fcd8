"""`bert-jax predict`: a fine-tuned model's predictions on a file, as JSON lines."""
from __future__ import annotations

import sys


def _predict(args):
  from bert_jax.finetune import predict, seq2seq  # pylint: disable=import-outside-toplevel
  if seq2seq.is_workdir(args.model):  # a T5 fine-tuned text to text: it generates
    _generate(args, seq2seq, predict)
    return
  predictor = predict.Predictor.load(args.model, batch_size=args.batch_size, task=args.task)
  examples = predict.read_examples(args.input, predictor.kind, predictor.config)
  count = predict.write_records(predictor.records(examples, progress=True), args.output)
  print(f"{count} predictions ({predictor.config['task']['name']}, {predictor.kind}) to "
        f"{args.output or 'stdout'}", file=sys.stderr)


def _generate(args, seq2seq, predict):
  generator = seq2seq.Generator.load(args.model, batch_size=args.batch_size, num_beams=args.num_beams)
  sources = predict.read_lines(args.input)
  count = predict.write_records(generator.records(sources), args.output)
  print(f"{count} generated strings ({'greedy' if generator.num_beams == 1 else f'{generator.num_beams} beams'}) "
        f"to {args.output or 'stdout'}", file=sys.stderr)


def register(subparsers) -> None:
  p = subparsers.add_parser(
      "predict", help="predict with a fine-tuned model: text in, JSON lines out",
      description="Inputs: one example per line (sentence pairs as 'first<TAB>second'; NER: one sentence "
                  "of whitespace-separated words per line; a GLUE TSV with its header row also works), "
                  "or SQuAD JSON for question answering. Output: one JSON object per example: "
                  "{label, score, scores}, {value}, {words, tags} or {id, answer, score, null_score_diff}.")
  p.add_argument("--model", required=True, help="a fine-tuning workdir (bert-jax finetune --workdir)")
  p.add_argument("--input", required=True, help="the examples (a local path or any etils.epath URL)")
  p.add_argument("--output", help="JSON lines file (default: stdout)")
  p.add_argument("--task", help="the task to predict, with a multi-task (MT-DNN) workdir's head for it")
  p.add_argument("--batch-size", type=int, default=0,
                 help="examples per model call (0: the run's train.eval_batch_size)")
  p.add_argument("--num-beams", type=int, default=0,
                 help="a seq2seq (T5) workdir: beam search with this many beams (0: the run's decode.num_beams)")
  p.set_defaults(handler=_predict)

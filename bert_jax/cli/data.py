"""`bert-jax vocab`, `bert-jax tokenize`, `bert-jax data prepare|augment|preview|throughput|service`: thin wrappers over
data_pipelines (augment: over compress/augment.py)."""
from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import sys
import threading

from bert_jax.data_pipelines.errors import DataError
from bert_jax.errors import UserError

VOCAB_EXTEND = "vocab-extend"
_SKIPS = {"skipped_files": "binary files", "skipped_lines": "lines not UTF-8 text", "overlong_lines": "lines over 64 MiB"}


class Terminated(KeyboardInterrupt):
  """SIGTERM, raised as Ctrl-C is, so it takes Ctrl-C's path: a run's partial output is removed on the way out
  (prepare.discarding_on_failure), a Beam runner closes its workers."""


def _descendants(pid: int) -> list[int]:
  """Process `pid`'s children and theirs (Beam's workers run under `sh -c`), from /proc; [] where there is none."""
  children: dict[int, list[int]] = {}
  for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
        parent = int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
      continue
    children.setdefault(parent, []).append(int(entry))
  found, pending = [], [pid]
  while pending:
    kids = children.get(pending.pop(), [])
    found += kids
    pending += kids
  return found


def _terminate(signum, frame):
  """SIGTERM reaches this process only (Ctrl-C reaches the whole process group): the workers get it too, then
  this process stops as on Ctrl-C. Workers of the in-process path ignore it; their owner closes them."""
  del signum, frame
  signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second SIGTERM must not cut the clean-up short
  for child in _descendants(os.getpid()):
    try:
      os.kill(child, signal.SIGTERM)
    except OSError:
      pass
  raise Terminated


def _stoppable(handler):
  """`handler` with SIGTERM answered as Ctrl-C: one line, exit status 143 (128 + SIGTERM), nothing partial left."""
  @functools.wraps(handler)
  def run(args):
    if threading.current_thread() is not threading.main_thread():  # only the main thread takes signals
      return handler(args)
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
      return handler(args)
    except Terminated:
      command = " ".join(filter(None, [args.command, getattr(args, "data_command", "")]))
      output = getattr(args, "output", "") if command == "data prepare" else ""
      left = f"; the partial output in {output} is removed: the same command starts again" if output else ""
      print(f"bert-jax {command}: stopped by SIGTERM{left}", file=sys.stderr, flush=True)
      return 143
    finally:
      signal.signal(signal.SIGTERM, previous)
  return run


def _beam_args(args) -> list[str] | None:
  """Beam's flags for `--runner` (and its options), or None for the in-process path. A word left over that is not
  a --flag is refused: most often the shell expanded an unquoted --corpus glob into several files, and the second
  one would otherwise go to Beam unread."""
  stray = [flag for flag in args.beam_flags if not flag.startswith("--")]
  if stray:
    raise UserError(f"{stray[0]!r} is not a flag of this command: quote a --corpus glob so the shell leaves it to "
                    "bert-jax (--corpus 'dir/*.txt'; several: comma separated); Beam's own flags after -- are "
                    "written --flag=value")
  if not args.runner:
    if args.beam_option or args.beam_flags:
      raise UserError("--beam-option and flags after -- go to a Beam runner: add --runner, e.g. --runner DirectRunner")
    return None
  from bert_jax.data_pipelines import beam_runner  # pylint: disable=import-outside-toplevel
  return beam_runner.pipeline_args(args.runner, args.workers, tuple(args.beam_option), tuple(args.beam_flags))


def _vocab(args):
  from bert_jax.data_pipelines import embedded, vocab  # pylint: disable=import-outside-toplevel
  beam_args = _beam_args(args)
  corpus = args.corpus or embedded.ensure_embedded()[0]
  print(vocab.train_vocab(corpus, args.type, args.size, args.output, args.lower_case,
                          args.corpus_format, args.model_type, args.sample_sentences, args.seed, beam_args))


def _vocab_extend(args):
  import tempfile  # pylint: disable=import-outside-toplevel
  from bert_jax import pretrained  # pylint: disable=import-outside-toplevel
  from bert_jax.conversion import native, vocab_extend  # pylint: disable=import-outside-toplevel
  from bert_jax.data_pipelines import vocab  # pylint: disable=import-outside-toplevel
  converted = pretrained.read_checkpoint(args.checkpoint)
  if converted.tokenizer is None:
    raise UserError(f"{args.checkpoint}: no tokenizer files to extend")
  if converted.tokenizer.kind not in vocab_extend.extendable():
    raise UserError(f"{args.checkpoint}: a {converted.tokenizer.kind} vocabulary; `bert-jax vocab extend` extends "
                    f"{', '.join(vocab_extend.extendable())} vocabularies")
  tokenizer = pretrained.build_tokenizer(converted.tokenizer)
  words = vocab_extend.candidates(tokenizer, vocab.corpus_sentences(args.corpus), args.count, args.min_pieces)
  if not words:
    raise UserError(f"--corpus {args.corpus}: no word of it splits into {args.min_pieces} or more known pieces")
  with tempfile.TemporaryDirectory() as tmp:
    native.write(args.output, vocab_extend.extended(converted, tokenizer, words, tmp))
  print(f"added {len(words)} words (ids {tokenizer.vocab_size}..{tokenizer.vocab_size + len(words) - 1}), e.g. "
        + ", ".join(f"{w} ({len(p)} pieces, {n}x)" for w, p, n in words[:5]) + f"; wrote {args.output}")


def _augment(args):
  from bert_jax.compress import augment  # pylint: disable=import-outside-toplevel
  counts = augment.augment_glue(args.model, args.task, args.input, args.output, per_example=args.per_example,
                                replace_prob=args.replace_prob, candidates=args.candidates, seed=args.seed,
                                max_rows=args.max_rows)
  print(f"{counts['rows']} training rows -> {counts['written']} in {args.output}/train.tsv ({args.per_example} "
        f"augmented copies each; {counts['several_piece_words']} words of several pieces kept as they were: no "
        f"word vectors here) | next: bert-jax distill ... --config.data.data_dir={args.output}")


def _tokenize(args):
  from bert_jax.data_pipelines.tokenizers import load_tokenizer  # pylint: disable=import-outside-toplevel
  tokenizer = load_tokenizer(args.vocab, args.lower_case)
  cls, sep = tokenizer.special_ids["[CLS]"], tokenizer.special_ids["[SEP]"]
  for line in sys.stdin:
    print(json.dumps([cls, *tokenizer.encode(line.rstrip("\n")), sep]))


def _prepare(args):
  beam_args = _beam_args(args)
  if args.format == "bert_tfrecord":
    from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
    if not args.config:
      raise UserError("--format bert_tfrecord builds the rows of a config: add --config, e.g. configs/bert.py:demo")
    from bert_jax.data_pipelines import prepare, prepare_rows  # pylint: disable=import-outside-toplevel
    config = load_config(args.config, args.config_overrides)
    if beam_args is None:
      write = functools.partial(prepare_rows.prepare_rows, num_workers=args.workers, overwrite=args.overwrite)
    else:
      from bert_jax.data_pipelines import beam_prepare  # pylint: disable=import-outside-toplevel
      write = functools.partial(beam_prepare.prepare_rows_on_beam, args=beam_args, overwrite=args.overwrite)
    metadata = write(config, args.output, epochs=args.epochs, split=args.split)
    held_out = prepare_rows.held_out_output(config.data, args.output, args.split)
    if held_out:  # one epoch of the held-out documents' rows, where pretrain looks for its evaluation records
      try:
        metadata["eval"] = {"output": held_out, "rows": write(config, held_out, epochs=1, split="eval")["rows"]}
      except DataError as e:  # a hold-out too small for every shard: the training rows stand without it
        print(f"no hold-out records in {held_out} ({e}); pretrain on these rows with data.eval_corpus, or with "
              "train.eval_every_steps=0", file=sys.stderr)
      except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the run is partial, its training rows too
        prepare.discard_run(args.output, held_out)
        raise
    print(json.dumps({k: v for k, v in metadata.items() if k != "rows_per_file"}, indent=1))
    return
  if args.config:
    raise UserError("--config goes with --format bert_tfrecord; tokenized documents take --corpus and --vocab")
  annotator = None
  if args.knowledge or args.knowledge_phrases or args.knowledge_spacy:
    annotator = {"phrases": args.knowledge_phrases, "spacy_model": args.knowledge_spacy}
    if beam_args is not None:
      raise UserError("--knowledge annotates in this machine's processes: leave out --runner")
  if beam_args is None:
    from bert_jax.data_pipelines import prepare  # pylint: disable=import-outside-toplevel
    metadata = prepare.prepare(args.corpus, args.output, args.vocab, args.lower_case, args.corpus_format,
                               args.workers, args.overwrite, annotator)
  else:
    from bert_jax.data_pipelines import beam_prepare  # pylint: disable=import-outside-toplevel
    metadata = beam_prepare.prepare_documents(args.corpus, args.output, beam_args, args.vocab, args.lower_case,
                                              args.corpus_format, args.overwrite)
  print(json.dumps(metadata, indent=1))
  if metadata["skipped"]:  # on a runner the workers' own warnings are in their logs: one line here
    counts = ", ".join(f"{n} {_SKIPS.get(kind, kind)}" for kind, n in metadata["skipped"].items())
    print(f"bert-jax data prepare: warning: skipped {counts}; the rest is prepared", file=sys.stderr)


def _preview(args):
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  from bert_jax.data_pipelines import preview  # pylint: disable=import-outside-toplevel
  print(preview.preview(load_config(args.config, args.config_overrides), args.num_batches, args.output))


def _throughput(args):
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  from bert_jax.data_pipelines import throughput  # pylint: disable=import-outside-toplevel
  result = throughput.measure(load_config(args.config, args.config_overrides), args.batches)
  if args.json:
    print(json.dumps(result))
  else:
    print(f"{result['examples_per_sec']:,.0f} examples/s, {result['real_tokens_per_sec']:,.0f} real tokens/s "
          f"({result['real_tokens_per_cpu_sec']:,.0f} per CPU second) on {result['cores']} cores")


def _service(args):
  from bert_jax.data_pipelines import service  # pylint: disable=import-outside-toplevel
  if args.role == "dispatcher":
    if not args.workers:
      raise UserError("a dispatcher serves a fixed list of workers: add --workers HOST:PORT,HOST:PORT")
    server = service.dispatcher(args.port, args.workers.split(","), args.work_dir)
  else:
    if not (args.dispatcher and args.address):
      raise UserError("a worker needs --dispatcher HOST:PORT and --address HOST:PORT (as the dispatcher lists it)")
    server = service.worker(args.dispatcher, args.port, args.address)
  print(f"tf.data service {args.role} serving on port {args.port}", flush=True)
  server.join()


def _add_text_args(parser):
  parser.add_argument("--lower-case", action=argparse.BooleanOptionalAction, default=True,
                      help="lower-case and strip accents (uncased vocabularies); --no-lower-case for cased")
  parser.add_argument("--corpus-format", default="sentence_per_line",
                      choices=("sentence_per_line", "document_per_line"))


def _add_beam_args(parser):
  parser.add_argument("--runner", default="", help="run as an Apache Beam pipeline on this runner (DirectRunner, "
                      "PrismRunner, DataflowRunner, FlinkRunner, SparkRunner); default: processes on this machine")
  parser.add_argument("--beam-option", action="append", default=[], metavar="KEY=VALUE",
                      help="a pipeline option for the runner, e.g. project=my-project (repeat); "
                      "or Beam's own flags after --")
  parser.add_argument("beam_flags", nargs="*", help=argparse.SUPPRESS)


def register(subparsers) -> None:
  p = subparsers.add_parser("vocab", help="train a WordPiece or SentencePiece vocabulary")
  p.add_argument("--corpus", default="", help="glob(s) of text files, comma separated; default: the embedded "
                                             "corpus (corpus.txt in ~/.cache/bert_jax/embedded-*/)")
  p.add_argument("--type", default="wordpiece", choices=("wordpiece", "sentencepiece", "camembert_spm", "xlmr_spm"),
                 help="camembert_spm / xlmr_spm: SentencePiece in CamemBERT's / XLM-R's fairseq layout (cased; writes "
                      "sentencepiece.bpe.model and tokenizer.json)")
  p.add_argument("--model-type", default="unigram", choices=("unigram", "bpe"), help="SentencePiece only")
  p.add_argument("--size", type=int, default=30522)
  p.add_argument("--output", required=True, help="directory for vocab.txt / spm.model")
  p.add_argument("--sample-sentences", type=int, default=0, metavar="N",
                 help="learn from N sentences drawn uniformly from the corpus (0: all of them; needed with --runner)")
  p.add_argument("--seed", type=int, default=0, help="the draw of --sample-sentences")
  p.add_argument("--workers", type=int, default=0, help="--runner DirectRunner: its worker processes (0: one per CPU)")
  _add_beam_args(p)
  _add_text_args(p)
  p.set_defaults(handler=_stoppable(_vocab))
  # `bert-jax vocab extend ...` (cli/__init__.py reads it as this command: `vocab` takes no subcommand)
  extend = subparsers.add_parser(
      VOCAB_EXTEND, help="(`bert-jax vocab extend`) add a domain corpus's most frequent many-piece words to a "
      "checkpoint's WordPiece or SentencePiece vocabulary")
  extend.add_argument("checkpoint", help="a bert_jax, Hugging Face or original TF checkpoint")
  extend.add_argument("output", help="the extended bert_jax params checkpoint")
  extend.add_argument("--corpus", required=True, help="glob(s) of the domain's text files, comma separated")
  extend.add_argument("--count", type=int, default=1000, help="how many words to add")
  extend.add_argument("--min-pieces", type=int, default=2, help="add words the vocabulary splits into at least this many")
  extend.set_defaults(handler=_stoppable(_vocab_extend))

  p = subparsers.add_parser("tokenize", help="stdin lines -> JSON lists of ids, [CLS] ... [SEP]")
  p.add_argument("--vocab", required=True, help="vocab.txt (WordPiece) or *.model (SentencePiece)")
  _add_text_args(p)
  p.set_defaults(handler=_stoppable(_tokenize))

  data = subparsers.add_parser("data", help="offline preparation and preview of pretraining input")
  sub = data.add_subparsers(dest="data_command", required=True)
  p = sub.add_parser("prepare", help="tokenize text into sharded document records, or (--format bert_tfrecord "
                     "--config C) build C's rows as create_pretraining_data.py records")
  p.add_argument("--format", default="documents", choices=("documents", "bert_tfrecord"),
                 help="documents: tokenized documents (data.prepared); bert_tfrecord: rows (data.format=bert_tfrecord)")
  p.add_argument("--config", default="", help="--format bert_tfrecord: the config whose data section builds the rows")
  p.add_argument("--epochs", type=int, default=1, help="--format bert_tfrecord: epochs of rows to write")
  p.add_argument("--split", default="train", choices=("train", "eval"), help="--format bert_tfrecord: which split (train also writes the hold-out's rows "
                      "to OUTPUT/eval/, where pretrain finds them)")
  p.add_argument("--corpus", default="", help="glob(s) of text files; default: the embedded corpus")
  p.add_argument("--vocab", default="", help="vocab.txt or *.model; default: the embedded vocabulary")
  p.add_argument("--output", required=True)
  p.add_argument("--workers", type=int, default=0, help="processes (0: one per CPU); with --runner DirectRunner, "
                 "its worker processes")
  p.add_argument("--overwrite", action="store_true", help="replace the shards of a previous run in --output")
  p.add_argument("--knowledge", action="store_true", help="keep phrase and entity spans with the documents, "
                 "for data.masking=knowledge (default annotator: runs of capitalised words)")
  p.add_argument("--knowledge-phrases", default="", metavar="FILE",
                 help="--knowledge from a list file, one phrase or entity per line (data.knowledge.phrases)")
  p.add_argument("--knowledge-spacy", default="", metavar="MODEL",
                 help="--knowledge from a spaCy pipeline's entities and noun chunks (data.knowledge.spacy_model)")
  _add_beam_args(p)
  _add_text_args(p)
  p.set_defaults(handler=_stoppable(_prepare))
  p = sub.add_parser("augment", help="TinyBERT's data augmentation of a GLUE task folder's train.tsv: words "
                     "replaced by a masked LM's predictions, for task distillation")
  p.add_argument("--model", required=True, help="a checkpoint with an MLM head (bert_jax, Hugging Face or TF)")
  p.add_argument("--task", required=True, help="the GLUE task whose columns train.tsv has, e.g. sst2")
  p.add_argument("--input", required=True, help="the task's folder (train.tsv; its other files are copied)")
  p.add_argument("--output", required=True, help="the augmented folder")
  p.add_argument("--per-example", type=int, default=20, help="augmented copies of each row (the paper's N_a)")
  p.add_argument("--replace-prob", type=float, default=0.4, help="each word's chance of being replaced (p_t)")
  p.add_argument("--candidates", type=int, default=15, help="a word's MLM candidates (K)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--max-rows", type=int, default=0, help="augment the first N training rows only (0: all)")
  p.set_defaults(handler=_stoppable(_augment))
  p = sub.add_parser("preview", help="write batches as the model gets them to .npz; print one")
  p.add_argument("--config", required=True, help="e.g. configs/bert.py:demo")
  p.add_argument("--num-batches", type=int, default=2)
  p.add_argument("--output", required=True, help="FILE.npz")
  p.set_defaults(handler=_stoppable(_preview))
  p = sub.add_parser("throughput", help="examples/s and real tokens/s of a config's input, after warm-up")
  p.add_argument("--config", required=True, help="e.g. configs/bert.py:demo")
  p.add_argument("--batches", type=int, default=50)
  p.add_argument("--json", action="store_true", help="one JSON line: examples_per_sec, real_tokens_per_sec, ...")
  p.set_defaults(handler=_stoppable(_throughput))
  p = sub.add_parser("service", help="run a tf.data service dispatcher or worker (data.service_address)")
  p.add_argument("--role", required=True, choices=("dispatcher", "worker"))
  p.add_argument("--port", type=int, required=True)
  p.add_argument("--workers", default="", help="dispatcher: every worker's HOST:PORT, comma separated")
  p.add_argument("--work-dir", default="", help="dispatcher: journal its state here (local or gs://) to survive restarts")
  p.add_argument("--dispatcher", default="", help="worker: the dispatcher's HOST:PORT")
  p.add_argument("--address", default="", help="worker: its own HOST:PORT as listed in the dispatcher's --workers")
  p.set_defaults(handler=_stoppable(_service))

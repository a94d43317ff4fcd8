#!/usr/bin/env bash
# Pretrain on a Cloud TPU VM slice (v3/v4/v5e/v5p/v6e), from your workstation with gcloud.
#
#   TPU=my-v4-32 ZONE=us-central2-b BUCKET=gs://my-bucket REPO=https://github.com/you/bert_jax \
#     bash launch/tpu_vm_pretrain.sh large [--config.train.num_steps=20000 ...]
#
# 1. reads the slice's accelerator type (v4-32, ...) from gcloud;
# 2. on every worker: clones REPO (or pulls it), installs bert_jax and the jax[tpu] (libtpu) that
#    matches the jax it installed;
# 3. on worker 0: `bert-jax compile` for that slice. If the config does not fit in HBM the script stops
#    here, before the slice trains, printing the fix; its JSON also says how many input worker
#    processes one host needs to keep the chips fed (the per-core rate in BENCHMARKS.md);
# 4. on every worker (--worker=all): `bert-jax pretrain` with the workdir in the bucket.
#    jax.distributed initialises itself from the TPU environment; each host reads its own shards.
#
# Corpus and vocabulary default to $BUCKET/corpus/*.txt and $BUCKET/vocab.txt (CORPUS, VOCAB override),
# the workdir to $BUCKET/runs/bert-SIZE (WORKDIR). Extra arguments are config overrides for both
# compile and pretrain. With ROWS (a glob of records from `bert-jax data prepare --format bert_tfrecord`,
# or of create_pretraining_data.py / MLPerf records) the input is the tf.data record pipeline, which
# uses the host's cores itself (BENCHMARKS.md: under one core per v4 host for BERT-base), so no input
# worker processes are started; with a text corpus, the compile report's input workers per host are.
#
# Preemption and spot capacity. A spot or preemptible slice gets SIGTERM before it goes away; the run
# then saves a checkpoint at the next step (and one every checkpoint.every_steps anyway). Re-running
# this same command resumes from the latest checkpoint in the workdir, with the input position saved
# alongside, so the resumed run sees the batches an uninterrupted one would. Spot slices are cheapest
# as queued resources, which wait for capacity and come back after a preemption when re-queued:
#
#   gcloud compute tpus queued-resources create my-qr --node-id "$TPU" --zone "$ZONE" \
#     --accelerator-type v4-32 --runtime-version tpu-ubuntu2204-base --spot
#   gcloud compute tpus queued-resources describe my-qr --zone "$ZONE"   # wait for state ACTIVE
#
# then run this script; after a preemption, delete and re-create the queued resource and run it again.
set -euo pipefail
size="${1:-base}"
shift || true
: "${TPU:?set TPU to the TPU VM name}" "${ZONE:?set ZONE}" "${BUCKET:?set BUCKET to a gs:// path}"
: "${REPO:?set REPO to the git URL of your bert_jax copy}"
corpus="${CORPUS:-$BUCKET/corpus/*.txt}"
vocab="${VOCAB:-$BUCKET/vocab.txt}"
workdir="${WORKDIR:-$BUCKET/runs/bert-$size}"

on_workers() {  # on_workers WORKER COMMAND: runs COMMAND on one worker (0, 1, ...) or on "all"
  gcloud compute tpus tpu-vm ssh "$TPU" --zone "$ZONE" --worker="$1" --command "$2"
}

topology="$(gcloud compute tpus tpu-vm describe "$TPU" --zone "$ZONE" --format='value(acceleratorType)')"
echo "== $TPU is a $topology slice"

# Every argument quoted for the remote shell, so globs and spaces reach bert-jax unexpanded.
if [ -n "${ROWS:-}" ]; then
  data_args=(--config.data.format=bert_tfrecord --config.data.corpus="$ROWS")
else
  data_args=(--config.data.corpus="$corpus")
fi
config_args=(--config "configs/bert.py:$size" --config.model.dtype=bfloat16 "${data_args[@]}"
             --config.data.vocab="$vocab" "$@")
quoted_config="$(printf '%q ' "${config_args[@]}")"

echo "== installing bert_jax and the matching jax[tpu] on every worker"
on_workers all "set -e
  export PATH=\$HOME/.local/bin:\$PATH
  if [ -d bert_jax ]; then git -C bert_jax pull --ff-only; else git clone $(printf '%q' "$REPO") bert_jax; fi
  cd bert_jax
  python3 -m pip install -q -e .
  python3 -m pip install -q \"jax[tpu]==\$(python3 -c 'import jax; print(jax.__version__)')\""

echo "== compiling the train step for $topology on worker 0 (stops here if it does not fit)"
if ! report="$(on_workers 0 "export PATH=\$HOME/.local/bin:\$PATH; cd bert_jax &&
    bert-jax compile --topology $topology --json $quoted_config")"; then
  echo "$report"
  echo "== stopped: the config does not compile or fit on $topology (see the fix above); nothing trained" >&2
  exit 1
fi
echo "$report"
# Input worker processes per host from the compile report (at least the estimate's step rate).
workers=0
if [ -z "${ROWS:-}" ]; then
  workers="$(python3 -c 'import json, sys; print(json.loads(sys.stdin.read().splitlines()[-1])["input_workers_per_host"] or 4)' \
    <<<"$report")"
fi

echo "== pretraining on all workers of $TPU into $workdir ($workers input workers per host)"
on_workers all "export PATH=\$HOME/.local/bin:\$PATH; cd bert_jax &&
  bert-jax pretrain --workdir $(printf '%q' "$workdir") $quoted_config --config.data.num_workers=$workers"

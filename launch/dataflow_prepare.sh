#!/usr/bin/env bash
# `bert-jax data prepare` as a Google Cloud Dataflow job: a corpus in a bucket -> shards in a bucket, the same
# bytes as a run on one machine (data_pipelines/beam_prepare.py).
#
#   PROJECT=my-project REGION=us-central1 BUCKET=gs://my-bucket CORPUS='gs://my-bucket/wiki/*.txt' \
#     VOCAB=gs://my-bucket/vocab.txt bash launch/dataflow_prepare.sh            # documents -> $BUCKET/prepared
#   ... CONFIG=configs/bert.py:base EPOCHS=4 bash launch/dataflow_prepare.sh --config.data.num_shards=1024
#                                                                              # rows -> $BUCKET/rows
#
# Without CONFIG it writes tokenized documents (data.prepared); with CONFIG, that config's rows
# (--format bert_tfrecord, data.format=bert_tfrecord), reading CORPUS as data.corpus. Arguments after
# the settings go to `bert-jax data prepare` (--config.data.* overrides, --corpus-format, ...).
# Settings: OUTPUT (default $BUCKET/prepared, or $BUCKET/rows with CONFIG), EPOCHS (rows: default 1),
# MAX_WORKERS (default 32), MACHINE_TYPE (default n2-standard-4), DISK_GB (default 50), TEMP (default
# $BUCKET/dataflow-tmp), JOB_NAME (default bert-jax-prepare-<time>), SDK_CONTAINER_IMAGE (an image with
# bert_jax installed; without it the workers install this checkout's setup.py at start, a few minutes),
# OVERWRITE=1 (replace a previous run's shards in OUTPUT), PYTHON (default python3).
# VOCAB must be a URL: the workers cannot read this machine's files (the embedded vocabulary included).
#
# The local twin: RUNNER=DirectRunner (WORKERS worker processes, default 2) runs the same command on
# this machine with local paths and no PROJECT/REGION/BUCKET; the test suite runs it so.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
: "${CORPUS:?set CORPUS to a glob of text files, e.g. gs://my-bucket/wiki/*.txt}"
runner="${RUNNER:-DataflowRunner}"
python="${PYTHON:-python3}"
config="${CONFIG:-}"
if [ -n "$config" ]; then
  default_output=rows
  args=(data prepare --format bert_tfrecord --config "$config" --epochs "${EPOCHS:-1}" "--config.data.corpus=$CORPUS")
else
  default_output=prepared
  args=(data prepare --corpus "$CORPUS")
fi
args+=(--runner "$runner")

if [ "$runner" = DataflowRunner ]; then
  : "${PROJECT:?set PROJECT}" "${REGION:?set REGION, e.g. us-central1}" "${BUCKET:?set BUCKET, e.g. gs://my-bucket}"
  : "${VOCAB:?set VOCAB to a gs:// vocab.txt or spm.model (Dataflow workers cannot read files on this machine)}"
  output="${OUTPUT:-$BUCKET/$default_output}"
  args+=(--beam-option "project=$PROJECT" --beam-option "region=$REGION"
         --beam-option "temp_location=${TEMP:-$BUCKET/dataflow-tmp}"
         --beam-option "job_name=${JOB_NAME:-bert-jax-prepare-$(date +%Y%m%d-%H%M%S)}"
         --beam-option "max_num_workers=${MAX_WORKERS:-32}"
         --beam-option "machine_type=${MACHINE_TYPE:-n2-standard-4}"
         --beam-option "disk_size_gb=${DISK_GB:-50}")
  if [ -n "${SDK_CONTAINER_IMAGE:-}" ]; then
    args+=(--beam-option "sdk_container_image=$SDK_CONTAINER_IMAGE")
  else
    args+=(--beam-option "setup_file=$root/setup.py")
  fi
else
  : "${OUTPUT:?set OUTPUT (a local folder with RUNNER=$runner)}"
  output="$OUTPUT"
  args+=(--workers "${WORKERS:-2}")
fi
args+=(--output "$output")
if [ -n "${VOCAB:-}" ]; then
  if [ -n "$config" ]; then
    args+=("--config.data.vocab=$VOCAB")
  else
    args+=(--vocab "$VOCAB")
  fi
fi
if [ "${OVERWRITE:-0}" = 1 ]; then
  args+=(--overwrite)
fi

echo "== bert-jax ${args[*]} $*" >&2
exec "$python" -m bert_jax.cli "${args[@]}" "$@"

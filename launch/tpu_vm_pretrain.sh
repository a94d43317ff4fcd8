#!/usr/bin/env bash
# Pretrain on a Cloud TPU VM slice (v3/v4/v5): every worker runs the same command; jax.distributed
# initialises itself from the TPU environment, and each host reads only its shards of the corpus.
#
#   REPO=<git URL of your bert_jax copy> TPU=my-v4-64 ZONE=us-central2-b BUCKET=gs://my-bucket \
#     bash launch/tpu_vm_pretrain.sh base
#
# Re-running the same command after a preemption resumes from the latest checkpoint in the workdir.
set -euo pipefail
size="${1:-base}"
: "${TPU:?set TPU to the TPU VM name}" "${ZONE:?set ZONE}" "${BUCKET:?set BUCKET to a gs:// path}"
: "${REPO:?set REPO to the git URL of your bert_jax copy}"
gcloud compute tpus tpu-vm ssh "$TPU" --zone "$ZONE" --worker=all --command "
  set -e
  [ -d bert_jax ] || git clone $REPO bert_jax
  cd bert_jax && python3 -m pip install -q -e . 'jax[tpu]' -f https://storage.googleapis.com/jax-releases/libtpu_releases.html
  bert-jax pretrain --config configs/bert.py:$size --workdir $BUCKET/runs/bert-$size \
    --config.data.corpus='$BUCKET/corpus/*.txt' --config.data.vocab=$BUCKET/vocab.txt \
    --config.model.dtype=bfloat16 --config.mesh.data=-1
"

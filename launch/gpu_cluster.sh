#!/usr/bin/env bash
# Pretrain across GPU hosts: run this on every host with its own PROCESS_ID (0..NUM_PROCESSES-1).
#
#   COORDINATOR=10.0.0.1:12345 NUM_PROCESSES=2 PROCESS_ID=0 DATA=/data bash launch/gpu_cluster.sh base
set -euo pipefail
size="${1:-base}"
: "${COORDINATOR:?host:port of process 0}" "${NUM_PROCESSES:?}" "${PROCESS_ID:?}" "${DATA:?corpus dir}"
bert-jax pretrain --config "configs/bert.py:$size" --workdir "${WORKDIR:-runs/bert-$size}" \
  --coordinator-address "$COORDINATOR" --num-processes "$NUM_PROCESSES" --process-id "$PROCESS_ID" \
  --config.data.corpus="$DATA/*.txt" --config.data.vocab="$DATA/vocab.txt" \
  --config.model.dtype=bfloat16 --config.mesh.data=-1

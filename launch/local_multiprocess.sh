#!/usr/bin/env bash
# Stand-in for a multi-host job on one machine: N CPU processes joined by jax.distributed (gloo).
#
#   bash launch/local_multiprocess.sh 2 runs/multi
set -euo pipefail
n="${1:-2}"
workdir="${2:-runs/local-multi}"
port=$((20000 + RANDOM % 20000))
pids=()
for ((i = 0; i < n; i++)); do
  XLA_FLAGS=--xla_force_host_platform_device_count=1 bert-jax pretrain --config configs/bert.py:demo \
    --workdir "$workdir" --coordinator-address "127.0.0.1:$port" --num-processes "$n" --process-id "$i" \
    --config.train.num_steps="${STEPS:-50}" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done

#!/usr/bin/env bash
# A tf.data service on a fleet of CPU VMs, to build the input of a pod slice whose hosts' cores are not enough
# (data.service_address; the input must be records: data.format=bert_tfrecord, e.g. written by
# `bert-jax data prepare --format bert_tfrecord --config C --output $BUCKET/rows`).
#
#   ZONE=us-central2-b REPO=https://github.com/you/bert_jax DISPATCHER=feed-0 WORKERS="feed-1 feed-2" \
#     bash launch/tfdata_service.sh
#
# 1. on every VM (DISPATCHER and WORKERS, reached with `gcloud compute ssh`): clones REPO (or pulls it) and
#    installs bert_jax;
# 2. starts the dispatcher on DISPATCHER:$PORT (default 5050) with the fixed list of workers (the input
#    shards statically: worker w of W builds the host shards w, w + W, ...), journaling its state in
#    WORK_DIR when set (e.g. $BUCKET/tfdata-dispatcher) so a restarted dispatcher resumes its jobs;
# 3. starts one worker on each WORKERS VM on $WORKER_PORT (default 5051), registered under its hostname.
# Servers run under nohup and log to ~/tfdata-*.log on their VM; re-running the script restarts them.
# Then pretrain with --config.data.service_address=grpc://DISPATCHER:5050 (printed at the end): the
# batches are the in-process ones, and each trainer host keeps its own input position for resume.
# The VMs need the bucket's read scope and the trainer hosts' network (same VPC, port open).
set -euo pipefail
: "${ZONE:?set ZONE}" "${REPO:?set REPO to the git URL of your bert_jax copy}"
: "${DISPATCHER:?set DISPATCHER to the dispatcher VM name}" "${WORKERS:?set WORKERS to worker VM names}"
port="${PORT:-5050}"
worker_port="${WORKER_PORT:-5051}"
work_dir="${WORK_DIR:-}"
read -r -a workers <<<"$WORKERS"

on_vm() {  # on_vm VM COMMAND
  gcloud compute ssh "$1" --zone "$ZONE" --command "$2"
}

install="set -e
  export PATH=\$HOME/.local/bin:\$PATH
  if [ -d bert_jax ]; then git -C bert_jax pull --ff-only; else git clone $(printf '%q' "$REPO") bert_jax; fi
  python3 -m pip install -q -e bert_jax"
restart() {  # restart VM NAME ARGS...: (re)starts `bert-jax data service ARGS` on VM, logging to ~/tfdata-NAME.log
  local vm="$1" name="$2"
  shift 2
  on_vm "$vm" "export PATH=\$HOME/.local/bin:\$PATH
    pkill -f 'bert-jax data service' || true
    nohup bert-jax data service $(printf '%q ' "$@") > ~/tfdata-$name.log 2>&1 &
    sleep 5; tail -n 3 ~/tfdata-$name.log"
}

addresses=()
for vm in "${workers[@]}"; do
  addresses+=("$vm:$worker_port")
done
worker_list="$(IFS=,; echo "${addresses[*]}")"

for vm in "$DISPATCHER" "${workers[@]}"; do
  echo "== installing bert_jax on $vm"
  on_vm "$vm" "$install"
done
echo "== dispatcher on $DISPATCHER:$port for workers $worker_list"
dispatcher_args=(--role dispatcher --port "$port" --workers "$worker_list")
if [ -n "$work_dir" ]; then
  dispatcher_args+=(--work-dir "$work_dir")
fi
restart "$DISPATCHER" dispatcher "${dispatcher_args[@]}"
for vm in "${workers[@]}"; do
  echo "== worker on $vm:$worker_port"
  restart "$vm" worker --role worker --port "$worker_port" --dispatcher "$DISPATCHER:$port" --address "$vm:$worker_port"
done
echo "== pretrain with --config.data.format=bert_tfrecord --config.data.service_address=grpc://$DISPATCHER:$port"

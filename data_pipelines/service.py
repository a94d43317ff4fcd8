"""`bert-jax data service`: a tf.data service dispatcher or worker, so a fleet of CPU machines builds the input
of a pod (`data.service_address`, with data.format=bert_tfrecord; launch/tfdata_service.sh starts them).

The input uses static sharding (ShardingPolicy.HINT): worker w of W builds the host shards w, w + W, ...,
so the dispatcher needs the fixed list of worker addresses, each worker the address it is listed under.
Every worker builds whole shards in order, and the trainer puts them back in shard order, so the
batches are the in-process ones. A dispatcher given --work-dir journals its state there and comes back
after a restart (fault-tolerant mode); a worker that dies takes its shards with it until restarted.
"""
from __future__ import annotations

from bert_jax.data_pipelines.tftools import tf


def dispatcher(port: int, worker_addresses: list[str], work_dir: str = ""):
  """Starts a dispatcher serving on `port` for exactly `worker_addresses` ("host:port"); returns the server."""
  service = tf().data.experimental.service
  return service.DispatchServer(service.DispatcherConfig(
      port=port, worker_addresses=worker_addresses, work_dir=work_dir or None, fault_tolerant_mode=bool(work_dir)))


def worker(dispatcher_address: str, port: int, address: str):
  """Starts a worker on `port`, registered with the dispatcher as `address` (as listed there); returns it."""
  service = tf().data.experimental.service
  return service.WorkerServer(service.WorkerConfig(
      dispatcher_address=dispatcher_address.split("://", 1)[-1], worker_address=address, port=port))

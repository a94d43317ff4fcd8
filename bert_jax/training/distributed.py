"""Multi-host start-up: `jax.distributed.initialize` automatically on TPU VMs, explicitly elsewhere."""
from __future__ import annotations

import os

import jax


def on_tpu_vm() -> bool:
  """A Cloud TPU VM worker: its environment names the slice. A process told to run on the CPU only
  (JAX_PLATFORMS=cpu) is not one, whatever TPU variables it inherited: libtpu, when it loads on a
  machine without a TPU, can leave them behind (e.g. TPU_WORKER_HOSTNAMES set to a warning)."""
  if os.environ.get("JAX_PLATFORMS", "").strip().lower() == "cpu":
    return False
  return bool(os.environ.get("TPU_WORKER_HOSTNAMES") or os.environ.get("TPU_ACCELERATOR_TYPE")
              or os.environ.get("CLOUD_TPU_TASK_ID"))


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> None:
  """Joins the job's processes. With no arguments: TPU VMs and cluster schedulers JAX detects.

  CPU processes use gloo collectives, so several local processes can stand in for hosts in tests.
  """
  if coordinator_address is None and num_processes is None and not on_tpu_vm():
    return
  # Only affects the CPU backend; set before initialize, which must precede any backend use.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                             process_id=process_id)

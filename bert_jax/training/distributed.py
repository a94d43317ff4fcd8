"""Multi-host start-up: `jax.distributed.initialize` automatically on multi-host TPU slices, explicitly
elsewhere.

A process is taken for a worker of a multi-host TPU slice only when all three hold: its platforms allow
the TPU, a TPU chip is attached to this machine, and its environment names a slice of several hosts.
The environment alone is not enough: libtpu, when it loads on a machine without a TPU (any CPU machine
with the `[tpu]` or `[test]` extra), fills TPU_WORKER_ID, CLOUD_TPU_TASK_ID and friends with warning
text, and every process started after that (a notebook's `bert-jax` commands) inherits them.
"""
from __future__ import annotations

import os

import jax
from jax._src import hardware_utils  # the PCI check jax itself runs before it loads libtpu

# Every single-host Cloud TPU slice has a name number <= 8 (v3-8, v4-8, v5p-8, v5litepod-8, v6e-8).
_LARGEST_SINGLE_HOST = 8


def _tpu_env(name: str) -> str:
  """A TPU variable's value, or "" when unset or one of libtpu's "WARNING: could not determine" fills."""
  value = os.environ.get(name, "").strip()
  return "" if value.upper().startswith("WARNING") else value


def tpu_allowed() -> bool:
  """JAX may pick the TPU: no platform list, or one that names it (`JAX_PLATFORMS=cpu` does not)."""
  platforms = (jax.config.jax_platforms or "").strip().lower()
  return not platforms or "tpu" in platforms.split(",")


def tpu_attached() -> bool:
  """A TPU chip sits on this machine's PCI bus."""
  return hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0


def slice_has_several_hosts() -> bool:
  """The environment names a multi-host slice: several workers, several slices, or a slice too large for
  one host (TPU_ACCELERATOR_TYPE=v4-32). A bare worker id (CLOUD_TPU_TASK_ID) leaves jax to ask."""
  workers = _tpu_env("TPU_PROCESS_ADDRESSES") or _tpu_env("TPU_WORKER_HOSTNAMES")
  if workers:
    return len([w for w in workers.split(",") if w.strip()]) > 1
  if _tpu_env("MEGASCALE_COORDINATOR_ADDRESS"):
    return True
  accelerator = _tpu_env("TPU_ACCELERATOR_TYPE")
  if accelerator:
    number = accelerator.rpartition("-")[2]
    return not number.isdigit() or int(number) > _LARGEST_SINGLE_HOST
  return bool(_tpu_env("CLOUD_TPU_TASK_ID"))


def on_tpu_vm() -> bool:
  """This process is one worker of a multi-host TPU slice (see the module docstring)."""
  return tpu_allowed() and slice_has_several_hosts() and tpu_attached()


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> None:
  """Joins the job's processes. With no arguments: only on a multi-host TPU slice (jax finds the rest).

  CPU processes use gloo collectives, so several local processes can stand in for hosts in tests.
  """
  if coordinator_address is None and num_processes is None and not on_tpu_vm():
    return
  # Only affects the CPU backend; set before initialize, which must precede any backend use.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                             process_id=process_id)

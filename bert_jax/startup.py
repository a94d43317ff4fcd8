"""Process start-up settings, made once before jax or TensorFlow first run (the CLI's `main` and the
library entry points in `bert_jax/__init__.py`). Each is a default: a value the user set wins.

- JAX_PLATFORMS=cpu on a machine with libtpu installed (the `[tpu]` and `[test]` extras) and no
  accelerator of any kind. jax would choose the CPU there anyway, but first it loads libtpu, which, with
  no TPU to find, prints five lines of start-up errors ("Failed to find host bounds", "unexpected worker
  hostname ...") and leaves TPU_WORKER_ID and friends in the environment of every child process, filled
  with warning text. The variable goes to child processes too (a notebook's `bert-jax` commands).
- TF_CPP_MIN_LOG_LEVEL=3: TensorFlow (the input pipeline) prints C++ start-up notes that are noise here.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import sys


def no_accelerator_here() -> bool:
  """No TPU, NVIDIA or AMD device is visible: jax's own checks (PCI ids, device nodes), and any
  /dev/accel* node, so that an accelerator jax's tables do not know yet is never taken for a CPU."""
  from jax._src import hardware_utils  # pylint: disable=import-outside-toplevel  (imports jax)
  return (hardware_utils.num_available_tpu_chips_and_device_id()[0] == 0
          and not hardware_utils.has_visible_nvidia_gpu()
          and hardware_utils.num_available_amd_gpus(stop_at=1) == 0
          and not glob.glob("/dev/accel*"))


def _cpu_only_without_accelerators() -> None:
  if (os.environ.get("JAX_PLATFORMS") is not None or "jax" in sys.modules
      or not importlib.util.find_spec("libtpu") or not no_accelerator_here()):
    return
  os.environ["JAX_PLATFORMS"] = "cpu"
  import jax  # pylint: disable=import-outside-toplevel  (read its settings before the line above)
  jax.config.update("jax_platforms", "cpu")


def configure() -> None:
  """Sets the defaults above. A process that imported jax before (a library user's own) has chosen its
  platform: it is left as it is."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  _cpu_only_without_accelerators()

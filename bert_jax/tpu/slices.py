"""Cloud TPU slices by their Cloud names (v4-32, v5litepod-256, ...): chips, hosts, physical topology,
and the per-chip figures that the compile report and its estimates use.

The number in a name counts TensorCores for v3, v4 and v5p (two per chip) and chips for v5litepod
(v5e) and v6e. Per-chip figures (bf16 peak, HBM capacity and bandwidth,
bidirectional inter-chip interconnect bandwidth) are the Cloud TPU system-architecture pages'
(cloud.google.com/tpu/docs/v3 .. v6e); v4's ICI (6 links x 50 GB/s each way) and HBM bandwidth
(1.2 TB/s) are from Jouppi et al., ISCA 2023, v3's (4 links x 656 Gbit/s; 900 GB/s) from Jouppi et al.,
CACM 2020.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re

from bert_jax.errors import UserError, require

GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU generation, per chip."""
  libtpu_name: str  # the generation as libtpu's topology names spell it ("v5e:16x16")
  cores_per_name_unit: int  # chips = name number / this (v3, v4, v5p names count TensorCores)
  devices_per_chip: int  # JAX devices per chip: v3 shows each TensorCore, megacore chips one device
  chip_config: str  # libtpu's chip_config_name
  hbm_bytes: int
  peak_bf16_flops: float
  ici_bytes_per_s: float  # bidirectional, all links of one chip
  chips_per_host: int
  torus_dims: int
  max_chips: int
  hbm_bytes_per_s: float


CHIPS = {
    "v3": Chip("v3", 2, 2, "default", 32 * GIB, 123e12, 4 * 656e9 / 8, 4, 2, 1024, 900e9),
    "v4": Chip("v4", 2, 1, "megacore", 32 * GIB, 275e12, 6 * 2 * 50e9, 4, 3, 4096, 1200e9),
    "v5litepod": Chip("v5e", 1, 1, "default", 16 * GIB, 197e12, 400e9, 8, 2, 256, 819e9),
    "v5p": Chip("v5", 2, 1, "megacore", 95 * GIB, 459e12, 1200e9, 4, 3, 6144, 2765e9),
    "v6e": Chip("v6e", 1, 1, "default", 32 * GIB, 918e12, 800e9, 8, 2, 256, 1638e9),
}
_ALIASES = {"v5e": "v5litepod"}  # the name MaxText and GKE use for v5litepod

# Slices below one 4x4x4 cube, as Cloud TPU offers them; larger ones are whole cubes (sides of 4k).
_SMALL_3D = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4)}


@dataclasses.dataclass(frozen=True)
class Slice:
  name: str
  chip: Chip
  shape: tuple[int, ...]  # chips along each torus axis

  @property
  def chips(self) -> int:
    return math.prod(self.shape)

  @property
  def hosts(self) -> int:
    return max(1, self.chips // self.chip.chips_per_host)

  @property
  def devices(self) -> int:
    return self.chips * self.chip.devices_per_chip

  @property
  def topology_name(self) -> str:
    return f"{self.chip.libtpu_name}:{'x'.join(map(str, self.shape))}"

  @property
  def chips_per_host_bounds(self) -> tuple[int, int, int]:
    if self.hosts == 1:
      return tuple(self.shape) + (1,) * (3 - len(self.shape))
    return (2, 4, 1) if self.chip.chips_per_host == 8 else (2, 2, 1)


def _shape_3d(chips: int) -> tuple[int, int, int] | None:
  if chips in _SMALL_3D:
    return _SMALL_3D[chips]
  if chips % 64:
    return None
  # The most cube-like a <= b <= c, each a multiple of 4 (Cloud's v4/v5p slice shapes).
  options = [(a, b, chips // (a * b)) for a in range(4, round(chips ** (1 / 3)) + 1, 4)
             for b in range(a, math.isqrt(chips // a) + 1, 4)
             if chips % (a * b) == 0 and chips // (a * b) % 4 == 0]
  return min(options, key=lambda s: s[2] / s[0]) if options else None


def _shape_2d(chips: int, generation: str) -> tuple[int, int] | None:
  if chips < 1 or chips & (chips - 1) or (generation == "v3" and chips in (1, 2, 8)) or chips == 2:
    return None
  a = 2 ** (int(math.log2(chips)) // 2)
  return (a, chips // a)


def parse(name: str) -> Slice:
  """`v4-32` -> Slice(v4, 2x2x4); one line naming the accepted forms for anything else."""
  match = re.fullmatch(r"(v3|v4|v5litepod|v5e|v5p|v6e)-(\d+)", name.strip().lower())
  usage = "use a Cloud TPU name: " + ", ".join(
      f"{g}-{1 if c.cores_per_name_unit == 1 else 8}..{g}-{c.max_chips * c.cores_per_name_unit}"
      for g, c in CHIPS.items())
  if not match:
    raise UserError(f"unknown TPU topology {name!r}; {usage}")
  generation = _ALIASES.get(match.group(1), match.group(1))
  chip, number = CHIPS[generation], int(match.group(2))
  chips = number // chip.cores_per_name_unit
  shape = None
  if number % chip.cores_per_name_unit == 0 and 0 < chips <= chip.max_chips:
    shape = _shape_3d(chips) if chip.torus_dims == 3 else _shape_2d(chips, generation)
  if shape is None:
    raise UserError(f"{name!r} is not a {generation} slice Cloud TPU offers; {usage}")
  return Slice(f"{generation}-{number}", chip, shape)


def compile_only_devices(tpu: Slice) -> list:
  """The slice's devices as libtpu describes them, for compiling without the hardware."""
  require("libtpu", "tpu", "compiling for a TPU slice")
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  # libtpu otherwise asks the GCE metadata server for these and prints warnings when there is none;
  # a machine-wide lock file would also keep two compiling processes from running at once. Set only
  # while libtpu reads them: left in os.environ they would make this process and its children look like
  # a TPU VM (training/distributed.py: on_tpu_vm).
  fake = {"TPU_ACCELERATOR_TYPE": tpu.name, "TPU_WORKER_HOSTNAMES": "localhost", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
  saved = {k: os.environ.get(k) for k in fake}
  os.environ.update({k: v for k, v in fake.items() if saved[k] is None})
  try:
    return list(topologies.get_topology_desc(
        platform="tpu", topology_name=tpu.topology_name, chip_config_name=tpu.chip.chip_config,
        chips_per_host_bounds=tpu.chips_per_host_bounds).devices)
  except Exception as e:  # a libtpu that does not match this jax fails here, in its own words
    import jax  # pylint: disable=import-outside-toplevel
    first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise UserError(f"libtpu could not describe {tpu.name} ({first_line}); install the libtpu matching jax "
                    f"{jax.__version__}: python3 -m pip install 'jax[tpu]=={jax.__version__}'") from None
  finally:
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)

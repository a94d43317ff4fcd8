"""The model, the train step, `info` and `benchmark` work where TensorFlow is not installed (GPU hosts)."""
import json
import os
import subprocess
import sys

from core_helpers import xla_flags

SCRIPT = """
import sys
sys.modules["tensorflow"] = None  # any `import tensorflow` now raises ImportError
from bert_jax.cli import main
assert main(["info", "--config", "configs/bert.py:base", "--json"]) == 0
assert main(["benchmark", "--config", "configs/bert.py:tiny", "--batch-size", "4", "--seq-length", "32",
             "--steps", "2", "--repeats", "1", "--json"]) == 0
assert "tensorflow" not in [m for m in sys.modules if sys.modules[m] is not None]
"""


def test_model_step_info_and_benchmark_without_tensorflow():
  env = dict(os.environ, XLA_FLAGS=xla_flags(1))
  out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  info, bench = [json.loads(line) for line in out.stdout.strip().splitlines()[-2:]]
  assert abs(info["num_params"] - 110e6) / 110e6 < 0.01
  assert bench["tokens_per_sec"] > 0 and 0 < bench["mfu"] < 1
  # FLOPs counted by hand for tiny (L2, H128, I512, V30522) at batch 4, seq 32, 5 predictions: the last
  # layer's q, output projection, FFN and attention rows at [CLS] and the 5 predictions only.
  tokens, h, i, v = 4 * 32, 128, 512, 30522
  forward = tokens * 2 * (8 * h * h + 4 * h * i + 4 * 32 * h) + 4 * (2 * h * h + 4 * h) + 4 * 5 * (2 * h * h + 2 * h * v)
  forward -= (tokens - 4 * 6) * (4 * h * h + 4 * h * i + 4 * 32 * h)
  assert bench["max_predictions"] == 5 and bench["model_flops_per_step"] == 3 * forward

"""Fine-tuning configs carry the shared `mesh` block (configs/common.py:mesh_config), mesh.shard_sequence
included: two fine-tuning steps with each row's tokens split over the tensor axis give the parameters of the
same steps on one data-parallel mesh."""
import jax
import numpy as np

from bert_jax.config_utils import load_config
from bert_jax.finetune import trainer
from bert_jax.training import partitioning
from core_helpers import slow


@slow  # three fine-tuning runs' compiles (about a minute on quiet cores)
def test_fine_tuning_with_the_sequence_sharded_equals_data_parallel(tmp_path):
  import test_finetune_e2e as e2e  # pylint: disable=import-outside-toplevel
  data = e2e._glue_dir(tmp_path / "data", lambda i, s, y: f"{s}\t{y}", ("0", "1"), ("sentence", "label"),
                       n_train=32, n_dev=16)
  params = []
  for i, mesh in enumerate((["--config.mesh.data=8"],
                            ["--config.mesh.data=4", "--config.mesh.tensor=2", "--config.mesh.shard_sequence=true"])):
    config = load_config("configs/glue.py:sst2", e2e.TINY + mesh + [
        f"--config.data.data_dir={data}", "--config.train.tensorboard=false", "--config.optimizer.warmup_ratio=0.0",
        "--config.optimizer.learning_rate=1e-3",
        "--config.model.hidden_dropout=0.0", "--config.model.attention_dropout=0.0", "--config.head.dropout=0.0"])
    assert dict(partitioning.rules(config.mesh))["length"] == ("tensor" if i else None)
    run = trainer.start(config, str(tmp_path / str(i)))
    run.advance(2)
    params.append(jax.device_get(run.state.params))
  moved = jax.tree.leaves(jax.tree.map(lambda a, b: np.abs(a - b).max(), params[0], params[1]))
  assert max(moved) < 2e-5
  start = jax.device_get(trainer.start(config, str(tmp_path / "fresh")).state.params)
  assert max(jax.tree.leaves(jax.tree.map(lambda a, b: np.abs(a - b).max(), start, params[1]))) > 1e-3

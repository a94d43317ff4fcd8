"""data.mask_rate_schedule (data_pipelines/masking.py: rates_at): the masking rate changes at a boundary step inside
one running input pipeline. Each row's masked count against the rate's budget counted by hand, the batches before
the boundary equal to a run without the schedule, and a run stopped before or after the boundary and resumed
giving the uninterrupted run's batches (the step is saved with the input position)."""
import numpy as np
import pytest

from bert_jax.data_pipelines import shards
from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.masking import MaskingConfig, rates_at
from bert_jax.data_pipelines.pipeline import make_pretrain_input
from test_data_pipeline import BATCH, _batches, _cfg, corpus  # noqa: F401  (the corpus fixture)

BOUNDARY = 3


def _scheduled(corpus):
  return _cfg(corpus, mask_rate=0.3, max_predictions_per_seq=0, mask_rate_schedule=((BOUNDARY, 0.05),))


def test_the_rate_changes_at_the_boundary_step(corpus):
  cfg = _scheduled(corpus)
  special = shards.make_tokenizer(cfg).special_mask()
  batches = _batches(cfg, BOUNDARY + 2)
  for step, batch in enumerate(batches):
    original = batch["input_ids"].copy()
    weights = batch["masked_lm_weights"] > 0
    rows = np.nonzero(weights)[0]
    original[rows, batch["masked_lm_positions"][weights]] = batch["masked_lm_ids"][weights]
    candidates = ((batch["input_mask"] > 0) & ~special[original]).sum(1)
    rate = 0.3 if step < BOUNDARY else 0.05
    want = np.maximum(1, np.round(rate * candidates)).astype(int)
    np.testing.assert_array_equal(weights.sum(1), want, err_msg=f"step {step}")
  plain = _batches(_cfg(corpus, mask_rate=0.3, max_predictions_per_seq=0), BOUNDARY + 1)
  for step in range(BOUNDARY + 1):
    same = all(np.array_equal(plain[step][k], batches[step][k]) for k in plain[step])
    assert same == (step < BOUNDARY), step


@pytest.mark.parametrize("stop", [BOUNDARY - 1, BOUNDARY + 1])
def test_resume_across_the_boundary_gives_the_same_batches(corpus, tmp_path, stop):
  cfg = _scheduled(corpus)
  reference = _batches(cfg, BOUNDARY + 3)
  first = make_pretrain_input(cfg, global_batch_size=BATCH, process_index=0, process_count=1)
  for _ in range(stop):
    next(first)
  first.save(str(tmp_path))
  resumed = make_pretrain_input(cfg, global_batch_size=BATCH, process_index=0, process_count=1)
  resumed.restore(str(tmp_path))
  for want in reference[stop:]:
    got = next(resumed)
    for k in want:
      assert np.array_equal(want[k], got[k]), k


def test_a_schedule_needs_masks_drawn_as_the_run_goes(corpus):
  with pytest.raises(DataError, match="needs data.masking_mode=dynamic"):
    make_pretrain_input(_cfg(corpus, mask_rate_schedule=((3, 0.1),), masking_mode="static"), global_batch_size=BATCH,
                        process_index=0, process_count=1)


def test_schedule_values():
  cfg = MaskingConfig("token", 0.15, 4, 4, np.zeros(10, bool), np.zeros(10, bool), schedule=((5, 0.1), (9, 0.05)))
  np.testing.assert_allclose(rates_at(cfg, np.array([0, 4, 5, 8, 9, 100])), [0.15, 0.15, 0.1, 0.1, 0.05, 0.05])
  for bad in (((5, 0.1), (5, 0.2)), ((0, 0.1),), ((3, 1.5),), (("x", 0.1),), ((3,),)):
    with pytest.raises(DataError, match="data.mask_rate_schedule"):
      MaskingConfig("token", 0.15, 4, 4, np.zeros(10, bool), np.zeros(10, bool), schedule=bad)

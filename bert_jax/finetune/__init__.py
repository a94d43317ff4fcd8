"""Fine-tuning: GLUE, SQuAD v1.1/v2.0, CoNLL-2003 NER and the embedded demo task.

  tasks/data:  glue.py, squad.py, ner.py, embedded.py   text -> features, outputs -> metrics/predictions
  model:       heads.py                                  the encoder plus one task head
  ranking:     ranking.py                                a pair task trained as MT-DNN's pairwise ranking
  training:    optim.py, init.py, trainer.py             optimizer tricks, init_from, the loop
  evaluation:  metrics.py                                official metric definitions
  sweeps:      sweep.py                                  grids with successive halving, seed statistics
"""
from bert_jax import startup
startup.configure()  # before jax loads (bert_jax/startup.py: libtpu stays quiet where there is no TPU)

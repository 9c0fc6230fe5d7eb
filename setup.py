"""Installs the `lm`, `kace` and `dpa_grpo` packages with a pinned, tested stack."""
import setuptools

INSTALL_REQUIRES = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "chex==0.1.92",
    "transformers==5.24.0",
    "tokenizers==0.23.3",
    "safetensors==0.8.0",
    "ml_collections==1.1.0",
    "absl-py==2.5.1",
    "numpy>=2.0,<3",
    "scipy>=1.13",
    "math-verify[antlr4_13_2]==0.9.0",
    "openai==3.57.0",
    "gepa==0.1.4",
    "tensorboardX==2.6.5",
    "matplotlib==3.11.2",
    "tqdm==4.70.1",
    "pyarrow==26.0.1",  # parquet copies of MATH / AIME (kace.data)
    "fastapi==0.165.0",  # lm.server (with starlette and pydantic)
    "starlette==1.10.0",
    "pydantic==2.14.4",
    "uvicorn==0.54.0",
]

EXTRAS = {
    # torch==2.13.0 is the CPU build: transformers parity tests and the PyTorch baselines.
    # filelock: xdist workers share one module fixture's run (tests/dpa_grpo/train_test.py).
    "test": [
        "pytest==9.2.0", "pytest-xdist==3.8.0", "hypothesis>=6.100", "torch==2.13.0", "ruff==0.17.6",
        "filelock==4.3.1",
    ],
    "gpu": ["jax[cuda12]==0.10.2"],
    "tpu": ["jax[tpu]==0.10.2"],
}

setuptools.setup(
    name="kace-dpa-grpo",
    version="0.1.0",
    description="KACE and DPA-GRPO reproduced on one JAX / Flax NNX stack.",
    python_requires=">=3.11",
    packages=setuptools.find_packages(include=["lm*", "kace*", "dpa_grpo*", "configs*", "launch*"]),
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
)

"""Installs the `lm`, `kace` and `dpa_grpo` packages: dependency ranges here, the tested set in
constraints.txt."""
import setuptools

# Ranges: any release in them is expected to work; the tested set is constraints.txt (exact versions,
# installed by scripts/setup_env.sh with `pip install -c constraints.txt`).
INSTALL_REQUIRES = [
    "jax>=0.10.2,<0.11",
    "jaxlib>=0.10.2,<0.11",
    "flax>=0.12.8,<0.13",
    "optax>=0.2.8,<0.3",
    "orbax-checkpoint>=0.12.8,<0.13",
    "chex>=0.1.92,<0.2",
    "transformers>=5.24,<6",
    "tokenizers>=0.23.3,<0.24",
    "safetensors>=0.8,<0.9",
    "ml_collections>=1.1,<2",
    "absl-py>=2.5,<3",
    "numpy>=2.0,<3",
    "scipy>=1.13",
    "math-verify[antlr4_13_2]>=0.9,<0.10",
    "openai>=3.57,<4",
    "gepa>=0.1.4,<0.2",
    "tensorboardX>=2.6.5,<3",  # training writes TensorBoard events (viewer: the tensorboard extra)
    "matplotlib>=3.11,<4",  # every report draws its figures
    "tqdm>=4.70,<5",
    "pyarrow>=26",  # parquet copies of MATH / AIME (kace.data)
    "fastapi>=0.165,<1",  # lm.server (with starlette and pydantic)
    "starlette>=1.10,<2",
    "pydantic>=2.14,<3",
    "uvicorn>=0.54,<1",
]

EXTRAS = {
    # torch is the CPU build (scripts/setup_env.sh installs it first): transformers parity tests and
    # the PyTorch baselines. filelock: xdist workers share one module fixture's run
    # (tests/dpa_grpo/train_test.py).
    "test": [
        "pytest>=9.2,<10", "pytest-xdist>=3.8,<4", "hypothesis>=6.100", "torch>=2.13,<3", "ruff==0.17.6",
        "filelock>=4.3,<5",
    ],
    # Accelerators: jax's own extras at jax's version (docs/multihost.md; launch/tpu_pod.sh installs
    # [tpu], launch/slurm_gpu.sbatch [cuda12]).
    "cuda12": ["jax[cuda12]>=0.10.2,<0.11"],
    "tpu": ["jax[tpu]>=0.10.2,<0.11"],
    # The TensorBoard viewer for the events training writes (`tensorboard --logdir=<workdir>`).
    "tensorboard": ["tensorboard>=2.18"],
}

# One console command per launcher (each module's `run()`); configs resolve from the package, so they
# work from any directory: `dpa-grpo --help`, `kace-eval --config=configs/kace.py:openai ...`.
ENTRY_POINTS = {
    "console_scripts": [
        "kace-dpa-main = launch.main:run",
        "dpa-grpo = launch.dpa_grpo:run",
        "dpa-testbed = launch.dpa_testbed:run",
        "dpa-theory = launch.theory:run",
        "kace-build = launch.kace_build:run",
        "kace-eval = launch.kace_eval:run",
        "kace-table = launch.kace_table:run",
        "kace-testbed = launch.kace_testbed:run",
        "kace-v3 = launch.kace_v3:run",
        "lm-plan = launch.plan:run",
        "lm-serve = launch.serve:run",
        "lm-sweep = launch.sweep:run",
    ]
}

setuptools.setup(
    name="kace-dpa-grpo",
    version="0.1.0",
    description="KACE and DPA-GRPO reproduced on one JAX / Flax NNX stack.",
    python_requires=">=3.11",
    packages=setuptools.find_packages(include=["lm*", "kace*", "dpa_grpo*", "configs*", "launch*"]),
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    entry_points=ENTRY_POINTS,
)

#!/usr/bin/env bash
# Builds the prototype kernel (libgemv.so) beside this script, with the project's .venv.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
include=$(../../.venv/bin/python -c "import jax.ffi; print(jax.ffi.include_dir())")
g++ -O3 -march=native -mprefer-vector-width=512 -fopenmp-simd -std=c++17 -shared -fPIC -pthread \
  -I"$include" gemv_ffi.cc -o libgemv.so

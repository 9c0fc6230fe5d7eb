#!/usr/bin/env bash
# Builds the AMX experiments for this CPU (needs amx_bf16 and amx_tile in /proc/cpuinfo's flags).
set -euo pipefail
cd "$(dirname "$0")"
for f in peak span gemm drain stores; do g++ -O2 -march=native -std=c++17 "$f.cc" -o "$f" -lpthread; done
echo "./peak; ./span BYTES PREFETCH [DIST]; ./gemm THREADS [KC NC MC]; ./drain M K N VARIANT [PF]; ./stores MODE"

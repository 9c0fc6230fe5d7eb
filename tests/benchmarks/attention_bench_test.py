"""benchmarks/attention_bench.py at tiny shapes: our blockwise attention and
`jax.nn.dot_product_attention` ("xla") agree on right-padded rows, forward and backward, so the
H200 comparison (docs/results/2026-12-04-device-check-h200.md) times the same function."""

from benchmarks import attention_bench


def test_ours_and_the_fused_reference_agree_on_right_padded_rows_and_both_are_timed():
  record = attention_bench.run(b=2, t=64, n=4, k=2, h=16, block=16, dtype="float32", trials=2)
  ours, sdpa = record["engines"]["ours"], record["engines"]["xla_sdpa"]
  assert "cudnn" not in record["engines"]  # a CPU offers no cuDNN kernel
  for name, diff in sdpa["max_abs_diff_from_ours"].items():
    assert diff < 1e-4, (name, diff)  # float32: the two compute the same attention
  assert len(ours["seconds"]) == len(sdpa["seconds"]) == 2 and min(ours["seconds"] + sdpa["seconds"]) > 0
  assert len(sdpa["ours_over_this"]) == 2

"""The error a testbed raises when a measured precondition (a gate) fails.

Both CPU testbeds (the KACE latent-convention testbed and the DPA-GRPO copy-and-check testbed)
measure their trained roles before any comparison and refuse to compare when a gate fails: a
comparison on roles that cannot show the mechanism would be read as evidence about it. One class
serves both, so a caller running either (the launchers, a main job) catches one error.
"""


class GateError(RuntimeError):
  """A testbed's trained roles fail a gate (the run dir's `gates.json` says which): no comparison is
  run on them; fix the testbed, never the gate."""

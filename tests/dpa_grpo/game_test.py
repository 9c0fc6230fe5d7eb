"""Replies, SAC parsing (never crashes), the 8-case classification over every branch, Wilson CIs."""

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpa_grpo import game


def test_rendered_replies_parse_back():
  sac = game.SAC("line 16 is too high", "the bracket table gives 4,019", "taxable income 38,000")
  for verdict in ("plausible", "suspicious", "wrong"):
    reply = game.parse_verifier_reply(game.render_verifier_reply(verdict, sac))
    assert (reply.action, reply.verdict, reply.sac, reply.valid) == (game.SAC_ACTION, verdict, sac, True)
  reply = game.parse_verifier_reply(game.render_verifier_reply("correct"))
  assert (reply.action, reply.sac, reply.valid) == (game.NS, None, True)
  for action in (game.KEEP, game.REVISE):
    decision = game.parse_decision(game.render_decision(action))
    assert (decision.action, decision.valid) == (action, True)


def test_canonical_pair_strings_are_prefixes_of_replies():
  sac = game.SAC("c", "a", "e")
  assert game.render_verifier_reply("correct") == game.VERIFIER_PAIR[game.NS]
  assert game.render_verifier_reply("wrong", sac).startswith(game.VERIFIER_PAIR[game.SAC_ACTION] + "\n")
  assert game.GENERATOR_PAIR == ('{"decision": "KEEP"}', '{"decision": "REVISE"}')


@pytest.mark.parametrize(
  "text, action, valid, error",
  [
    ("", game.SAC_ACTION, False, "no JSON object with a verdict"),
    ("looks fine to me", game.SAC_ACTION, False, "no JSON object with a verdict"),
    ('{"verdict": "maybe"}', game.SAC_ACTION, False, "unknown verdict 'maybe'"),
    ('{"verdict": "wrong"}', game.SAC_ACTION, False, "SAC lacks claim, argument, evidence"),
    ('{"verdict": "Wrong", "claim": "x", "argument": "y"}', game.SAC_ACTION, False, "SAC lacks evidence"),
    ('<think>{"verdict": "wrong"}</think>{"verdict": "CORRECT"}', game.NS, True, ""),
    ('{"verdict": "suspicious", "claim": "a", "argument": "b", "evidence": "c"}', game.SAC_ACTION, True, ""),
  ],
)
def test_verifier_reply_edge_cases(text, action, valid, error):
  reply = game.parse_verifier_reply(text)
  assert (reply.action, reply.valid, reply.error) == (action, valid, error)
  assert reply.text == text


def test_invalid_replies_play_the_configured_fallback():
  assert game.parse_verifier_reply("???", invalid_action=game.NS).action == game.NS
  assert game.parse_verifier_reply("???", invalid_action=game.NS).sac is None
  assert game.parse_decision("keep it", invalid_action=game.REVISE).action == game.REVISE
  assert game.parse_decision('{"decision": "maybe"}').error == "unknown decision 'MAYBE'"
  assert game.parse_decision('{"decision": "keep"} then {"decision": "revise"}').action == game.REVISE


_json_values = st.recursive(
  st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
  lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
  max_leaves=8,
)


@settings(max_examples=150, deadline=None)
@given(
  st.one_of(
    st.text(max_size=200),
    _json_values.map(lambda v: json.dumps(v)),
    st.dictionaries(
      st.sampled_from(["verdict", "claim", "argument", "evidence", "Verdict"]), _json_values
    ).map(json.dumps),
    st.integers(),
    st.none(),
  )
)
def test_parsers_never_raise(text):
  reply = game.parse_verifier_reply(text)
  assert reply.action in (game.NS, game.SAC_ACTION)
  assert reply.valid == (reply.error == "")
  assert reply.action == game.SAC_ACTION or reply.sac is None
  decision = game.parse_decision(text)
  assert decision.action in (game.KEEP, game.REVISE)
  assert decision.valid == (decision.error == "")


def test_classification_covers_every_branch():
  expected = {
    (True, game.NS, None, None): "1",
    (True, game.SAC_ACTION, game.REVISE, None): "2",
    (True, game.SAC_ACTION, game.KEEP, None): "3",
    (False, game.NS, None, None): "4",
    (False, game.SAC_ACTION, game.REVISE, True): "5a",
    (False, game.SAC_ACTION, game.REVISE, False): "5b",
    (False, game.SAC_ACTION, game.KEEP, False): "6a",
    (False, game.SAC_ACTION, game.KEEP, True): "6b",
  }
  for args, case in expected.items():
    assert game.classify_case(*args) == case
  # Cases 1-4 do not depend on z; every playable combination lands in exactly one case.
  seen = set()
  for x, v, g, z in itertools.product((True, False), (0, 1), (None, 0, 1), (None, True, False)):
    playable = (v == game.NS) == (g is None) and not (v == game.SAC_ACTION and not x and z is None)
    if playable:
      seen.add(game.classify_case(x, v, g, z))
    else:
      with pytest.raises(ValueError):
        game.classify_case(x, v, g, z)
  assert seen == set(game.CASES)
  with pytest.raises(ValueError):
    game.classify_case(True, 2, None, None)


def test_submitted_output():
  assert game.submitted_right(True, game.NS, None, None)
  assert not game.submitted_right(True, game.SAC_ACTION, game.REVISE, False)  # case 2 with a bad z
  assert game.submitted_right(False, game.SAC_ACTION, game.REVISE, True)  # 5a
  assert not game.submitted_right(False, game.SAC_ACTION, game.KEEP, True)  # 6b: the missed fix


def test_case_table():
  table = game.case_table(["1", "1", "4", "5a"])
  assert table["1"]["count"] == 2 and table["1"]["rate"] == 0.5 and table["6b"]["count"] == 0
  assert sum(row["rate"] for row in table.values()) == pytest.approx(1.0)
  with pytest.raises(ValueError, match="unknown cases"):
    game.case_table(["7"])

"""The format reading's two parts on hand-made replies: where a reply leaves the verifier's schema,
and which segment each token of a well-formed reply belongs to."""

import json

import pytest

from dpa_grpo import format_reading, game
from lm import tokenizer as tokenizer_lib

SAC = game.SAC("the amount differs", "the field says otherwise", "W-2 box 1: 4016")


@pytest.mark.parametrize(
  "text, where",
  [
    (game.render_verifier_reply("correct"), "none"),
    (game.render_verifier_reply("wrong", SAC), "none"),
    ('{"verdit": "wrong"}', "prefix"),
    ("", "prefix"),
    ('{"verdict": "maybe"}', "verdict"),
    ('{"verdict": "wrong"', "closing"),
    ('{"verdict": "correct"} and more', "end_of_turn"),
    ('{"verdict": "wrong"}\n{"claim": "x", "argument": "', "sac_body"),
    ('{"verdict": "wrong"}\n' + json.dumps({"claim": "x", "argument": "y", "evidence": ""}), "sac_body"),
  ],
)
def test_departure_names_the_first_segment_left(text, where):
  assert format_reading.departure(text) == where
  # A reply that follows the whole schema parses, and one that leaves it before the end does not.
  assert game.parse_verifier_reply(text).valid == (where in ("none", "end_of_turn"))


def test_departures_count_per_fifth_of_the_steps():
  records = [
    {"step": s, "verifier_valid": v, "verifier": {"text": t}}
    for s, v, t in [(1, True, ""), (2, False, '{"verdict": "x"}'), (10, False, "nonsense"), (10, True, "")]
  ]
  rows = format_reading.departures(records, steps=10)
  assert [r["verdicts"] for r in rows] == [2, 0, 0, 0, 2]
  assert rows[0]["invalid"] == 1 and rows[0]["verdict"] == 1 and rows[4]["prefix"] == 1


def test_segment_ids_split_a_reply_by_schema_part(tmp_path):
  reply = game.render_verifier_reply("wrong", SAC)
  path = tokenizer_lib.train_bpe_tokenizer(tmp_path, [reply] * 3, vocab_size=300)
  tok = tokenizer_lib.load_tokenizer(path)
  ids, segs = format_reading.segment_ids(tok, reply)
  assert len(ids) == len(segs) and ids[-1] == tok.eos_ids[0]
  names = [format_reading.SEGMENTS[s] for s in segs]
  assert (
    names[0] == "prefix"
    and names[-1] == "end_of_turn"
    and names == sorted(names, key=format_reading.SEGMENTS.index)
  )
  assert set(names) == set(format_reading.SEGMENTS)
  text = {
    s: tok.decode([i for i, n in zip(ids, names, strict=True) if n == s]) for s in ("verdict", "closing")
  }
  assert text["verdict"].startswith("wrong") and text["closing"].startswith('"}')

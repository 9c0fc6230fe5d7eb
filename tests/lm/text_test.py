import pytest

from lm import text


@pytest.mark.parametrize(
  "reply, final",
  [
    ("plain answer 5", "plain answer 5"),
    ("<think>maybe 4</think>It is 5", "It is 5"),
    ("reasoning only, the template opened the tag</think> 5", " 5"),
    ("<think>a</think>b<think>c</think>d", "d"),
    ("<think>cut off while thinking 4", ""),
    (None, ""),
  ],
)
def test_after_think(reply, final):
  assert text.after_think(reply) == final


def test_json_objects_and_the_one_a_role_asked_for():
  reply = 'x {"a": 1} y {"b": {"c": 2}} {bad} [1]'
  assert text.json_objects(reply) == [{"a": 1}, {"b": {"c": 2}}]
  assert text.json_object('<think>{"draft": 1}</think>```json\n{"final": 2}\n``` {"after": 3}') == {
    "final": 2
  }
  assert text.json_object("no object here") is None
  assert text.json_object("[" * 100_000) is None  # deep nesting is no object, not a crash


def test_user_chat():
  assert text.user_chat("hi") == [{"role": "user", "content": "hi"}]

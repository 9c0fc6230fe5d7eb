"""TaxCalcBench TY24: cases, gold lines, scoring, answer parsing and per-line prompts.

TaxCalcBench (column-tax/tax-calc-bench, MIT) ships each tax-year-2024 case as
`tax_calc_bench/ty24/test_data/<case>/input.json` (the taxpayer's forms) and `output.xml` (the
expected IRS MeF e-file return). The benchmark scores 19 Form 1040 lines, read from the XML by
XPath; a return is correct only if all 19 are. DPA-GRPO treats each of those lines as one decision
unit, so this module also renders one prompt per line (carrying the lines already drafted) and
parses one answer per line. The synthetic generator (`dpa_grpo.envs.forms`) writes the same layout,
so everything here serves both. See docs/taxcalc.md for the formats and the choices made where the
benchmark is silent.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import random
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from typing import Any

from lm import text as text_lib

IRS_NAMESPACE = "http://www.irs.gov/efile"
STRICT_TOLERANCE = 0.0
LENIENT_TOLERANCE = 5.0  # dollars; the benchmark's lenient rule is |pred - gold| <= 5
TAX_YEAR = 2024


@dataclasses.dataclass(frozen=True)
class Line:
  """One scored Form 1040 line: its id on the form, its MeF element and the benchmark's wording."""

  id: str
  element: str
  description: str

  @property
  def xpath(self) -> str:
    return f"/Return/ReturnData/IRS1040/{self.element}"

  @property
  def label(self) -> str:
    """`Line 16: Tax`: how the benchmark names the line in prompts and answers."""
    return f"Line {self.id}: {self.description}"


# The 19 scored lines in the benchmark's fixed order (tax_return_evaluator.py's table). The order
# is also the DPA-GRPO drafting order: every line's inputs come before it.
LINES: tuple[Line, ...] = (
  Line("1a", "WagesAmt", "Total amount from Form(s) W-2, box 1"),
  Line("9", "TotalIncomeAmt", "Add lines 1z, 2b, 3b, 4b, 5b, 6b, 7, and 8. This is your total income"),
  Line("10", "TotalAdjustmentsAmt", "Adjustments to income from Schedule 1, line 26"),
  Line("11", "AdjustedGrossIncomeAmt", "Subtract line 10 from line 9. This is your adjusted gross income"),
  Line("12", "TotalItemizedOrStandardDedAmt", "Standard deduction or itemized deductions (from Schedule A)"),
  Line(
    "15",
    "TaxableIncomeAmt",
    "Subtract line 14 from line 11. If zero or less, enter -0-. This is your taxable income",
  ),
  Line("16", "TaxAmt", "Tax"),
  Line("19", "CTCODCAmt", "Child tax credit or credit for other dependents from Schedule 8812"),
  Line("24", "TotalTaxAmt", "Add lines 22 and 23. This is your total tax"),
  Line("25d", "WithholdingTaxAmt", "Add lines 25a through 25c"),
  Line("26", "EstimatedTaxPaymentsAmt", "2024 estimated tax payments and amount applied from 2023 return"),
  Line("27", "EarnedIncomeCreditAmt", "Earned income credit (EIC)"),
  Line("28", "AdditionalChildTaxCreditAmt", "Additional child tax credit from Schedule 8812"),
  Line("29", "RefundableAmerOppCreditAmt", "American opportunity credit from Form 8863, line 8"),
  Line(
    "32",
    "RefundableCreditsAmt",
    "Add lines 27, 28, 29, and 31. These are your total other payments and refundable credits",
  ),
  Line("33", "TotalPaymentsAmt", "Add lines 25d, 26, and 32. These are your total payments"),
  Line(
    "34",
    "OverpaidAmt",
    "If line 33 is more than line 24, subtract line 24 from line 33. This is the amount you overpaid",
  ),
  Line("35a", "RefundAmt", "Amount of line 34 you want refunded to you."),
  Line("37", "OwedAmt", "Subtract line 33 from line 24. This is the amount you owe"),
)
LINE_IDS: tuple[str, ...] = tuple(line.id for line in LINES)
_BY_ID = {line.id: line for line in LINES}


def line_by_id(line_id: str) -> Line:
  """The scored line with this id; the error lists the valid ids."""
  try:
    return _BY_ID[line_id]
  except KeyError:
    raise KeyError(f"unknown Form 1040 line {line_id!r}; scored lines are {', '.join(LINE_IDS)}") from None


# ----------------------------------------------------------------------------------------------
# Cases


@dataclasses.dataclass(frozen=True)
class TaxCase:
  """One return: the taxpayer's input forms and the gold amount of every scored line.

  `forms` is input.json with any outer `"input"` wrapper removed, kept as the benchmark gives it:
  prompts show it verbatim. `gold` maps every id in `LINE_IDS` to a float (absent elements are 0.0).
  """

  case_id: str
  forms: dict[str, Any]
  gold: dict[str, float]


def parse_input_json(text: str, source: str) -> dict[str, Any]:
  """The input forms of one case; `source` names the file in errors.

  Some copies of the benchmark wrap the forms in `{"input": {...}}`; the wrapper is removed
  whenever an `"input"` key holds an object, so both layouts give the same forms.
  """
  try:
    data = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"{source}: not valid JSON ({e})") from None
  if not isinstance(data, dict):
    raise ValueError(f"{source}: expected a JSON object of forms, got {type(data).__name__}")
  inner = data.get("input")
  if isinstance(inner, dict):
    return inner
  if "input" in data:
    raise ValueError(f"{source}: field 'input' must be an object, got {type(inner).__name__}")
  return data


def parse_gold_xml(text: str, source: str) -> dict[str, float]:
  """Gold amounts of the 19 scored lines from MeF XML; `source` names the file in errors.

  Elements are matched by local name along each line's XPath, so the file reads the same with the
  IRS default namespace (as MeF writes it) or without one. As in the benchmark, the first matching
  element counts, and a missing or empty element reads 0.0. Text that is not a number is an error
  here (the benchmark would silently read 0.0): a broken gold file should not score quietly.
  """
  try:
    root = ET.fromstring(text)
  except ET.ParseError as e:
    raise ValueError(f"{source}: not well-formed XML ({e})") from None
  return {line.id: _read_amount(root, line, source) for line in LINES}


def _local(tag: str) -> str:
  return tag.rsplit("}", 1)[-1]


def _find_path(root: ET.Element, xpath: str) -> ET.Element | None:
  """First element along an absolute XPath of plain names, ignoring namespaces."""
  first, *rest = xpath.strip("/").split("/")
  if _local(root.tag) != first:
    return None
  node = root
  for name in rest:
    node = next((child for child in node if _local(child.tag) == name), None)
    if node is None:
      return None
  return node


def _read_amount(root: ET.Element, line: Line, source: str) -> float:
  node = _find_path(root, line.xpath)
  if node is None or not (node.text or "").strip():
    return 0.0
  try:
    value = float(node.text)
  except ValueError:
    raise ValueError(f"{source}: {line.element} (line {line.id}) is not a number: {node.text!r}") from None
  if not math.isfinite(value):
    raise ValueError(f"{source}: {line.element} (line {line.id}) is not finite: {node.text!r}")
  return value


def case_from_texts(case_id: str, input_text: str, xml_text: str, source: str | None = None) -> TaxCase:
  """A case from the texts of its two files (the loader and the synthetic generator share this)."""
  where = source or case_id
  return TaxCase(
    case_id=case_id,
    forms=parse_input_json(input_text, f"{where}/input.json"),
    gold=parse_gold_xml(xml_text, f"{where}/output.xml"),
  )


def load_case(case_dir: str | os.PathLike) -> TaxCase:
  """Loads `<case_dir>/input.json` and `<case_dir>/output.xml`; the case id is the folder name."""
  case_dir = os.fspath(case_dir)
  texts = []
  for name in ("input.json", "output.xml"):
    path = os.path.join(case_dir, name)
    if not os.path.isfile(path):
      raise FileNotFoundError(f"case {os.path.basename(case_dir)!r}: missing {path}")
    with open(path, encoding="utf-8") as f:
      texts.append(f.read())
  return case_from_texts(os.path.basename(os.path.normpath(case_dir)), *texts, source=case_dir)


def load_cases(root: str | os.PathLike) -> list[TaxCase]:
  """All cases under `root` (e.g. `tax_calc_bench/ty24/test_data`), sorted by case id.

  Every non-hidden sub-folder is a case; one without its two files is an error, not a silent skip,
  so a half-copied benchmark cannot shrink the test set unnoticed.
  """
  root = os.fspath(root)
  if not os.path.isdir(root):
    raise FileNotFoundError(f"TaxCalcBench case root {root!r} is not a directory")
  names = sorted(
    n for n in os.listdir(root) if not n.startswith(".") and os.path.isdir(os.path.join(root, n))
  )
  if not names:
    raise ValueError(f"no case folders under {root!r} (expected <case>/input.json and <case>/output.xml)")
  return [load_case(os.path.join(root, name)) for name in names]


def split_cases(
  cases: Sequence[TaxCase], test_fraction: float = 0.2, seed: int = 42
) -> tuple[list[TaxCase], list[TaxCase]]:
  """Deterministic (train, test) split, each sorted by case id.

  Case ids are sorted, shuffled with `random.Random(seed)`, and the first
  `max(1, round(test_fraction * n))` form the test split (10 of the benchmark's 51 cases). The
  result depends only on the set of ids and the seed, not on the order cases were loaded in.
  """
  if not 0.0 < test_fraction < 1.0:
    raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
  if len(cases) < 2:
    raise ValueError(f"need at least 2 cases to split, got {len(cases)}")
  ids = sorted(c.case_id for c in cases)
  if len(set(ids)) != len(ids):
    raise ValueError("duplicate case ids; cannot split deterministically")
  random.Random(seed).shuffle(ids)
  n_test = min(len(ids) - 1, max(1, round(test_fraction * len(ids))))
  test_ids = set(ids[:n_test])
  ordered = sorted(cases, key=lambda c: c.case_id)
  return [c for c in ordered if c.case_id not in test_ids], [c for c in ordered if c.case_id in test_ids]


# ----------------------------------------------------------------------------------------------
# Answers


@dataclasses.dataclass(frozen=True)
class ParsedAmount:
  """A model's amount for one line; `value` is None when the answer could not be parsed."""

  value: float | None
  raw: str = ""

  @property
  def parsed(self) -> bool:
    return self.value is not None


def unparsed(raw: str = "") -> ParsedAmount:
  return ParsedAmount(None, raw[:200])


_NUMBER = re.compile(r"[-+]?(\d{1,3}(,\d{3})+|\d+)(\.\d+)?")
_ZERO_WORDS = {"", "-", "-0-", "—", "–", "none", "nil"}
_DECORATION = str.maketrans("", "", "*`_$ \t")


def parse_amount(text: str) -> ParsedAmount:
  """Parses one amount field: `$1,234.00`, `(1,234)` (negative), `-1234`, blank or `-0-` (zero).

  Anything else (words, two numbers, `nan`) is unparsed: guessing which number was meant would
  reward answers that do not follow the format.
  """
  s = text.strip().rstrip(".").strip()
  if s.upper().endswith("USD"):
    s = s[:-3]
  s = s.translate(_DECORATION)
  negative = False
  if s.startswith("(") and s.endswith(")"):
    negative, s = True, s[1:-1]
  if s.lower() in _ZERO_WORDS:
    return ParsedAmount(0.0, text)
  if not _NUMBER.fullmatch(s):
    return unparsed(text)
  value = float(s.replace(",", ""))
  if not math.isfinite(value):
    return unparsed(text)
  return ParsedAmount(-value if negative else value, text)


@functools.cache
def _line_pattern(line_id: str) -> re.Pattern[str]:
  # `Line 16:` at the start of a line, allowing markdown (`**Line 16:**`, `- Line 16:`), and never
  # matching `Line 1` inside `Line 1a` or `Line 16` inside `Line 16b`.
  return re.compile(
    rf"^[\s>*_#`\-]*line\s+{re.escape(line_id)}(?![0-9a-z])[\s*_`]*:(?P<rest>.*)$", re.I | re.M
  )


def _from_line_format(text: str, line_id: str) -> ParsedAmount | None:
  """The amount after the last `|` of the last `Line N: ... | ... | amount` for this line."""
  matches = [m.group("rest") for m in _line_pattern(line_id).finditer(text) if "|" in m.group("rest")]
  if not matches:
    return None
  return parse_amount(matches[-1].rsplit("|", 1)[1])


def _line_ref(ref: Any) -> str:
  """`"Line 16"`, `"line_16"`, `"16"` and `16` all name line `16`."""
  ref = str(ref).strip().lower().replace("_", " ")
  return ref[4:].strip(" :") if ref.startswith("line") else ref


def _json_amount(value: Any) -> ParsedAmount:
  if isinstance(value, str):
    return parse_amount(value)
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return unparsed(str(value))
  try:
    amount = float(value)
  except OverflowError:
    return unparsed(str(value)[:200])
  return ParsedAmount(amount, str(value)) if math.isfinite(amount) else unparsed(str(value))


def _from_json(text: str, line_id: str) -> ParsedAmount | None:
  """From `{"line": "16", "amount": 4016}` or a return object `{"16": 4016, ...}`; last one wins."""
  for obj in reversed(text_lib.json_objects(text)):
    fields = {str(k).strip().lower(): v for k, v in obj.items()}
    if "amount" in fields and _line_ref(fields.get("line", line_id)) == line_id:
      return _json_amount(fields["amount"])
    by_line = {_line_ref(k): v for k, v in obj.items()}
    if line_id in by_line:
      return _json_amount(by_line[line_id])
  return None


LENGTH = "length"  # the finish reason of a reply cut off by max_tokens


def complete_part(text: str, finish_reason: str | None = None) -> str:
  """What of a reply can hold answers: all of it when it stopped, and when it was cut off by
  max_tokens (`finish_reason == "length"`) only its complete lines — the last, unfinished line is
  dropped, as `Line 16: Tax | ... | 40` cut from `4016` is not the model's amount. (An unclosed
  `<think>` already gives no final part, `lm.text.after_think`; a cut JSON object does not parse.)"""
  if finish_reason != LENGTH:
    return text
  return text[: text.rfind("\n") + 1]


def parse_line_answer(text: str, line_id: str, finish_reason: str | None = None) -> ParsedAmount:
  """The model's amount for one line, from either answer format; never raises on model output.

  The benchmark format (`Line 16: Tax | explanation | 4016`) is tried first, then JSON. Closed
  `<think>` blocks are ignored, and when the line is answered several times the last answer counts
  (models restate and then correct). No answer for the line gives an unparsed marker. A reply cut
  off by max_tokens (`finish_reason="length"`) answers only in its complete lines (`complete_part`);
  no number is ever read outside the two formats.
  """
  line_by_id(line_id)
  text = text_lib.after_think(complete_part(text, finish_reason))
  for parse in (_from_line_format, _from_json):
    found = parse(text, line_id)
    if found is not None:
      return found
  return unparsed(text)


def parse_return(text: str, finish_reason: str | None = None) -> dict[str, ParsedAmount]:
  """All 19 lines from one whole-return answer (the benchmark's single-shot output); a reply cut
  off by max_tokens answers only in its complete lines (`parse_line_answer`)."""
  return {line_id: parse_line_answer(text, line_id, finish_reason) for line_id in LINE_IDS}


def format_amount(amount: float) -> str:
  """Whole dollars as digits (`4016`), cents only when present (`4016.5`)."""
  return str(int(amount)) if float(amount).is_integer() else repr(float(amount))


def render_line_answer(
  line_id: str, amount: float, explanation: str = "", answer_format: str = "line", compact: bool = False
) -> str:
  """An answer in the documented format, as the parser reads it (for warm starts and tests).

  `compact` drops the line's description (`Line 16: <explanation> | 4016`), which the parser
  reads the same way.
  """
  line = line_by_id(line_id)
  if answer_format == "line":
    why = " ".join(explanation.replace("|", "/").split())
    head = f"Line {line.id}:" if compact else f"{line.label} |"
    return f"{head} {why} | {format_amount(amount)}"
  if answer_format == "json":
    return json.dumps({"line": line.id, "explanation": explanation, "amount": amount}, ensure_ascii=False)
  raise ValueError(f"answer_format must be 'line' or 'json', got {answer_format!r}")


# ----------------------------------------------------------------------------------------------
# Prompts


_FORMAT_INSTRUCTIONS = {
  "line": (
    "Answer with exactly one line in this format:\n{label} | <brief explanation> | <amount>\n"
    "The amount is in whole dollars, digits only (no $ sign, no commas); write 0 if the line does "
    "not apply."
  ),
  "json": (
    'Answer with one JSON object: {{"line": "{id}", "explanation": "<brief explanation>", '
    '"amount": <amount>}}\nThe amount is a number in whole dollars; 0 if the line does not apply.'
  ),
}


_COMPACT_ANSWER = {
  "line": "Line {id}: <why> | <amount>",
  "json": '{{"line": "{id}", "explanation": "<why>", "amount": <amount>}}',
}


def render_drafted(drafted: Mapping[str, float | None]) -> str:
  """The lines drafted so far, in form order; None (an unparsed draft) shows as `unparsed`."""
  for line_id in drafted:
    line_by_id(line_id)
  rows = [
    f"{line.label} | {'unparsed' if drafted[line.id] is None else format_amount(drafted[line.id])}"
    for line in LINES
    if line.id in drafted
  ]
  return "\n".join(rows) if rows else "(none yet)"


def line_prompt(
  case: TaxCase,
  line_id: str,
  drafted: Mapping[str, float | None],
  answer_format: str = "line",
  compact: bool = False,
) -> str:
  """The prompt for one decision unit: the taxpayer's input, the drafted lines, one line to fill.

  The input is shown as compact JSON, as the benchmark's own prompt shows input.json. `compact`
  is the short style of CPU-scale runs (a tiny model's cost is quadratic in prompt length): the
  same facts with line numbers instead of descriptions and one-line instructions.
  """
  line = line_by_id(line_id)
  if answer_format not in _FORMAT_INSTRUCTIONS:
    raise ValueError(f"answer_format must be one of {sorted(_FORMAT_INSTRUCTIONS)}, got {answer_format!r}")
  if compact:
    done = ", ".join(f"{k}={'unparsed' if v is None else format_amount(v)}" for k, v in drafted.items())
    answer = _COMPACT_ANSWER[answer_format].format(id=line.id)
    return (
      f"Form 1040 {TAX_YEAR}. Input: {json.dumps(case.forms, ensure_ascii=False)}\n"
      f"Lines: {done or 'none'}\nCompute line {line.id}. Answer: {answer}"
    )
  instructions = _FORMAT_INSTRUCTIONS[answer_format].format(label=line.label, id=line.id)
  return (
    f"You are preparing a federal Form 1040 for tax year {TAX_YEAR}, one line at a time.\n\n"
    f"Taxpayer input (JSON):\n{json.dumps(case.forms, ensure_ascii=False)}\n\n"
    f"Lines already drafted:\n{render_drafted(drafted)}\n\n"
    f"Now compute {line.label}.\n{instructions}"
  )


# ----------------------------------------------------------------------------------------------
# Scoring


def line_correct(
  predicted: ParsedAmount | float | None, gold: float, tolerance: float = STRICT_TOLERANCE
) -> bool:
  """The benchmark's per-line rule: |pred - gold| <= tolerance (0 strict, 5 lenient); unparsed fails."""
  value = predicted.value if isinstance(predicted, ParsedAmount) else predicted
  return value is not None and abs(value - gold) <= tolerance


@dataclasses.dataclass(frozen=True)
class ReturnScore:
  """One return scored line by line; a return is correct only if all 19 lines are."""

  case_id: str
  strict: dict[str, bool]
  lenient: dict[str, bool]
  unparsed: tuple[str, ...]
  finish_reason: str = ""  # the scored reply's: "stop", "length" (cut off by max_tokens); "" unknown

  @property
  def strictly_correct(self) -> bool:
    return all(self.strict.values())

  @property
  def leniently_correct(self) -> bool:
    return all(self.lenient.values())


def score_return(
  case: TaxCase,
  predicted: Mapping[str, ParsedAmount | float | None],
  unparsed_reads_zero: bool = False,
  finish_reason: str = "",
) -> ReturnScore:
  """Scores predicted amounts (missing lines are unparsed) against the case's gold; `finish_reason`
  (of the reply they were parsed from) is recorded in the score.

  `unparsed_reads_zero=True` reads a missing or unparsed line as 0.0, mirroring how the gold side
  treats a missing XML element; the default counts it wrong, so a model cannot score on zero lines
  by not answering. Which of the two the benchmark's own grader does is not known here.
  """
  values = {}
  for line_id in LINE_IDS:
    p = predicted.get(line_id)
    values[line_id] = p.value if isinstance(p, ParsedAmount) else p
  missing = tuple(i for i in LINE_IDS if values[i] is None)
  if unparsed_reads_zero:
    values = {i: 0.0 if v is None else v for i, v in values.items()}
  return ReturnScore(
    case_id=case.case_id,
    strict={i: line_correct(values[i], case.gold[i], STRICT_TOLERANCE) for i in LINE_IDS},
    lenient={i: line_correct(values[i], case.gold[i], LENIENT_TOLERANCE) for i in LINE_IDS},
    unparsed=missing,
    finish_reason=finish_reason,
  )


def score_reply(
  case: TaxCase, reply: str, finish_reason: str = "", unparsed_reads_zero: bool = False
) -> ReturnScore:
  """One whole-return reply scored: parsed by `parse_return` (a reply cut off by max_tokens answers
  only in its complete lines) and scored by `score_return`, its finish reason recorded."""
  return score_return(case, parse_return(reply, finish_reason), unparsed_reads_zero, finish_reason)


@dataclasses.dataclass(frozen=True)
class Metrics:
  """The benchmark's metrics over returns, plus per-line accuracy and the unparsed count."""

  n_returns: int
  correct_returns_strict: float
  correct_returns_lenient: float
  correct_by_line_strict: float
  correct_by_line_lenient: float
  per_line_strict: dict[str, float]
  per_line_lenient: dict[str, float]
  unparsed_lines: int


def summarize(scores: Sequence[ReturnScore]) -> Metrics:
  """Aggregates scored returns (one run); average Metrics over runs for the benchmark's pass@1."""
  if not scores:
    raise ValueError("no scored returns to summarize")
  n = len(scores)
  per_strict = {i: sum(s.strict[i] for s in scores) / n for i in LINE_IDS}
  per_lenient = {i: sum(s.lenient[i] for s in scores) / n for i in LINE_IDS}
  return Metrics(
    n_returns=n,
    correct_returns_strict=sum(s.strictly_correct for s in scores) / n,
    correct_returns_lenient=sum(s.leniently_correct for s in scores) / n,
    correct_by_line_strict=sum(per_strict.values()) / len(LINE_IDS),
    correct_by_line_lenient=sum(per_lenient.values()) / len(LINE_IDS),
    per_line_strict=per_strict,
    per_line_lenient=per_lenient,
    unparsed_lines=sum(len(s.unparsed) for s in scores),
  )

"""Synthetic TY24-style Form 1040 cases: a small rule engine and a seeded case generator.

The real benchmark has 51 cases, far too few for CPU-scale RL. This module draws households from a
stated subset of the 2024 Form 1040, computes every line by the IRS rules for that subset, and
writes each case in TaxCalcBench's own layout (`<case>/input.json` + MeF `output.xml`), so
`dpa_grpo.envs.taxcalc` loads and scores synthetic and real cases the same way.

The subset (docs/taxcalc.md has the full statement):
  * filing statuses single, married filing jointly, head of household, qualifying surviving spouse;
  * W-2 box 1 wages and box 2 withholding; 1099-INT box 1 interest and 1099-DIV box 1a ordinary
    dividends, with box 4 withholding; no qualified dividends (box 1b is always 0), so line 16 is
    the regular tax and no capital-gain worksheet is needed;
  * the 2024 standard deduction with the 65-or-older and blind additions; no adjustments (line 10);
  * line 16 from the Tax Table (taxable income under $100,000: tax on the midpoint of the $25/$50
    row) or the Tax Computation Worksheet (the bracket formula) at $100,000 and above;
  * child tax credit for qualifying children under 17 (Schedule 8812, $2,000 each, phase-out,
    limited by tax) and the additional child tax credit ($1,700 each, 15% of earned income over
    $2,500);
  * estimated payments, total payments, overpayment refunded in full, amount owed.
Households outside it raise `UnsupportedReturn`; the generator rejects and redraws them, which is
how EIC, Additional Medicare Tax and the net investment income tax stay exactly 0 in every case.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import math
import os
import random
import xml.etree.ElementTree as ET
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from dpa_grpo.envs import taxcalc
from lm import rundir


class FilingStatus(enum.StrEnum):
  SINGLE = "single"
  MARRIED_FILING_JOINTLY = "married_filing_jointly"
  HEAD_OF_HOUSEHOLD = "head_of_household"
  QUALIFYING_SURVIVING_SPOUSE = "qualifying_surviving_spouse"


_S, _MFJ, _HOH, _QSS = FilingStatus  # QSS shares MFJ's brackets and deduction, not its thresholds

# 2024 figures (Rev. Proc. 2023-34, Schedule 8812, Pub. 596).
STANDARD_DEDUCTION = {_S: 14_600, _MFJ: 29_200, _HOH: 21_900, _QSS: 29_200}
ADDITIONAL_DEDUCTION = {_S: 1_950, _MFJ: 1_550, _HOH: 1_950, _QSS: 1_550}  # per box: 65+ or blind
_RATES = (
  Decimal("0.10"),
  Decimal("0.12"),
  Decimal("0.22"),
  Decimal("0.24"),
  Decimal("0.32"),
  Decimal("0.35"),
)
_TOP_RATE = Decimal("0.37")
BRACKET_TOPS = {  # upper edge of the 10%, 12%, 22%, 24%, 32% and 35% brackets
  _S: (11_600, 47_150, 100_525, 191_950, 243_725, 609_350),
  _MFJ: (23_200, 94_300, 201_050, 383_900, 487_450, 731_200),
  _HOH: (16_550, 63_100, 100_500, 191_950, 243_700, 609_350),
  _QSS: (23_200, 94_300, 201_050, 383_900, 487_450, 731_200),
}
TAX_TABLE_LIMIT = 100_000  # below: Tax Table; at and above: Tax Computation Worksheet
CTC_PER_CHILD = 2_000
ACTC_PER_CHILD = 1_700
ACTC_EARNED_FLOOR = 2_500
ACTC_RATE = Decimal("0.15")
CTC_PHASEOUT_START = {_S: 200_000, _MFJ: 400_000, _HOH: 200_000, _QSS: 200_000}
CTC_PHASEOUT_STEP = 50  # dollars of credit lost per $1,000 (or part) of MAGI over the start
# Earned income (and AGI) at or above these make the EIC 0, by number of qualifying children.
# Keyed by "married filing jointly"; QSS uses the other column.
EIC_LIMIT = {False: (18_591, 49_084, 55_768, 59_899), True: (25_511, 56_004, 62_688, 66_819)}
EIC_INVESTMENT_LIMIT = 11_600
# Above these, Form 8959 (Additional Medicare Tax) or Form 8960 (NIIT) would apply: out of subset.
# (8959 uses $200,000 for QSS, 8960 $250,000: the lower one binds.)
SURTAX_THRESHOLD = {_S: 200_000, _MFJ: 250_000, _HOH: 200_000, _QSS: 200_000}
EMPLOYER_MEDICARE_THRESHOLD = 200_000  # an employer withholds Additional Medicare Tax above this
SENIOR_BORN_BEFORE = datetime.date(1960, 1, 2)  # 65 by the end of 2024
CHILD_BORN_AFTER = datetime.date(2007, 12, 31)  # under 17 at the end of 2024


class UnsupportedReturn(ValueError):
  """A household outside the engine's subset: its true return would need rules not modelled here."""


@dataclasses.dataclass(frozen=True)
class Person:
  first_name: str
  last_name: str
  born: datetime.date
  blind: bool = False


@dataclasses.dataclass(frozen=True)
class Child:
  first_name: str
  born: datetime.date


@dataclasses.dataclass(frozen=True)
class W2:
  employer: str
  wages: int  # box 1
  withheld: int  # box 2


@dataclasses.dataclass(frozen=True)
class Form1099Int:
  payer: str
  interest: int  # box 1
  withheld: int  # box 4


@dataclasses.dataclass(frozen=True)
class Form1099Div:
  payer: str
  ordinary: int  # box 1a; box 1b (qualified) is 0 throughout the subset
  withheld: int  # box 4


@dataclasses.dataclass(frozen=True)
class Household:
  """Everything the engine reads: whole-dollar amounts, as on the source forms."""

  status: FilingStatus
  taxpayer: Person
  spouse: Person | None = None
  children: tuple[Child, ...] = ()
  w2s: tuple[W2, ...] = ()
  interest: tuple[Form1099Int, ...] = ()
  dividends: tuple[Form1099Div, ...] = ()
  estimated_payments: int = 0


# ----------------------------------------------------------------------------------------------
# Rules


def _dollars(amount: Decimal) -> int:
  """IRS rounding to whole dollars: 50 cents and up round up."""
  return int(amount.quantize(Decimal(1), rounding=ROUND_HALF_UP))


def standard_deduction(h: Household) -> int:
  """Line 12: the basic amount plus one addition per box checked (65 or older, blind)."""
  people = (h.taxpayer,) if h.spouse is None else (h.taxpayer, h.spouse)
  boxes = sum((p.born < SENIOR_BORN_BEFORE) + p.blind for p in people)
  return STANDARD_DEDUCTION[h.status] + boxes * ADDITIONAL_DEDUCTION[h.status]


def tax_by_formula(taxable: Decimal | int, status: FilingStatus) -> Decimal:
  """Exact bracket tax in dollars and cents (what the Tax Computation Worksheet computes)."""
  taxable, tax, floor = Decimal(taxable), Decimal(0), 0
  for top, rate in zip(BRACKET_TOPS[status], _RATES, strict=True):
    tax += rate * max(Decimal(0), min(taxable, Decimal(top)) - floor)
    floor = top
  return tax + _TOP_RATE * max(Decimal(0), taxable - floor)


def tax_table_row(taxable: int) -> tuple[int, int]:
  """The Tax Table row [at least, less than) holding `taxable` (under $100,000).

  Rows are $0-5, $5-15, $15-25, then $25 wide up to $3,000, then $50 wide.
  """
  if not 0 <= taxable < TAX_TABLE_LIMIT:
    raise ValueError(f"the Tax Table covers 0 <= taxable income < {TAX_TABLE_LIMIT}, got {taxable}")
  for low, high in ((0, 5), (5, 15), (15, 25)):
    if taxable < high:
      return low, high
  width = 25 if taxable < 3_000 else 50
  low = taxable - taxable % width
  return low, low + width


def income_tax(taxable: int, status: FilingStatus) -> int:
  """Line 16 for the subset: the Tax Table below $100,000, the worksheet formula from there on."""
  if taxable < TAX_TABLE_LIMIT:
    low, high = tax_table_row(taxable)
    return _dollars(tax_by_formula(Decimal(low + high) / 2, status))
  return _dollars(tax_by_formula(taxable, status))


def child_tax_credit_after_phaseout(n_children: int, magi: int, status: FilingStatus) -> int:
  """Schedule 8812 line 12: $2,000 per child less $50 per $1,000 (or part) of MAGI over the start."""
  over = max(0, magi - CTC_PHASEOUT_START[status])
  return max(0, CTC_PER_CHILD * n_children - CTC_PHASEOUT_STEP * math.ceil(over / 1_000))


def additional_child_tax_credit(n_children: int, unused_credit: int, earned_income: int) -> int:
  """Schedule 8812 Part II-A: the refundable part of the credit left over after line 19.

  With 3+ children, Part II-B (social security taxes) is needed whenever 15% of earned income is
  below the cap; that is outside the subset.
  """
  cap = min(unused_credit, ACTC_PER_CHILD * n_children)  # 8812 line 17
  by_earnings = _dollars(ACTC_RATE * max(0, earned_income - ACTC_EARNED_FLOOR))  # 8812 line 20
  if n_children >= 3 and by_earnings < cap:
    raise UnsupportedReturn("3+ children with 15% of earned income below the ACTC cap needs 8812 Part II-B")
  return min(cap, by_earnings)


def check_supported(h: Household, earned_income: int, agi: int, investment_income: int) -> None:
  """Raises UnsupportedReturn when a rule outside the subset would change a line."""
  if (h.status == _MFJ) != (h.spouse is not None):
    raise ValueError(f"a spouse is given exactly when filing jointly; status {h.status}")
  if h.status in (_HOH, _QSS) and not h.children:
    raise UnsupportedReturn(f"{h.status} needs a qualifying child in this subset")
  if any(c.born <= CHILD_BORN_AFTER for c in h.children):
    raise UnsupportedReturn("dependents 17 or older (credit for other dependents) are not modelled")
  if any(w.wages > EMPLOYER_MEDICARE_THRESHOLD for w in h.w2s) or agi > SURTAX_THRESHOLD[h.status]:
    raise UnsupportedReturn("income above the Additional Medicare Tax / NIIT thresholds")
  eic_limit = EIC_LIMIT[h.status == _MFJ][min(len(h.children), 3)]
  eic_possible = 0 < earned_income < eic_limit and agi < eic_limit
  if eic_possible and investment_income <= EIC_INVESTMENT_LIMIT:
    raise UnsupportedReturn("the earned income credit could be nonzero")


def _check_amounts(h: Household) -> None:
  amounts = [h.estimated_payments]
  amounts += [x for w in h.w2s for x in (w.wages, w.withheld)]
  amounts += [x for f in h.interest for x in (f.interest, f.withheld)]
  amounts += [x for f in h.dividends for x in (f.ordinary, f.withheld)]
  if any(not isinstance(a, int) or a < 0 for a in amounts):
    raise ValueError("form amounts must be non-negative whole dollars")


def compute_return(h: Household) -> dict[str, int]:
  """Every modelled Form 1040 line (scored and intermediate), keyed by line id, in whole dollars.

  Lines the subset never fills (10, 27, 29 and the unscored 17, 20, 23, 31) are 0.
  """
  _check_amounts(h)
  w = {"1a": sum(x.wages for x in h.w2s), "2b": sum(x.interest for x in h.interest)}
  w["3b"] = sum(x.ordinary for x in h.dividends)
  w["1z"] = w["1a"]
  w["9"] = w["1z"] + w["2b"] + w["3b"]
  w["10"] = 0
  w["11"] = w["9"] - w["10"]
  check_supported(h, earned_income=w["1a"], agi=w["11"], investment_income=w["2b"] + w["3b"])
  w["12"] = standard_deduction(h)
  w["14"] = w["12"]
  w["15"] = max(0, w["11"] - w["14"])
  w["16"] = income_tax(w["15"], h.status)
  w["18"] = w["16"]
  credit = child_tax_credit_after_phaseout(len(h.children), w["11"], h.status)
  w["19"] = min(credit, w["18"])
  w["21"] = w["19"]
  w["22"] = max(0, w["18"] - w["21"])
  w["24"] = w["22"]
  w["25a"] = sum(x.withheld for x in h.w2s)
  w["25b"] = sum(x.withheld for x in h.interest) + sum(x.withheld for x in h.dividends)
  w["25d"] = w["25a"] + w["25b"]
  w["26"] = h.estimated_payments
  w["27"] = 0
  w["28"] = additional_child_tax_credit(len(h.children), credit - w["19"], w["1a"]) if h.children else 0
  w["29"] = 0
  w["32"] = w["27"] + w["28"] + w["29"]
  w["33"] = w["25d"] + w["26"] + w["32"]
  w["34"] = max(0, w["33"] - w["24"])
  w["35a"] = w["34"]
  w["37"] = max(0, w["24"] - w["33"])
  return w


# ----------------------------------------------------------------------------------------------
# Files in the benchmark's layout

_STATUS_CODE = {_S: "1", _MFJ: "2", _HOH: "4", _QSS: "5"}  # IndividualReturnFilingStatusCd
_UNSCORED_ELEMENTS = {
  "1z": "WagesSalariesAndTipsAmt",
  "2b": "TaxableInterestAmt",
  "3b": "OrdinaryDividendsAmt",
  "14": "TotalDeductionsAmt",
  "25a": "FormW2WithheldTaxAmt",
  "25b": "Form1099WithheldTaxAmt",
}
_ELEMENTS = {**_UNSCORED_ELEMENTS, **{line.id: line.element for line in taxcalc.LINES}}
ET.register_namespace("", taxcalc.IRS_NAMESPACE)  # write MeF's default namespace, not `ns0:`


def _form_order(line_id: str) -> tuple[int, str]:
  digits = line_id.rstrip("abcdefghijklmnopqrstuvwxyz")
  return int(digits), line_id[len(digits) :]


def output_xml(status: FilingStatus, lines: dict[str, int]) -> str:
  """The expected return as MeF XML in the IRS namespace; zero amounts are omitted, as in MeF."""
  ns = f"{{{taxcalc.IRS_NAMESPACE}}}"
  root = ET.Element(f"{ns}Return", returnVersion="2024v5.0")
  header = ET.SubElement(root, f"{ns}ReturnHeader", binaryAttachmentCnt="0")
  ET.SubElement(header, f"{ns}TaxYr").text = str(taxcalc.TAX_YEAR)
  ET.SubElement(header, f"{ns}ReturnTypeCd").text = "1040"
  form = ET.SubElement(ET.SubElement(root, f"{ns}ReturnData", documentCnt="1"), f"{ns}IRS1040")
  ET.SubElement(form, f"{ns}IndividualReturnFilingStatusCd").text = _STATUS_CODE[status]
  for line_id in sorted(_ELEMENTS, key=_form_order):
    if lines[line_id]:
      ET.SubElement(form, f"{ns}{_ELEMENTS[line_id]}").text = str(lines[line_id])
  ET.indent(root)
  return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _field(label: str, value: Any) -> dict[str, Any]:
  return {"label": label, "value": value}


def _person_fields(prefix: str, who: str, p: Person) -> dict[str, Any]:
  return {
    f"{prefix}_first_name": _field(f"{who} first name", p.first_name),
    f"{prefix}_last_name": _field(f"{who} last name", p.last_name),
    f"{prefix}_date_of_birth": _field(f"{who} date of birth", p.born.isoformat()),
    f"{prefix}_blind": _field(f"{who} is blind", p.blind),
  }


def input_json(h: Household) -> dict[str, Any]:
  """The taxpayer's forms in the benchmark's style: `{"input": {"return_data": {form: {field: {label,
  value}}}}}`, repeated forms as lists. Field names imitate the real files; they are not a copy."""
  irs1040 = {"filing_status": _field("Filing status", str(h.status))}
  irs1040 |= _person_fields("tp", "Taxpayer", h.taxpayer)
  if h.spouse is not None:
    irs1040 |= _person_fields("sp", "Spouse", h.spouse)
  irs1040["estimated_tax_payments"] = _field("2024 estimated tax payments", h.estimated_payments)
  data = {"irs1040": irs1040}
  data["dependents"] = [
    {
      "first_name": _field("Dependent first name", c.first_name),
      "date_of_birth": _field("Dependent date of birth", c.born.isoformat()),
      "relationship": _field("Relationship to taxpayer", "child"),
      "months_lived_with_taxpayer": _field("Months lived with taxpayer in 2024", 12),
      "has_ssn": _field("Has an SSN valid for employment", True),
    }
    for c in h.children
  ]
  data["w2"] = [
    {
      "employer_name": _field("Employer name", w.employer),
      "wages": _field("Box 1: Wages, tips, other compensation", w.wages),
      "federal_income_tax_withheld": _field("Box 2: Federal income tax withheld", w.withheld),
    }
    for w in h.w2s
  ]
  data["irs1040_scheduleb"] = {
    "irs1099_int": [
      {
        "interest_1099int_payer": _field("Payer name", f.payer),
        "interest_1099int_interest": _field("Box 1: Interest income", f.interest),
        "interest_1099int_federal_tax_withheld": _field("Box 4: Federal income tax withheld", f.withheld),
      }
      for f in h.interest
    ],
    "irs1099_div": [
      {
        "dividend_1099div_payer": _field("Payer name", f.payer),
        "dividend_1099div_ordinary_div": _field("Box 1a: Total ordinary dividends", f.ordinary),
        "dividend_1099div_qualified_div": _field("Box 1b: Qualified dividends", 0),
        "dividend_1099div_federal_tax_withheld": _field("Box 4: Federal income tax withheld", f.withheld),
      }
      for f in h.dividends
    ],
  }
  return {"input": {"return_data": data}}


# ----------------------------------------------------------------------------------------------
# Sampling


@dataclasses.dataclass(frozen=True)
class Mix:
  """What one difficulty level draws: statuses, how many forms and children, which extras."""

  statuses: tuple[FilingStatus, ...]
  max_w2s: int
  max_children: int
  max_1099s: int  # of each kind
  p_interest: float
  p_dividends: float
  p_estimated: float
  p_senior_or_blind: float
  p_1099_withholding: float
  p_no_wages: float  # investment-income-only households (never with children)
  max_wages: int


DIFFICULTY = {
  0: Mix((_S,), 1, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 120_000),
  1: Mix((_S, _MFJ, _HOH), 2, 2, 1, 0.4, 0.2, 0.2, 0.1, 0.0, 0.0, 180_000),
  2: Mix((_S, _MFJ, _HOH, _QSS), 3, 4, 3, 0.6, 0.5, 0.4, 0.25, 0.2, 0.1, 240_000),
}
_FIRST = ("Alex", "Jordan", "Casey", "Morgan", "Riley", "Taylor", "Jamie", "Avery", "Quinn", "Drew")
_LAST = ("Rivera", "Chen", "Okafor", "Novak", "Haddad", "Larsen", "Mendez", "Ibrahim", "Kowalski")
_EMPLOYERS = ("Acme Tools Inc", "Blue River Health", "Northwind Logistics", "Summit Schools", "Keystone Labs")
_BANKS = ("First Federal Savings", "Harbor Credit Union", "Granite Brokerage", "Pinecrest Bank")


def _date(rng: random.Random, first: datetime.date, last: datetime.date) -> datetime.date:
  return first + datetime.timedelta(days=rng.randrange((last - first).days + 1))


def _person(rng: random.Random, last_name: str, p_senior_or_blind: float) -> Person:
  senior = rng.random() < p_senior_or_blind
  born = (
    _date(rng, datetime.date(1940, 1, 1), datetime.date(1959, 12, 31))
    if senior
    else _date(rng, datetime.date(1961, 1, 1), datetime.date(2000, 12, 31))
  )
  return Person(rng.choice(_FIRST), last_name, born, blind=rng.random() < p_senior_or_blind / 2)


def _split(rng: random.Random, total: int, parts: int) -> list[int]:
  cuts = sorted(rng.randint(0, total) for _ in range(parts - 1))
  return [b - a for a, b in zip([0, *cuts], [*cuts, total], strict=True)]


def _w2s(rng: random.Random, mix: Mix, status: FilingStatus, n_children: int) -> tuple[W2, ...]:
  if n_children == 0 and rng.random() < mix.p_no_wages:
    return ()
  floor = EIC_LIMIT[status == _MFJ][min(n_children, 3)]
  total = rng.randint(floor, max(floor, mix.max_wages))
  return tuple(
    W2(rng.choice(_EMPLOYERS), wages, round(wages * rng.uniform(0.04, 0.18)))
    for wages in _split(rng, total, rng.randint(1, mix.max_w2s))
  )


def _withholding(rng: random.Random, mix: Mix, amount: int) -> int:
  return round(amount * 0.24) if rng.random() < mix.p_1099_withholding else 0


def _investment_forms(
  rng: random.Random, mix: Mix, need_income: bool
) -> tuple[tuple[Form1099Int, ...], tuple[Form1099Div, ...]]:
  n_int = rng.randint(1, max(1, mix.max_1099s)) if need_income or rng.random() < mix.p_interest else 0
  n_div = rng.randint(1, mix.max_1099s) if rng.random() < mix.p_dividends else 0
  interest = []
  for _ in range(n_int):
    amount = rng.randint(10, 20_000 if need_income else 4_000)
    interest.append(Form1099Int(rng.choice(_BANKS), amount, _withholding(rng, mix, amount)))
  dividends = []
  for _ in range(n_div):
    amount = rng.randint(10, 8_000)
    dividends.append(Form1099Div(rng.choice(_BANKS), amount, _withholding(rng, mix, amount)))
  return tuple(interest), tuple(dividends)


def sample_household(rng: random.Random, mix: Mix) -> Household:
  """One household drawn from `mix`; may be outside the subset (compute_return then raises)."""
  status = rng.choice(mix.statuses)
  needs_child = status in (_HOH, _QSS)
  n_children = 0 if status == _S else rng.randint(1 if needs_child else 0, mix.max_children)
  last = rng.choice(_LAST)
  taxpayer = _person(rng, last, mix.p_senior_or_blind)
  spouse = _person(rng, last, mix.p_senior_or_blind) if status == _MFJ else None
  children = tuple(
    Child(rng.choice(_FIRST), _date(rng, datetime.date(2008, 6, 1), datetime.date(2024, 6, 30)))
    for _ in range(n_children)
  )
  w2s = _w2s(rng, mix, status, n_children)
  interest, dividends = _investment_forms(rng, mix, need_income=not w2s)
  estimated = 100 * rng.randint(1, 60) if rng.random() < mix.p_estimated else 0
  return Household(status, taxpayer, spouse, children, w2s, interest, dividends, estimated)


def sample_supported(rng: random.Random, mix: Mix, max_tries: int = 200) -> tuple[Household, dict[str, int]]:
  """Draws until a household is inside the subset; returns it with its computed lines."""
  for _ in range(max_tries):
    h = sample_household(rng, mix)
    try:
      return h, compute_return(h)
    except UnsupportedReturn:
      continue
  raise RuntimeError(f"no supported household in {max_tries} draws from {mix}")


_SLUG = {_S: "single", _MFJ: "mfj", _HOH: "hoh", _QSS: "qss"}


def generate_cases(
  n: int, seed: int = 0, out_dir: str | os.PathLike | None = None, difficulty: int = 1
) -> list[taxcalc.TaxCase]:
  """`n` synthetic cases, the same for the same (seed, difficulty); written under `out_dir` if set.

  Case `i` draws from its own generator seeded by (seed, difficulty, i), so the first k cases of a
  larger request are the same k cases. Each case goes through `taxcalc.case_from_texts`, exactly as
  the loader reads the files back.
  """
  if difficulty not in DIFFICULTY:
    raise ValueError(f"difficulty must be one of {sorted(DIFFICULTY)}, got {difficulty}")
  cases = []
  for i in range(n):
    rng = random.Random(f"taxcalc-forms:{seed}:{difficulty}:{i}")
    h, lines = sample_supported(rng, DIFFICULTY[difficulty])
    case_id = f"{_SLUG[h.status]}-synthetic-s{seed}-d{difficulty}-{i:05d}"
    input_text = json.dumps(input_json(h), indent=2, ensure_ascii=False) + "\n"
    xml_text = output_xml(h.status, lines)
    if out_dir is not None:
      rundir.atomic_write_text(os.path.join(out_dir, case_id, "input.json"), input_text)
      rundir.atomic_write_text(os.path.join(out_dir, case_id, "output.xml"), xml_text)
    cases.append(taxcalc.case_from_texts(case_id, input_text, xml_text))
  return cases

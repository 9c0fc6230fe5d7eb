"""The synthetic TY24 engine against hand-computed 2024 returns, its invariants, and its files."""

import datetime
import json
import random
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpa_grpo.envs import forms, taxcalc
from dpa_grpo.envs.forms import FilingStatus as FS

ADULT = forms.Person("Alex", "Rivera", datetime.date(1985, 5, 1))
SENIOR_BLIND = forms.Person("Drew", "Rivera", datetime.date(1955, 5, 1), blind=True)
KID = forms.Child("Riley", datetime.date(2015, 3, 3))


def _h(status=FS.SINGLE, wages=(), spouse=None, children=0, **kw):
  w2s = tuple(forms.W2("Acme", w, t) for w, t in wages)
  return forms.Household(status, ADULT, spouse, (KID,) * children, w2s, **kw)


# ------------------------------------------------------------------------------ hand-computed returns


def test_single_50000_wages_uses_tax_table_midpoint():
  lines = forms.compute_return(_h(wages=[(50_000, 5_000)]))
  assert (lines["1a"], lines["9"], lines["11"], lines["12"], lines["15"]) == (
    50_000,
    50_000,
    50_000,
    14_600,
    35_400,
  )
  # Row 35,400-35,450, midpoint 35,425: 1,160 + 12% x 23,825 = 4,019 (the formula on 35,400 gives 4,016).
  assert lines["16"] == 4_019 and lines["24"] == 4_019
  assert (lines["25d"], lines["33"], lines["34"], lines["35a"], lines["37"]) == (5_000, 5_000, 981, 981, 0)


def test_single_above_100000_uses_worksheet_formula_rounded_half_up():
  lines = forms.compute_return(_h(wages=[(130_000, 20_000)], estimated_payments=1_000))
  # 115,400 x 24% - 6,957.50 = 20,738.50 -> 20,739.
  assert lines["15"] == 115_400 and lines["16"] == 20_739
  assert (lines["26"], lines["33"], lines["37"], lines["34"]) == (1_000, 21_000, 0, 261)


def test_mfj_two_children_credit_limited_by_nothing():
  lines = forms.compute_return(_h(FS.MARRIED_FILING_JOINTLY, [(70_000, 4_000), (50_000, 3_000)], ADULT, 2))
  # Taxable 90,800, row midpoint 90,825: 2,320 + 12% x 67,625 = 10,435; CTC 2 x 2,000.
  assert (lines["15"], lines["16"], lines["19"], lines["24"], lines["28"]) == (
    90_800,
    10_435,
    4_000,
    6_435,
    0,
  )
  assert (lines["33"], lines["37"], lines["34"]) == (7_000, 0, 565)


def test_hoh_credit_limited_by_tax_makes_refundable_actc():
  lines = forms.compute_return(_h(FS.HEAD_OF_HOUSEHOLD, [(56_000, 2_000)], children=2))
  # Taxable 34,100, midpoint 34,125: 1,655 + 12% x 17,575 = 3,764; line 19 = 3,764 of 4,000;
  # ACTC = min(236 unused, 2 x 1,700, 15% x 53,500) = 236.
  assert (lines["12"], lines["15"], lines["16"], lines["19"], lines["24"]) == (
    21_900,
    34_100,
    3_764,
    3_764,
    0,
  )
  assert (lines["28"], lines["32"], lines["33"], lines["34"], lines["35a"]) == (236, 236, 2_236, 2_236, 2_236)


def test_senior_blind_additions_and_investment_only_household():
  h = forms.Household(
    FS.MARRIED_FILING_JOINTLY,
    SENIOR_BLIND,
    SENIOR_BLIND,
    interest=(forms.Form1099Int("Bank", 30_000, 100),),
    dividends=(forms.Form1099Div("Fund", 10_000, 0),),
  )
  lines = forms.compute_return(h)
  assert lines["12"] == 29_200 + 4 * 1_550
  assert (lines["1a"], lines["9"], lines["15"]) == (0, 40_000, 40_000 - 35_400)
  assert lines["16"] == 463  # row 4,600-4,650, midpoint 4,625 at 10%: 462.50 rounds up
  assert lines["25d"] == 100 and lines["19"] == 0 and lines["37"] == 363


@pytest.mark.parametrize(
  "taxable, status, tax",
  [
    (0, FS.SINGLE, 0),  # row 0-5
    (7, FS.SINGLE, 1),  # row 5-15, midpoint 10
    (30, FS.SINGLE, 4),  # row 25-50, midpoint 37.50 -> 3.75
    (3_000, FS.HEAD_OF_HOUSEHOLD, 303),  # first $50 row: 302.50 rounds up
    (99_999, FS.SINGLE, 17_048),  # row 99,950-100,000: 5,426 + 22% x 52,825 = 17,047.50 at 99,975
    (100_000, FS.SINGLE, 17_053),  # worksheet: 100,000 x 22% - 4,947
    (250_000, FS.MARRIED_FILING_JOINTLY, 46_085),  # 34,337 + 24% x 48,950
    (700_000, FS.QUALIFYING_SURVIVING_SPOUSE, 185_750),  # 111,357 + 35% x 212,550 = 185,749.50
  ],
)
def test_income_tax_known_values(taxable, status, tax):
  assert forms.income_tax(taxable, status) == tax


def test_tax_table_rows():
  assert [forms.tax_table_row(x) for x in (0, 4, 5, 24, 25, 2_999, 3_000, 99_999)] == [
    (0, 5), (0, 5), (5, 15), (15, 25), (25, 50), (2_975, 3_000), (3_000, 3_050), (99_950, 100_000),
  ]  # fmt: skip
  with pytest.raises(ValueError):
    forms.tax_table_row(100_000)


# ------------------------------------------------------------------------------ credits


def test_ctc_phaseout_50_per_1000_or_part():
  assert forms.child_tax_credit_after_phaseout(2, 200_000, FS.SINGLE) == 4_000
  assert forms.child_tax_credit_after_phaseout(2, 200_001, FS.SINGLE) == 3_950
  assert forms.child_tax_credit_after_phaseout(2, 201_000, FS.HEAD_OF_HOUSEHOLD) == 3_950
  assert forms.child_tax_credit_after_phaseout(2, 410_500, FS.MARRIED_FILING_JOINTLY) == 4_000 - 11 * 50
  assert forms.child_tax_credit_after_phaseout(1, 900_000, FS.SINGLE) == 0


def test_actc_earned_income_rule_and_part_iib_limit():
  assert forms.additional_child_tax_credit(2, 4_000, 12_500) == 1_500  # 15% x 10,000 < 3,400 cap
  assert forms.additional_child_tax_credit(2, 4_000, 2_500) == 0
  assert forms.additional_child_tax_credit(1, 900, 60_000) == 900
  with pytest.raises(forms.UnsupportedReturn, match="Part II-B"):
    forms.additional_child_tax_credit(3, 6_000, 20_000)


@pytest.mark.parametrize(
  "household, reason",
  [
    (_h(wages=[(15_000, 0)]), "earned income credit"),
    (_h(FS.HEAD_OF_HOUSEHOLD, [(45_000, 0)], children=1), "earned income credit"),
    (_h(wages=[(150_000, 0), (60_000, 0)]), "Additional Medicare"),
    (_h(FS.HEAD_OF_HOUSEHOLD, [(60_000, 0)]), "qualifying child"),
    (
      forms.Household(FS.SINGLE, ADULT, children=(forms.Child("Old", datetime.date(2007, 6, 1)),)),
      "other dependents",
    ),
  ],
)
def test_households_outside_the_subset_are_refused(household, reason):
  with pytest.raises(forms.UnsupportedReturn, match=reason):
    forms.compute_return(household)


def test_invalid_households_are_errors():
  with pytest.raises(ValueError, match="spouse"):
    forms.compute_return(_h(FS.MARRIED_FILING_JOINTLY, [(90_000, 0)]))
  with pytest.raises(ValueError, match="whole dollars"):
    forms.compute_return(_h(wages=[(90_000, -1)]))


# ------------------------------------------------------------------------------ properties


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from(sorted(forms.DIFFICULTY)))
def test_return_invariants(seed, difficulty):
  h, w = forms.sample_supported(random.Random(seed), forms.DIFFICULTY[difficulty])
  assert w["9"] == w["1z"] + w["2b"] + w["3b"]
  assert w["11"] == w["9"] - w["10"]
  assert w["15"] == max(0, w["11"] - w["12"])
  assert w["16"] == forms.income_tax(w["15"], h.status)
  assert w["19"] <= w["16"] and w["24"] == w["16"] - w["19"]
  assert w["25d"] == w["25a"] + w["25b"] and w["32"] == w["27"] + w["28"] + w["29"]
  assert w["33"] == w["25d"] + w["26"] + w["32"]
  assert not (w["34"] > 0 and w["37"] > 0)
  assert w["34"] - w["37"] == w["33"] - w["24"] and w["35a"] == w["34"]
  assert w["27"] == w["29"] == w["10"] == 0
  assert all(isinstance(v, int) and v >= 0 for v in w.values())


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 800_000), st.integers(0, 800_000), st.sampled_from(list(FS)))
def test_tax_monotone_in_taxable_income(a, b, status):
  low, high = sorted((a, b))
  assert forms.income_tax(low, status) <= forms.income_tax(high, status)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, forms.TAX_TABLE_LIMIT - 1), st.sampled_from(list(FS)))
def test_tax_table_is_formula_at_row_midpoint(taxable, status):
  low, high = forms.tax_table_row(taxable)
  assert low <= taxable < high and high - low <= 50
  midpoint_tax = forms.tax_by_formula(Decimal(low + high) / 2, status)
  assert abs(forms.income_tax(taxable, status) - midpoint_tax) <= Decimal("0.5")
  # The table and the formula differ by at most the rate times half a row, plus rounding.
  assert abs(forms.income_tax(taxable, status) - forms.tax_by_formula(taxable, status)) <= Decimal("13")


def test_table_formula_switch_at_100000():
  for status in FS:
    below = forms.income_tax(99_999, status)
    at = forms.income_tax(100_000, status)
    assert at == int(forms.tax_by_formula(100_000, status) + Decimal("0.5"))
    assert below == int(forms.tax_by_formula(Decimal("99975"), status) + Decimal("0.5"))
    assert 0 <= at - below <= 12


def test_standard_deductions_2024():
  assert forms.standard_deduction(_h()) == 14_600
  assert forms.standard_deduction(_h(FS.HEAD_OF_HOUSEHOLD)) == 21_900
  assert forms.standard_deduction(_h(FS.QUALIFYING_SURVIVING_SPOUSE)) == 29_200
  assert forms.standard_deduction(_h(FS.MARRIED_FILING_JOINTLY, spouse=ADULT)) == 29_200
  senior_blind = forms.Household(FS.SINGLE, SENIOR_BLIND)
  assert forms.standard_deduction(senior_blind) == 14_600 + 2 * 1_950


# ------------------------------------------------------------------------------ files


def test_generated_cases_load_and_score_like_benchmark_cases(tmp_path):
  made = forms.generate_cases(6, seed=3, out_dir=tmp_path, difficulty=2)
  loaded = taxcalc.load_cases(tmp_path)
  assert sorted(c.case_id for c in made) == [c.case_id for c in loaded]
  by_id = {c.case_id: c for c in made}
  for case in loaded:
    assert case.gold == by_id[case.case_id].gold and case.forms == by_id[case.case_id].forms
    assert taxcalc.score_return(case, case.gold).strictly_correct
    raw = json.loads((tmp_path / case.case_id / "input.json").read_text())
    assert raw["input"] == case.forms  # written with the "input" wrapper
  xml = (tmp_path / loaded[0].case_id / "output.xml").read_text()
  assert xml.startswith('<?xml version="1.0" encoding="UTF-8"?>\n<Return xmlns="http://www.irs.gov/efile"')
  assert "ns0:" not in xml


def test_zero_lines_are_omitted_from_xml_and_read_back_as_zero():
  lines = forms.compute_return(_h(wages=[(50_000, 5_000)]))
  xml = forms.output_xml(FS.SINGLE, lines)
  assert "<OwedAmt>" not in xml and "<CTCODCAmt>" not in xml and "<TaxAmt>4019</TaxAmt>" in xml
  gold = taxcalc.parse_gold_xml(xml, "synthetic")
  assert gold == {i: float(lines[i]) for i in taxcalc.LINE_IDS}


def test_generation_is_deterministic_and_prefix_stable():
  a = forms.generate_cases(5, seed=11, difficulty=1)
  b = forms.generate_cases(8, seed=11, difficulty=1)
  assert [(c.case_id, c.gold, c.forms) for c in a] == [(c.case_id, c.gold, c.forms) for c in b[:5]]
  assert [c.gold for c in forms.generate_cases(5, seed=12, difficulty=1)] != [c.gold for c in a]
  with pytest.raises(ValueError, match="difficulty"):
    forms.generate_cases(1, difficulty=9)


def test_difficulty_zero_is_single_one_w2():
  for case in forms.generate_cases(20, seed=0, difficulty=0):
    data = case.forms["return_data"]
    assert data["irs1040"]["filing_status"]["value"] == "single" and len(data["w2"]) == 1
    assert not data["dependents"] and not data["irs1040_scheduleb"]["irs1099_int"]

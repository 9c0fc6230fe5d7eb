"""Greedy probe: level-2/3 prompts with every block's card; is the key right, is the rule right?"""
import dataclasses, random, sys
import configs.kace
from kace import config as kc, evaluate, methods, synthetic, testbed
c = kc.KaceConfig.from_dict(configs.kace.get_config("testbed"))
c = evaluate.resolve(c)
gen = methods.role(c.roles.solver)
bed = c.testbed.testbed()
_, test = bed.problems()
rules = bed.conventions()
every = list(testbed.true_cards(rules, levels=testbed.LEVELS, form=bed.form).values())
rng = random.Random(0)
prompts, meta = [], []
for p in test:
  if p.level < 2: continue
  mixed = every[:]; rng.shuffle(mixed)
  prompts.append(synthetic.solver_messages(p.question, synthetic.convention_notes(mixed)))
  kind = testbed.KINDS[(p.domain, p.level)]
  meta.append((p, testbed.card_text(kind, rules[(p.domain, p.level)], bed.form)))
params = dataclasses.replace(c.sampling.params(), temperature=0.0)
out = gen.generate(prompts, n=1, params=params)
key_ok = rule_ok = ans_ok = 0
for (p, card), g in zip(meta, out):
  t = g[0].text
  key_ok += t.startswith("=" + card.split("=")[1])
  rule_ok += t.startswith("=" + card.split("=")[1] + card.split("=")[0])
  ans_ok += f"\\boxed{{{p.answer}}}" in t
  if len(sys.argv) > 1: print(p.level, card, "|", t)
print(f"n={len(meta)} key {key_ok} card {rule_ok} answer {ans_ok}")

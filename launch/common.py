"""What every launcher shares: its config flags, `--workdir`, `--help`, and checks before any work.

A launcher defines its config flags with `define_config` and runs with `run(main)`. Before anything
expensive runs:
  - `--help` prints the launcher's docstring, its flags and the override syntax, and exits 0;
  - a config key that is not in the config (`--config.trian.steps=1`) stops at import, in one line
    naming the closest valid key; so does a config file or preset that does not load;
  - `typed(flag, make)` builds the typed config (its `__post_init__` checks: enumerated fields,
    ranges), refuses a real-weights preset without its checkpoint (the config file's
    `required_weights`) and an input path that does not exist; every failure is one line, exit 2,
    with nothing written;
  - absl / orbax INFO logging is off unless `--verbosity` (or `-v`) is given; progress lines
    (`lm.progress`) print either way;
  - on a GPU, JAX's allocator gets `XLA_PYTHON_CLIENT_MEM_FRACTION` = 0.90 of the card unless the
    user set it (`lm.memory`: the pool `launch.plan` budgets against; JAX's own default is 0.75);
  - `--dry_run` (launchers that load a model) checks the config, prints the plan of its programs
    for this host's devices and writes nothing.

Config paths resolve from the working directory first, then from the installed package, so the
console entry points (setup.py) work from any directory.

A run directory belongs to one resolved config (`lm.rundir.prepare_workdir`): once a run has written
records there, a rerun whose config differs beyond a few safe keys stops and names the differing
keys, unless `--allow_config_change`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib.util
import logging as std_logging
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NoReturn, TypeVar

from absl import app, flags, logging
from ml_collections import config_flags

from lm import memory, progress, rundir

T = TypeVar("T")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # holds configs/, launch/, lm/

# Defined by `define_workdir`, by the launchers that write a run directory (lm-serve and lm-plan
# write none, so their --help does not offer the flags).
WORKDIR: flags.FlagHolder | None = None
ALLOW_CONFIG_CHANGE: flags.FlagHolder | None = None

OVERRIDES_HELP = """\
Config overrides: --<config flag>.<dotted key>=<value> (examples above); a preset is chosen with
--<config flag>=<file>.py:<preset>. An unknown key or preset, a bad value or a missing input path
stops at once with one line naming the closest valid choice, exit status 2.
Logging: quiet (warnings only) unless --verbosity=0 (INFO) or -v 1; progress lines always print."""

# Config fields holding an input that must exist when set (outputs and caches are not listed).
PATH_FIELDS = (
  "checkpoint",
  "tokenizer",
  "root",
  "source",
  "train_source",
  "tree",
  "embedder_dir",
  "model_dir",
)

_CONFIGS: dict[str, tuple[str, str]] = {}  # config flag name -> (config file, preset)
SECOND_DEFAULTS: dict[str, str | None] = {}  # config flag name -> the default a second definer gave


def fail(message: str) -> NoReturn:
  """Stops the launcher: `message` on one line of stderr, exit status 2."""
  prog = os.path.basename(sys.argv[0] or "launcher")
  sys.stderr.write(f"{prog}: error: {' '.join(str(message).split())}\n")
  sys.stderr.flush()
  sys.exit(2)


def define_workdir(*, config_change: bool = True) -> flags.FlagHolder:
  """Defines `--workdir` (and, with `config_change`, `--allow_config_change`) for a launcher that
  writes a run directory; `WORKDIR` / `ALLOW_CONFIG_CHANGE` then hold them."""
  global WORKDIR, ALLOW_CONFIG_CHANGE
  if "workdir" in flags.FLAGS:  # lm-sweep's, when it imports the launcher it runs
    return WORKDIR
  WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (created; resumed if it exists).")
  if config_change:
    ALLOW_CONFIG_CHANGE = flags.DEFINE_bool(
      "allow_config_change",
      False,
      "Resume a run directory whose saved config.json differs beyond the safe keys (the old one is "
      "kept as config.<n>.json). Without it such a rerun stops and names the differing keys.",
    )
  return WORKDIR


DRY_RUN: flags.FlagHolder | None = None  # `define_dry_run`'s flag


def define_dry_run() -> flags.FlagHolder:
  """Defines `--dry_run` for a launcher that loads a model (`dry_run` runs it)."""
  global DRY_RUN
  if "dry_run" not in flags.FLAGS:
    DRY_RUN = flags.DEFINE_bool(
      "dry_run",
      False,
      "Check the config, compile its programs for this host's devices and print their memory against "
      "the budget (lm.plan), then stop: nothing is written, no work directory is created. Exit 1 if a "
      "program does not fit.",
    )
  return DRY_RUN


def dry_run(check: Callable[..., Any], config: Any, name: str = "config") -> NoReturn:
  """`--dry_run` of every launcher that loads a model: prints `check`'s plan (`check(config_dict,
  target, headroom=...)`, the launcher's programs as its config gives them, no search) for this
  host's devices (`lm.plan.local_target`), and exits 0 if every program fits, else 1. It writes
  nothing: call it before anything makes a directory or builds an artefact."""
  from lm import plan as plan_lib

  path, preset = config_source(name)
  preset = f"{os.path.relpath(path, ROOT)}:{preset}"
  record = plan_lib.run_plan(check, preset, config.to_dict(), plan_lib.local_target(), plan_lib.HEADROOM)
  print(plan_lib.summary(record))
  sys.exit(0 if record.get("fits") else 1)


# ---- config files and their overrides -----------------------------------------------------------------


def resolve_config_path(spec: str) -> str:
  """`file.py[:preset]` with `file.py` made absolute: relative to the working directory if it is
  there, else to the package root (so `configs/kace.py` works from any directory)."""
  path, sep, preset = spec.partition(":")
  if not os.path.isabs(path) and not os.path.exists(path) and os.path.exists(os.path.join(ROOT, path)):
    path = os.path.join(ROOT, path)
  return os.path.abspath(path) + sep + preset


def _flag_value(argv: list[str], name: str) -> tuple[int, str] | None:
  """(index, value) of `--name=value` / `--name value` in argv, the last one; None when absent."""
  found = None
  for i, arg in enumerate(argv[1:], 1):
    if re.fullmatch(rf"--?{re.escape(name)}=.*", arg):
      found = (i, arg.split("=", 1)[1])
    elif re.fullmatch(rf"--?{re.escape(name)}", arg) and i + 1 < len(argv):
      found = (i + 1, argv[i + 1])
  return found


def load_config_file(spec: str) -> Any:
  """The ConfigDict of `file.py[:preset]` (its `get_config(preset)`), as ml_collections loads it."""
  path, _, preset = spec.partition(":")
  if not os.path.isfile(path):
    raise ValueError(f"config file {path} does not exist")
  module = _config_module(path)
  if not hasattr(module, "get_config"):
    raise ValueError(f"config file {path} defines no get_config")
  names = list(getattr(module, "PRESET_NAMES", getattr(module, "PRESETS", ())))
  if preset and names and preset not in names:
    close = difflib.get_close_matches(preset, names, n=1, cutoff=0.5)
    listed = ", ".join(getattr(module, "PRESETS", names))
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"unknown preset {preset!r}{hint} (presets: {listed})")
  return module.get_config(preset) if preset else module.get_config()


def presets_help(name: str) -> list[str]:
  """Lines of `--help` listing the presets of config flag `name` (its file's `PRESETS`), one each."""
  path, _ = _CONFIGS.get(name, ("", ""))
  presets = getattr(_config_module(path), "PRESETS", {}) if path else {}
  if not presets:
    return []
  lines = [f"presets (--{name}={os.path.relpath(path, ROOT)}:<preset>):"]
  width = max(len(p) for p in presets)
  described = presets if isinstance(presets, dict) else dict.fromkeys(presets, "")
  return lines + [f"  {p:<{width}}  {line}".rstrip() for p, line in described.items()]


def _config_module(path: str) -> Any:
  if ROOT not in sys.path:  # configs import `configs.generators`
    sys.path.append(ROOT)
  spec = importlib.util.spec_from_file_location(f"_launch_config_{abs(hash(path))}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def dotted_keys(config: Any, prefix: str = "") -> list[str]:
  """Every dotted key of a ConfigDict / dict, inner sections and leaves."""
  keys = []
  for key, value in config.items() if hasattr(config, "items") else ():
    keys.append(prefix + key)
    if hasattr(value, "items"):
      keys += dotted_keys(value, f"{prefix}{key}.")
  return keys


def unknown_key(config: Any, key: str) -> str | None:
  """None when `key` (dotted) names a field of `config`, else why not, with the closest valid key."""
  node = config
  for part in key.split("."):
    if node is None:  # an unset section (a role left None): ml_collections decides
      return None
    if not hasattr(node, "items") or part not in node:
      close = difflib.get_close_matches(key, dotted_keys(config), n=1, cutoff=0.5)
      return f"unknown key {key}" + (f"; did you mean {close[0]}?" if close else "")
    node = node[part]
  return None


def check_overrides(name: str, config: Any, argv: Iterable[str]) -> None:
  """Fails (one line, exit 2) on the first `--name.<key>` of argv whose key is not in `config`."""
  for arg in argv:
    match = re.match(rf"--?(?:no)?{re.escape(name)}\.([^=]+)", arg)
    if match:
      why = unknown_key(config, match.group(1))
      if why:
        fail(f"{why} (in {arg.split('=', 1)[0]})")


def define_config(name: str, default: str | None, help_string: str = "") -> flags.FlagHolder:
  """`config_flags.DEFINE_config_file(name, default)`, checked first: the file (from argv or the
  default, resolved by `resolve_config_path`) loads, and every `--name.<key>` override names a key
  of it; else one line and exit 2, before the launcher does anything. `default` None: the flag is
  required. A second call for a name already defined returns the first flag (lm-sweep defines
  `--config`, then imports the launcher it runs, which defines it again)."""
  if name in _CONFIGS and name in flags.FLAGS:
    SECOND_DEFAULTS[name] = default
    return flags.FlagHolder(flags.FLAGS, flags.FLAGS[name])
  argv = sys.argv
  given = _flag_value(argv, name)
  if not given and default is None:
    _CONFIGS[name] = ("", "")
    return config_flags.DEFINE_config_file(name, None, help_string or "Config file, file.py[:preset].")
  spec = resolve_config_path(given[1] if given else default)
  if given:
    i = given[0]
    argv[i] = argv[i].split("=", 1)[0] + "=" + spec if argv[i].startswith("-") else spec
  path, _, preset = spec.partition(":")
  try:
    config = load_config_file(spec)
  except (ValueError, KeyError, TypeError, ImportError, SyntaxError) as e:
    fail(f"--{name}={given[1] if given else default}: {e}")
  check_overrides(name, config, argv[1:])
  _CONFIGS[name] = (path, preset)
  return config_flags.DEFINE_config_file(
    name, spec, help_string or f"Config file, file.py[:preset] (default {default}).", lock_config=True
  )


def config_with_overrides(spec: str, overrides: Iterable[str]) -> Any:
  """The ConfigDict a launcher gets from `--config=<spec> <overrides>`, parsed by ml_collections as
  the launcher's own flag parses it (lm-sweep checks each point with it before running any).
  Raises ValueError naming the first unknown key (with the closest valid one) or bad value."""
  overrides = list(overrides)
  base = load_config_file(spec)
  for arg in overrides:
    match = re.match(r"--?(?:no)?config\.([^=]+)", arg)
    why = unknown_key(base, match.group(1)) if match else f"not a --config.<key>=<value> override: {arg}"
    if why:
      raise ValueError(why)
  values, argv = flags.FlagValues(), ["lm-sweep", f"--config={spec}", *overrides]
  holder = config_flags.DEFINE_config_file("config", spec, flag_values=values, sys_argv=argv)
  try:
    values(argv)
  except flags.Error as e:
    raise ValueError(str(e)) from None
  return holder.value


def config_source(name: str) -> tuple[str, str]:
  """(absolute config file, preset) the config flag `name` was loaded from (`define_config`)."""
  return _CONFIGS[name]


# ---- the typed config ----------------------------------------------------------------------------------


def _preset_rule(name: str, rule: str, config: Any, default: Any) -> Any:
  """The config file's `rule(preset, config)` for config flag `name` (`default` if it has none)."""
  path, preset = _CONFIGS.get(name, ("", ""))
  function = getattr(_config_module(path), rule, None) if path else None
  return function(preset, config) if function else default


def required_weights(name: str, config: Any) -> dict[str, str]:
  """{config field: Hugging Face model id} of the real weights the flag's preset runs on and that
  are not set: the config file's `required_weights(preset, config)`, the empty fields kept."""
  needs = _preset_rule(name, "required_weights", config, {})
  return {field: hf_id for field, hf_id in needs.items() if not _get(config, field)}


def _get(config: Any, dotted: str) -> Any:
  for part in dotted.split("."):
    config = config[part]
  return config


def _paths(record: Any, prefix: str = "") -> Iterable[tuple[str, str]]:
  """(dotted field, value) of every set `PATH_FIELDS` field in a typed config (dataclasses, maps)."""
  if dataclasses.is_dataclass(record):
    items = ((f.name, getattr(record, f.name)) for f in dataclasses.fields(record))
  elif isinstance(record, Mapping):
    items = record.items()
  else:
    return
  for key, value in items:
    if isinstance(value, str) and key in PATH_FIELDS and value:
      yield prefix + key, value
    elif dataclasses.is_dataclass(value) or isinstance(value, Mapping):
      yield from _paths(value, f"{prefix}{key}.")


def _is_local(field: str, value: str) -> bool:
  """Whether a path field's value names a local file (checked) rather than a hub id (`org/name`)."""
  if field.endswith("checkpoint") or os.path.isabs(value) or value.startswith((".", "~")):
    return True
  return value.count("/") != 1 or bool(os.path.splitext(value)[1])


def check_paths(config: Any, prefix: str = "config.") -> None:
  """Raises ValueError naming the first input path field of `config` whose file does not exist."""
  for field, value in _paths(config):
    if _is_local(field, value) and not os.path.exists(os.path.expanduser(value)):
      raise ValueError(f"{prefix}{field}: {value} does not exist")


def build_typed(name: str, config: Any, make: Callable[[Any], T]) -> T:
  """`make(config)`, the typed config of config flag `name`, with every check done before any work:
  the preset's real weights, the typed records' own checks, the input paths. Raises ValueError
  (TypeError, KeyError) naming the field; `typed` and lm-sweep (every point) share it."""
  for field, hf_id in required_weights(name, config).items():
    _, preset = _CONFIGS[name]
    raise ValueError(
      f"{field} is empty: the {preset or 'default'} preset needs real weights; download {hf_id} "
      f"(huggingface-cli download {hf_id} --local-dir /path) and pass --{name}.{field}=/path"
    )
  typed_config = make(config)
  check_paths(typed_config, f"--{name}.")
  return typed_config


def typed(flag: flags.FlagHolder, make: Callable[[Any], T]) -> T:
  """`build_typed` for the launcher's config flag: a failure is one line naming the field, exit 2."""
  try:
    config = build_typed(flag.name, flag.value, make)
  except (ValueError, TypeError, KeyError) as e:
    fail(str(e) if str(e).startswith(f"--{flag.name}") else f"--{flag.name}: {e}")
  path, preset = _CONFIGS.get(flag.name, ("", ""))
  if _preset_rule(flag.name, "random_init", flag.value, False):
    progress.say(
      f"{os.path.basename(path)}:{preset or '(default)'}: a small model initialised randomly and "
      "trained here, no weights loaded (the qwen3_* presets run on real weights)"
    )
  return config


@contextlib.contextmanager
def work(what: str) -> Iterator[None]:
  """The progress phase (`lm.progress`) a launcher runs its library call in, once its config is
  checked: a start line, a line at least every 30 s, an end line, whatever the log verbosity. A
  stage directory of another config (a testbed's arm, a part of the main job) stops in one line."""
  with progress.phase(f"{os.path.basename(sys.argv[0])}: {what}"):
    try:
      yield
    except rundir.ConfigFileError as e:
      fail(config_change_message(e))


def config_change_message(error: rundir.ConfigFileError) -> str:
  """The one line for a run directory that holds another config, naming this launcher's flag."""
  return f"--workdir: {str(error).replace('allow config changes', 'pass --allow_config_change')}"


def prepare_workdir(config: Any) -> str:
  """`--workdir` created, checked against and stamped with `config` (see the module docstring); a
  rerun with another config stops in one line naming the differing keys."""
  try:
    return rundir.prepare_workdir(WORKDIR.value, config, allow_changes=ALLOW_CONFIG_CHANGE.value)
  except rundir.ConfigFileError as e:
    fail(config_change_message(e))


# ---- running -------------------------------------------------------------------------------------------

_HELP = ("-h", "-?", "--help", "-help", "--helpshort", "-helpshort")


def help_text(module: Any) -> str:
  """The launcher's docstring, its flags and the shared ones, and the override syntax."""
  by_module = flags.FLAGS.flags_by_module_dict()
  keys = [module.__name__, getattr(module, "__file__", None), sys.argv[0], __name__, __file__]
  seen, parts = set(), [(module.__doc__ or f"{module.__name__} [flags]").strip(), "", "flags:"]
  for key in keys:
    if key in by_module and key not in seen:
      seen.add(key)
      for flag in sorted(by_module[key], key=lambda f: f.name):
        shown = isinstance(flag.default, str | int | float | list) and flag.default not in ("", [])
        default = f" (default: {flag.default})" if shown else ""  # a config flag's help names its file
        parts.append(f"  --{flag.name}: {flag.help}{default}")
  for name in [n for n in _CONFIGS if n in flags.FLAGS]:
    parts += ["", *presets_help(name)]
  parts += ["", OVERRIDES_HELP, "", "--helpfull lists every flag of every module."]
  return "\n".join(parts) + "\n"


def _parse_flags(argv: list[str]) -> list[str]:
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    fail(str(e))


def run(main: Callable[[list[str]], Any], *, required: Iterable[str] = ("workdir",)) -> None:
  """`app.run(main)` with the launcher conventions (module docstring): `--help` exits 0, a flag
  error is one line with exit 2, logging quiet unless `--verbosity`."""
  module = sys.modules[main.__module__]
  argv = sys.argv
  if any(arg in _HELP for arg in argv[1:]):
    sys.stdout.write(help_text(module))
    sys.exit(0)
  if "--helpfull" in argv[1:]:
    app.usage(writeto_stdout=True)
    sys.exit(0)
  try:  # before any backend starts: the pool the plan budgets against
    memory.set_gpu_fraction()
  except ValueError as e:
    fail(str(e))
  for name in required:
    if flags.FLAGS[name].default is None:  # a config flag given on the command line has its file
      flags.mark_flag_as_required(name)
  verbose = any(re.match(r"--?(verbosity|v)(=|$)", a) for a in argv[1:])

  def quiet_main(args: list[str]) -> Any:
    if not verbose:
      logging.set_verbosity(logging.WARNING)
      for name in ("absl", "orbax", "jax"):
        std_logging.getLogger(name).setLevel(std_logging.WARNING)
      # XLA:CPU cannot reuse every donated buffer; the warning says nothing a user can act on
      warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    return main(args)

  app.run(quiet_main, flags_parser=_parse_flags)

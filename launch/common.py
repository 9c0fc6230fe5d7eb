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

import dataclasses
import difflib
import importlib.util
import logging as std_logging
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn, TypeVar

from absl import app, flags, logging
from ml_collections import config_flags

from lm import memory, progress, rundir

T = TypeVar("T")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # holds configs/, launch/, lm/

WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (created; resumed if it exists).")
ALLOW_CONFIG_CHANGE = flags.DEFINE_bool(
  "allow_config_change",
  False,
  "Resume a run directory whose saved config.json differs beyond the safe keys (the old one is "
  "kept as config.<n>.json). Without it such a rerun stops and names the differing keys.",
)

OVERRIDES_HELP = """\
Config overrides: --<config flag>.<dotted key>=<value>, e.g. --config.train.steps=2 or
'--config.methods=("kace",)'; a preset is chosen with --config=<file>.py:<preset>. An unknown key,
a bad value or a missing input path stops at once with one line and exit status 2.
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


def fail(message: str) -> NoReturn:
  """Stops the launcher: `message` on one line of stderr, exit status 2."""
  prog = os.path.basename(sys.argv[0] or "launcher")
  sys.stderr.write(f"{prog}: error: {' '.join(str(message).split())}\n")
  sys.stderr.flush()
  sys.exit(2)


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
  return module.get_config(preset) if preset else module.get_config()


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


def define_config(name: str, default: str, help_string: str = "") -> flags.FlagHolder:
  """`config_flags.DEFINE_config_file(name, default)`, checked first: the file (from argv or the
  default, resolved by `resolve_config_path`) loads, and every `--name.<key>` override names a key
  of it; else one line and exit 2, before the launcher does anything."""
  argv = sys.argv
  given = _flag_value(argv, name)
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


def typed(flag: flags.FlagHolder, make: Callable[[Any], T]) -> T:
  """`make(flag.value)`, the typed config of a config flag, with every check done before any work:
  the preset's real weights, the typed records' own checks, the input paths. A failure is one line
  naming the field, exit status 2."""
  try:
    for field, hf_id in required_weights(flag.name, flag.value).items():
      _, preset = _CONFIGS[flag.name]
      raise ValueError(
        f"{field} is empty: the {preset} preset needs real weights; download {hf_id} "
        f"(huggingface-cli download {hf_id} --local-dir /path) and pass --{flag.name}.{field}=/path"
      )
    config = make(flag.value)
    check_paths(config, f"--{flag.name}.")
  except (ValueError, TypeError, KeyError) as e:
    fail(str(e) if str(e).startswith(f"--{flag.name}") else f"--{flag.name}: {e}")
  path, preset = _CONFIGS.get(flag.name, ("", ""))
  if _preset_rule(flag.name, "random_init", flag.value, False):
    progress.say(
      f"{os.path.basename(path)}:{preset or '(default)'}: a small model initialised randomly and "
      "trained here, no weights loaded (the qwen3_* presets run on real weights)"
    )
  return config


def work(what: str) -> Any:
  """The progress phase (`lm.progress`) a launcher runs its library call in, once its config is
  checked: a start line, a line at least every 30 s, an end line, whatever the log verbosity."""
  return progress.phase(f"{os.path.basename(sys.argv[0])}: {what}")


def prepare_workdir(config: Any) -> str:
  """`--workdir` created, checked against and stamped with `config` (see the module docstring)."""
  return rundir.prepare_workdir(WORKDIR.value, config, allow_changes=ALLOW_CONFIG_CHANGE.value)


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
        default = "" if flag.default is None else f" (default: {flag.default_as_str or flag.default!r})"
        parts.append(f"  --{flag.name}: {flag.help}{default}")
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

"""Each setting of a run is defined once, by its ``TuneOptions`` field: ``tune()``'s keywords and
``tuner tune``'s flags cannot drift from the fields (names, order, defaults, what each flag sets)."""

from __future__ import annotations

import argparse
import inspect
from dataclasses import fields

import pytest

from tuner.api import tune
from tuner.cli.main import build_parser
from tuner.cli.tune_flags import TUNE_FLAGS, options_from_args
from tuner.options import TuneOptions, describe_settings

FIELDS = [f.name for f in fields(TuneOptions)]
NEEDS = {"--max-cost": ["--price-per-hour", "2"], "--price-per-hour": ["--max-cost", "3"]}  # refused, or idle, alone
DEFAULTS = TuneOptions()


def _tune_command() -> argparse.ArgumentParser:
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices["tune"]


def _sample_value(action: argparse.Action) -> list[str]:
    """A value for ``action``'s flag other than its default."""
    if action.nargs == 0:  # store_true
        return []
    if action.choices:
        return [next(choice for choice in action.choices if choice != action.default)]
    if action.metavar == "N,PCT":
        return ["4,1"]
    if action.metavar == "D0,D1,...":
        return ["1,3,8,8"]
    return ["7"]


def test_tune_takes_every_setting_as_a_keyword_with_its_default():
    parameters = [p for p in inspect.signature(tune).parameters.values() if p.name not in ("model", "trimmer")]
    assert [p.name for p in parameters] == FIELDS
    assert {p.name: p.default for p in parameters} == {name: getattr(DEFAULTS, name) for name in FIELDS}
    for name in FIELDS:  # and its docstring says what each means
        assert f"``{name}``: " in tune.__doc__ and f"``{name}``: " in describe_settings()


def test_every_setting_has_its_flags_and_every_flag_its_setting():
    assert list(TUNE_FLAGS) == FIELDS
    options = {flag for action in _tune_command()._actions for flag in action.option_strings}
    listed = {flag for flags in TUNE_FLAGS.values() for flag in flags}
    assert listed <= options, f"flags named in TUNE_FLAGS that `tuner tune` lacks: {listed - options}"
    assert options - listed == {"-h", "--help"}, f"flags of `tuner tune` that set no setting: {options - listed}"


def test_a_command_line_with_no_flags_is_the_default_options():
    assert options_from_args(build_parser().parse_args(["tune", "matmul-512"])) == DEFAULTS


@pytest.mark.parametrize("setting", FIELDS)
def test_each_flag_sets_its_own_setting_and_no_other(setting):
    actions = {flag: action for action in _tune_command()._actions for flag in action.option_strings}
    for flag in TUNE_FLAGS[setting]:
        command = ["tune", "matmul-512", flag, *_sample_value(actions[flag]), *NEEDS.get(flag, [])]
        args = build_parser().parse_args(command)
        options = options_from_args(args)
        changed = [name for name in FIELDS if getattr(options, name) != getattr(DEFAULTS, name)]
        assert changed == [setting], f"{flag} changed {changed}"


def test_the_torch_compile_options_are_tunes_where_they_share_a_name():
    """``torch.compile``'s options are named as ``tune()`` names them, with ``tune()``'s defaults;
    those of its own (a time budget in minutes, its cache) are not settings of a run."""
    from tuner.torch_compile.backend import OPTION_NAMES, BackendOptions

    own = {"max_minutes", "cache_dir"}
    backend = {f.name: f for f in fields(BackendOptions)}
    assert set(backend) == set(OPTION_NAMES)
    assert set(backend) - own <= set(FIELDS), f"named unlike tune(): {set(backend) - own - set(FIELDS)}"
    for name in set(backend) - own:
        assert backend[name].default == getattr(DEFAULTS, name), name

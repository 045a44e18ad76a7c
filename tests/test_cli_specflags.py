"""The CLI's strategy and training flags are their spec fields: the same values, ranges and
defaults, and what they parse to is what the plan-file spec validates."""

from __future__ import annotations

import argparse
import enum

import pytest

from shardmeter.cli.common import TRAINING_FLAGS
from shardmeter.cli.main import build_parser
from shardmeter.cli.simulate import STRATEGY_FLAGS
from shardmeter.cli.specflags import spec_values
from shardmeter.spec.training import AUTO_FIELD_BOUNDS, StrategySpec, TrainingSpec

BASE = ["--model", "llama-3.2-1b", "--gpu", "a100", "--seq-len", "4096"]


def _actions(command: str) -> dict[str, argparse.Action]:
    sub = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices[command]
    return {o: a for a in sub._actions for o in a.option_strings}


def test_strategy_flags_offer_the_specs_values_and_defaults() -> None:
    actions = _actions("simulate")
    for f in STRATEGY_FLAGS:
        field = StrategySpec.model_fields[f.field]
        action = actions[f.flag]
        if isinstance(field.annotation, type) and issubclass(field.annotation, enum.Enum):
            assert action.metavar == "|".join(m.value for m in field.annotation)
        expected = "fsdp" if f.field == "kind" else field.default  # one island by default
        assert action.default == (expected.value if isinstance(expected, enum.Enum) else expected)
    low, high = AUTO_FIELD_BOUNDS["sync_every"]
    parse = actions["--sync-every"].type
    assert parse is not None
    assert parse(str(high)) == high and parse("auto") == "auto"
    with pytest.raises(argparse.ArgumentTypeError, match=f"between {low} and"):
        parse(str(high + 1))


def test_parsed_strategy_flags_are_the_specs_fields() -> None:
    args = build_parser().parse_args(
        [
            *("simulate", *BASE, "--strategy", "streaming-diloco", "--sync-every", "100"),
            *("--fragments", "4", "--fragment-sync-delay", "2", "--outer-precision", "bf16"),
        ]
    )
    spec = StrategySpec.model_validate(spec_values(args, STRATEGY_FLAGS))
    assert (spec.kind, spec.sync_every, spec.fragments, spec.fragment_sync_delay) == (
        "streaming-diloco",
        100,
        4,
        2,
    )
    assert spec.outer_precision == "bf16"


def test_training_flags_range_and_leave_unset_fields_to_the_spec() -> None:
    actions = _actions("predict")
    for f in TRAINING_FLAGS:
        assert actions[f.flag].default is None  # unset: the spec's own default applies
        assert f.field in TrainingSpec.model_fields
    args = build_parser().parse_args(["predict", *BASE, "--shard-group-nodes", "2"])
    assert {k: v for k, v in spec_values(args, TRAINING_FLAGS).items() if v is not None} == {
        "shard_group_nodes": 2
    }
    with pytest.raises(SystemExit):
        build_parser().parse_args(["predict", *BASE, "--grad-reduce-bytes", "9"])

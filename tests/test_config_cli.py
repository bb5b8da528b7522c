"""Every ``SchedulerConfig`` field is an option of each command that configures a scheduler
(``python -m scheduler_svc``, ``fastserve serve``, ``fastserve sim``), and a value given there
reaches the config the scheduler runs with."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from fastserve.cli import build_parser as fastserve_parser
from fastserve.cli import main as cli_main
from fastserve.cli_serve import scheduler_command
from scheduler_svc.__main__ import build_parser as scheduler_parser
from scheduler_svc.config_args import (
    FIELDS,
    choices,
    config_argv,
    config_from_args,
    field_type,
    option_names,
    parse_value,
)
from scheduler_svc.core.config import SchedulerConfig

# The names the commands had before they were derived from the fields; tests, docs and
# scripts use them.
LEGACY_OPTIONS = ("--policy", "--max-batch-size", "--max-batched-tokens", "--max-waiting",
                  "--default-max-tokens", "--mlfq-num-queues", "--mlfq-ratio",
                  "--mlfq-q1-quantum", "--starve-limit", "--kv-policy", "--kv-headroom-window")


def _subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in fastserve_parser()._actions
               if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


PARSERS = {
    "python -m scheduler_svc": lambda: scheduler_parser(),
    "fastserve serve": lambda: _subparser("serve"),
    "fastserve sim": lambda: _subparser("sim"),
}
# Arguments each command requires besides the settings.
REQUIRED = {"python -m scheduler_svc": ["--workers", "127.0.0.1:1"],
            "fastserve serve": [], "fastserve sim": ["--trace", "t.jsonl"]}


def _other_value(f: dataclasses.Field) -> object:
    """A valid value of field ``f`` other than its default."""
    default = getattr(SchedulerConfig(), f.name)
    values = choices(f)
    if values is not None:
        return next(v for v in reversed(list(values)) if v != default)
    kind, _ = field_type(f.name)
    if kind is bool:
        return not default
    if kind is int:
        return 2 if default is None else default + 1
    if kind is float:
        return 0.5 if default is None else default * 1.5
    raise AssertionError(f"no test value for SchedulerConfig.{f.name} ({kind})")


OTHER = SchedulerConfig(**{f.name: _other_value(f) for f in FIELDS})


def _argv(config: SchedulerConfig, long_names: bool = False) -> list[str]:
    """Options giving every field of ``config``, by short or full option name."""
    argv = []
    for f in FIELDS:
        option = option_names(f)[-1 if long_names else 0]
        value = getattr(config, f.name)
        if isinstance(value, bool):
            argv.append(option if value else "--no-" + option[2:])
        else:
            argv += [option, str(value)]
    return argv


@pytest.mark.parametrize("command", PARSERS)
def test_every_field_is_an_option_of_every_command(command):
    parser = PARSERS[command]()
    by_dest = {a.dest: a for a in parser._actions}
    missing = [f.name for f in FIELDS if f.name not in by_dest]
    assert not missing, f"{command} lacks options for SchedulerConfig fields {missing}"
    for f in FIELDS:
        action = by_dest[f.name]
        assert set(option_names(f)) <= set(action.option_strings), (command, f.name)
        assert f.metadata["help"] in action.help.replace("%%", "%")
        values = choices(f)
        assert (list(values) if values is not None else None) == action.choices
    options = {s for a in parser._actions for s in a.option_strings}
    assert set(LEGACY_OPTIONS) <= options


@pytest.mark.parametrize("long_names", [False, True])
@pytest.mark.parametrize("command", PARSERS)
def test_a_parsed_value_reaches_the_config(command, long_names):
    parser = PARSERS[command]()
    args = parser.parse_args([*REQUIRED[command], *_argv(OTHER, long_names)])
    assert config_from_args(args) == OTHER
    # Not given: the config's defaults, whether the command fills them in or leaves them None;
    # serve's own policy (the winner of the real-cluster comparison) aside.
    want = SchedulerConfig(policy="predictive") if command == "fastserve serve" else (
        SchedulerConfig())
    assert config_from_args(parser.parse_args(REQUIRED[command])) == want


def test_the_policy_choices_are_the_registered_policies():
    names = choices(next(f for f in FIELDS if f.name == "policy"))
    assert {"fcfs", "rtc", "mlfq", "skip-join-mlfq", "fixed-priority", "srpt-oracle"} <= set(names)
    with pytest.raises(SystemExit):
        scheduler_parser().parse_args(["--workers", "w", "--policy", "nope"])


def test_serve_passes_the_given_settings_on_to_the_scheduler_and_no_others():
    serve = _subparser("serve")
    args = serve.parse_args(_argv(OTHER))
    cmd = scheduler_command(args, "127.0.0.1:1")
    tail = cmd[cmd.index("scheduler_svc") + 1:]
    assert config_from_args(scheduler_parser().parse_args(tail)) == OTHER
    args = serve.parse_args(["--starve-limit", "0.3"])
    assert config_argv(args) == ["--policy", "predictive", "--starve-limit", "0.3"]
    assert "--max-batch-size" not in scheduler_command(args, "127.0.0.1:1")


def test_optional_fields_take_none():
    assert parse_value("mlfq_q1_quantum_s", "none") is None
    assert parse_value("mlfq_q1_quantum_s", "0.25") == 0.25
    with pytest.raises(ValueError, match="expected int"):
        parse_value("max_batch_size", "many")
    args = scheduler_parser().parse_args(["--workers", "w", "--mlfq-q1-quantum", "none"])
    assert config_from_args(args).mlfq_q1_quantum_s is None


def test_sim_runs_with_the_settings_given_as_options(tmp_path, monkeypatch, capsys):
    import scheduler_svc.sim

    seen = []
    real = scheduler_svc.sim.simulate

    def spy(requests, config, **kw):
        seen.append(config)
        return real(requests, config=config, **kw)

    monkeypatch.setattr(scheduler_svc.sim, "simulate", spy)
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": i * 0.1, "input_tokens": 8,
                                         "output_tokens": 4}) + "\n" for i in range(4)))
    argv = ["sim", "--trace", str(trace), "--num-blocks", "64", "--policy", "rtc",
            "--max-batch-size", "3", "--starve-limit", "0.5", "--set", "starve_limit_s=2",
            "--set", "watermark=0.02", "--kv-policies", "defer,recompute"]
    assert cli_main(argv) == 0
    assert [(c.policy, c.kv_policy) for c in seen] == [("rtc", "defer"), ("rtc", "recompute")]
    # an option wins over --set; --set fills in what no option gives
    assert {(c.max_batch_size, c.starve_limit_s, c.watermark) for c in seen} == {(3, 0.5, 0.02)}
    assert "max batch 3" in capsys.readouterr().out


def test_serve_runs_the_winning_policy_by_default_and_the_scheduler_keeps_fcfs():
    from fastserve.cli import build_parser
    from scheduler_svc.config_args import config_argv
    from scheduler_svc.core.config import SchedulerConfig

    parser = build_parser()
    assert config_argv(parser.parse_args(["serve"])) == ["--policy", "predictive"]
    assert config_argv(parser.parse_args(["serve", "--policy", "fcfs"])) == ["--policy", "fcfs"]
    assert SchedulerConfig().policy == "fcfs"

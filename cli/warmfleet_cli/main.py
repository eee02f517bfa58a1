"""`warmfleet`: the daemon (`serve`), model conversion (`convert`), benchmarks against any
OpenAI-compatible server (`bench-serve`, `bench-compare`), the prefix audit of a
request log (`audit`), agents' warm prompts (`warm-prompts capture`), and simulated
fleets (`sim`) that say how many Macs a team needs (`plan`)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """A subcommand: where its arguments and its handler live, imported only when it runs
    (as mlx-lm's cli.py does), so `warmfleet router --help` loads neither mlx nor kopf."""

    module: str
    help: str
    add_arguments: str = "add_arguments"  # (argparse.ArgumentParser) -> None
    run: str = "run"  # (argparse.Namespace) -> int


COMMANDS: dict[str, Command] = {
    "serve": Command(
        "warmfleet_daemon.cli",
        "run the daemon (OpenAI API + prefix cache)",
        "add_serve_arguments",
        "serve",
    ),
    "service": Command(
        "warmfleet_daemon.cli",
        "run the daemon as a launchd (macOS) or systemd (Linux) service",
        "add_service_arguments",
        "run_service",
    ),
    "convert": Command(
        "warmfleet_daemon.cli",
        "write a model (e.g. `default`) as an mlx-lm directory",
        "add_convert_arguments",
        "convert",
    ),
    "bench-serve": Command(
        "warmfleet_cli.bench_serve.cli",
        "measure TTFT, throughput and cached tokens of an OpenAI-compatible server",
        "add_serve_arguments",
        "serve",
    ),
    "bench-compare": Command(
        "warmfleet_cli.bench_serve.cli",
        "compare two bench-serve runs (cold vs warm): a table and a PNG plot",
        "add_compare_arguments",
        "compare",
    ),
    "audit": Command(
        "warmfleet_cli.audit.cli", "find what breaks the prefix-cache hit rate in a log of requests"
    ),
    "operator": Command(
        "warmfleet_operator.cli", "the Kubernetes operator (or --local DIR without one)"
    ),
    "router": Command(
        "warmfleet_router.cli",
        "the OpenAI-compatible gateway: each request to the daemon holding its prefix",
    ),
    "up": Command(
        "warmfleet_cli.up",
        "the fleet on one machine: N daemons, the operator (local mode), the router",
    ),
    "sim": Command(
        "warmfleet_cli.sim.cli",
        "a simulated fleet: `trace` writes agents' sessions, `run` replays them on one",
    ),
    "plan": Command(
        "warmfleet_cli.sim.cli",
        "how many Macs for how many developers: simulated fleets of a profiled Mac",
        "add_plan_arguments",
        "run_plan",
    ),
    "warm-prompts": Command(
        "warmfleet_cli.warm_prompts.cli",
        "warm prompts from the agents themselves: `capture` records an agent's first request",
    ),
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="warmfleet", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    # The top level has no options but -h, so the first other word names the command.
    chosen = next((a for a in argv if not a.startswith("-")), None)
    run: Callable[[argparse.Namespace], int] | None = None
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.help)
        if name == chosen:
            module = importlib.import_module(command.module)
            getattr(module, command.add_arguments)(p)
            run = getattr(module, command.run)
    args = parser.parse_args(argv)
    assert run is not None  # argparse exits on an unknown or missing command
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

"""Before and after on one machine: the producer of another revision against this one.

``make bench-compare BEFORE=<rev>`` (``python -m devstack.compare --before <rev>``) checks
the revision out into a temporary git worktree and alternates, round by round on the same
emulators: the ledger ceiling and the plain ``put_records`` baseline (this revision's bench
code), then one producer run of each revision, each in a process of its own.

Before the timed rounds, ``--warm-up`` rounds run both producers untimed: a JVM emulator
(DynamoDB Local) compiles its hot paths during its first minute, and the first producer to
run would pay for it. When the command starts the local stack itself, DynamoDB Local's JVM is
tuned for throughput (``devstack.emulators.JvmProfile``), and ``--in-memory`` keeps its SQLite
in memory (on disk, SQLite syncs every write). Where the emulator runs PartiQL, each round
also measures its rate of claims written 25 to a request: the ceiling of batched claims.

A shared machine's speed drifts by a third within minutes, and ``keo bench`` runs taken
minutes apart drift apart. Runs taken side by side drift together: the ratio of the two
producers' rates holds when the rates themselves do not. It is also the ratio of their
ratios to plain ``put_records``, the baseline being the same.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from devstack import emulators

# Runs in the revision under test (its tree first on sys.path): only names every revision
# since the first ledger has.
_PRODUCER_RUN = """
import json, os, sys, time
from devstack.bench import Bench, _messages
from producer.settings import ProducerSettings
from producer.wiring import build_stack

count, concurrency, dedupe = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
bench = Bench(ProducerSettings(stream="compare", table="compare"))
settings = bench._fresh("compare", ledger_concurrency=concurrency)
messages = _messages(count, 200, "compare")
stack = build_stack(settings)
if dedupe == "replay":  # one run, sent whole (send_run: every revision with replay mode has it)
    cpu, wall = time.process_time(), time.perf_counter()
    outcomes = stack.replay_producer().send_run(f"compare-{os.getpid()}", messages)
    delivered = sum(1 for outcome in outcomes if outcome.delivered)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
else:
    with stack.producer(owner="compare") as producer:
        cpu, wall = time.process_time(), time.perf_counter()
        delivered = 0
        for start in range(0, count, 5000):
            outcomes = producer.send(messages[start : start + 5000])
            delivered += sum(1 for outcome in outcomes if outcome.delivered)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
print(json.dumps({
    "delivered": delivered,
    "messages_per_second": round(delivered / wall, 1),
    "client_cpu_ms_per_message": round(cpu * 1000 / max(delivered, 1), 3),
}))
"""


_ROOT = Path(__file__).resolve().parent.parent  # the tree this module is in: "this tree"


def producer_run(tree: Path, count: int, concurrency: int, dedupe: str = "key") -> dict[str, Any]:
    """One producer run of the code in ``tree``, in ``dedupe`` mode, in a process of its own."""
    done = subprocess.run(
        [sys.executable, "-c", _PRODUCER_RUN, str(count), str(concurrency), dedupe],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the producer of {tree} failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if result["delivered"] != count:
        raise RuntimeError(f"the producer of {tree} delivered {result['delivered']} of {count}")
    return result


def summary(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the rounds; ratios are taken within each round, then their median."""

    # the rounds that measured the emulator's batched claims (it runs PartiQL)
    batched = [r for r in rounds if r.get("batch_ceiling_claims_per_second")]

    def median(
        figure: Callable[[dict[str, Any]], float], over: Sequence[dict[str, Any]] = rounds
    ) -> float:
        return round(statistics.median(figure(r) for r in over), 4)

    def side(name: str) -> dict[str, float]:
        return {
            **(
                {
                    "batch_ceiling_fraction": median(
                        lambda r: (
                            r[name]["messages_per_second"] / r["batch_ceiling_claims_per_second"]
                        ),
                        over=batched,
                    )
                }
                if batched
                else {}
            ),
            "messages_per_second": median(lambda r: r[name]["messages_per_second"]),
            "client_cpu_ms_per_message": median(lambda r: r[name]["client_cpu_ms_per_message"]),
            "ratio_to_baseline": median(
                lambda r: r[name]["messages_per_second"] / r["baseline_messages_per_second"]
            ),
            "ceiling_fraction": median(
                lambda r: r[name]["messages_per_second"] / r["ceiling_messages_per_second"]
            ),
        }

    def speedup(r: dict[str, Any]) -> float:
        return float(r["after"]["messages_per_second"] / r["before"]["messages_per_second"])

    return {
        "rounds": len(rounds),
        "baseline_messages_per_second": median(lambda r: r["baseline_messages_per_second"]),
        "ceiling_messages_per_second": median(lambda r: r["ceiling_messages_per_second"]),
        **(
            {
                "batch_ceiling_claims_per_second": round(
                    median(lambda r: r["batch_ceiling_claims_per_second"], over=batched), 1
                )
            }
            if batched
            else {}
        ),
        "before": side("before"),
        "after": side("after"),
        "after_over_before": {
            "messages_per_second": median(speedup),
            "rounds_at_least_2x": sum(1 for r in rounds if speedup(r) >= 2),
            "client_cpu_ms_per_message": median(
                lambda r: (
                    r["after"]["client_cpu_ms_per_message"]
                    / r["before"]["client_cpu_ms_per_message"]
                )
            ),
        },
    }


def _revision(ref: str, cwd: Path) -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", ref], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout.strip()


def compare(
    before: str,
    *,
    rounds: int,
    count: int,
    concurrency: int,
    say: Callable[[str], None],
    warm_up: int = 0,
    dedupe: str = "key",
) -> dict[str, Any]:
    from devstack.bench import Bench, load_average, machine
    from producer.settings import ProducerSettings

    here = _ROOT
    bench = Bench(ProducerSettings(stream="compare", table="compare"))
    load_at_start = load_average()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="keo-compare-") as scratch:
        tree = Path(scratch) / "before"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "--quiet", str(tree), before],
            cwd=here,
            check=True,
        )
        try:
            for n in range(1, warm_up + 1):
                say(f"warm-up {n}/{warm_up} (untimed): {before}, this tree")
                producer_run(tree, count, concurrency, dedupe)
                producer_run(here, count, concurrency, dedupe)
            for n in range(1, rounds + 1):
                say(f"round {n}/{rounds}: ceilings, baseline, {before}, this tree")
                ceiling = bench.ledger_ceiling(count, concurrency)
                batch_ceiling = bench.ledger_batch_ceiling(count, concurrency)
                baseline = bench.baseline(count, 200)
                results.append(
                    {
                        "ceiling_messages_per_second": ceiling["messages_per_second_ceiling"],
                        **(
                            {"batch_ceiling_claims_per_second": batch_ceiling["claims_per_second"]}
                            if batch_ceiling is not None
                            else {}
                        ),
                        "baseline_messages_per_second": baseline["messages_per_second"],
                        "before": producer_run(tree, count, concurrency, dedupe),
                        "after": producer_run(here, count, concurrency, dedupe),
                    }
                )
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(tree)], cwd=here, check=False
            )
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(load_at_start),
        "before": {"ref": before, "revision": _revision(before, here)},
        "after": {"ref": "this tree", "revision": _revision("HEAD", here)},
        "dedupe": dedupe,
        "messages": count,
        "warm_up_rounds": warm_up,
        "message_bytes": 200,
        "concurrency": concurrency,
        "summary": summary(results),
        "rounds": results,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the git revision to compare with")
    parser.add_argument("--rounds", type=int, default=6, help="alternating rounds (default 6)")
    parser.add_argument(
        "--messages",
        type=int,
        default=20_000,
        help=(
            "per producer run (default 20,000: about 6 s for a batched producer, so a run's "
            "fixed start and end, its connections, first open and last put, count a few percent)"
        ),
    )
    parser.add_argument("--concurrency", type=int, default=32, help="ledger concurrency")
    parser.add_argument(
        "--dedupe",
        choices=("key", "replay"),
        default="key",
        help="the producers' mode: key (ExactlyOnceProducer) or replay (one run, send_run)",
    )
    parser.add_argument("--state-dir", type=Path, default=Path(".keo"), help="local stack")
    parser.add_argument(
        "--dynamodb-emulator",
        choices=emulators.DYNAMODB_EMULATORS,
        default=os.environ.get("KEO_DYNAMODB_EMULATOR", emulators.DYNAMODB_LOCAL),
        help="the local stack's DynamoDB, when the endpoints are not set (default "
        "$KEO_DYNAMODB_EMULATOR, else dynamodb-local, which runs PartiQL; dynalite does not)",
    )
    parser.add_argument(
        "--warm-up", type=int, default=1, help="untimed rounds of both producers first (default 1)"
    )
    parser.add_argument(
        "--in-memory",
        action="store_true",
        help="when the stack is started here: its emulators keep their stores in memory",
    )
    parser.add_argument("--output", type=Path, help="default bench/results/compare-<date>.json")
    args = parser.parse_args(argv)

    def say(text: str) -> None:
        print(f"bench-compare: {text}", file=sys.stderr, flush=True)

    try:
        _revision(args.before, _ROOT)
    except subprocess.CalledProcessError:
        say(f"not a git revision here: {args.before!r}")
        return 2
    if not (
        os.environ.get("KEO_KINESIS_ENDPOINT_URL") and os.environ.get("KEO_DYNAMODB_ENDPOINT_URL")
    ):
        started = emulators.up(
            args.state_dir,
            dynamodb=args.dynamodb_emulator,
            in_memory=args.in_memory,
            dynamodb_local_jvm=emulators.JvmProfile.THROUGHPUT,
        )
        os.environ.update(started.as_env())
    results = compare(
        args.before,
        rounds=args.rounds,
        count=args.messages,
        concurrency=args.concurrency,
        say=say,
        warm_up=args.warm_up,
        dedupe=args.dedupe,
    )
    name = f"compare-{time.strftime('%Y-%m-%d')}{'-replay' if args.dedupe == 'replay' else ''}"
    target = args.output or Path("bench/results") / f"{name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(results["summary"], indent=2))
    say(f"results in {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Scheduling commands: ``sluice pause`` and ``sluice resume`` stop and restart the starting of jobs
(of one dataset or all); ``sluice priority`` and ``sluice run-next`` choose what starts first."""

from __future__ import annotations

import sys

from sluice.cli.output import print_json, report

# The operations are imported by the commands that run them: building the parser imports nothing
# heavy (a cold `sluice search` pays only for what it uses).


def _dataset_id(name: str | None) -> int | None:
    from sluice.ops import reads

    try:
        return reads.dataset_id(name)
    except reads.UnknownDatasetName as exc:
        raise SystemExit(f"sluice: {exc}") from None


def _show(json_out: bool) -> None:
    from sluice.ops import pausing

    now = pausing.active()
    if json_out:
        print_json(now)
    elif not now:
        print("nothing is paused")
    else:
        for p in now:
            print(p["text"])


def pause(args) -> int:
    from sluice.ops import pausing
    from sluice.ops.access import cli_operator

    if args.list:
        _show(args.json)
        return 0
    done = pausing.pause(
        cli_operator(), dataset_id=_dataset_id(args.dataset), reason=args.reason or ""
    )
    print(done.message, file=sys.stdout if done.ok else sys.stderr)
    return 0 if done.ok else 1


def resume(args) -> int:
    from sluice.ops import pausing
    from sluice.ops.access import cli_operator

    done = pausing.resume(cli_operator(), dataset_id=_dataset_id(args.dataset))
    print(done.message, file=sys.stdout if done.ok else sys.stderr)
    if done.queue_note:
        print(f"sluice: {done.queue_note}", file=sys.stderr)
    return 0 if done.ok else 1


def add_pause_commands(sub) -> None:
    a = sub.add_parser(
        "pause", help="stop starting jobs of one dataset or of the whole queue; running jobs finish"
    )
    a.add_argument("--dataset", help="only this dataset (default: the whole queue)")
    a.add_argument("--reason", help="why, shown to other operators")
    a.add_argument(
        "--list", action="store_true", help="only show what is paused, by whom, since when"
    )
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=pause)

    a = sub.add_parser("resume", help="lift a pause and publish the jobs that waited")
    a.add_argument("--dataset", help="only this dataset (default: the whole-queue pause)")
    a.set_defaults(func=resume)


def run_next(args) -> int:
    from sluice.ops import actions
    from sluice.ops.access import cli_operator

    done = actions.run_next(cli_operator(), args.job_ids)
    return report(done.results, note=done.queue_note)


def priority(args) -> int:
    from sluice.ops import actions
    from sluice.ops.access import cli_operator

    value = None if args.priority.lower() == "default" else int(args.priority)
    if args.dataset:
        if args.job_ids:
            raise SystemExit("sluice: give job ids or --dataset, not both")
        dataset_id = _dataset_id(args.dataset)
        if dataset_id is None:  # only for an empty name
            raise SystemExit("sluice: --dataset needs a dataset's name")
        ok, message = actions.set_dataset_priority(cli_operator(), dataset_id, value)
        print(message, file=sys.stdout if ok else sys.stderr)
        return 0 if ok else 1
    if not args.job_ids:
        raise SystemExit("sluice: give job ids or --dataset NAME")
    done = actions.set_priority(cli_operator(), args.job_ids, value)
    return report(done.results, note=done.queue_note)


def add_priority_commands(sub) -> None:
    a = sub.add_parser("run-next", help="move waiting jobs to the front of the queue")
    a.add_argument("job_ids", nargs="+", type=int)
    a.set_defaults(func=run_next)

    a = sub.add_parser(
        "priority", help="set the priority of waiting jobs or of a dataset (higher starts first)"
    )
    a.add_argument("priority", help="an integer (default 0), or 'default' to clear it")
    a.add_argument("job_ids", nargs="*", type=int)
    a.add_argument("--dataset", help="the dataset's priority, for its jobs without their own")
    a.set_defaults(func=priority)

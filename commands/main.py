"""The `mule` command.

    mule demo [--dataset coco] [--train-images N ...]    the whole pipeline on a generated dataset
    mule run STAGE... [--dataset NAME --source PATH]     some stages (or `all`)
    mule ui [--workdir DIR] [--open]                     MLflow UI on the workdir's store, at the runs
    mule serve [--version N] [--port 8000]               a search page and JSON API (the champion)
    mule config [--preset P] [--set K=V ...]             the resolved config
    mule catalog [--workdir DIR]                         what the catalog holds
    mule search "TEXT" [--lang de] [--k 5] [--out PNG]   images for a sentence (the registry's champion)
    mule search --image PATH                             sentences for an image, per language

The workdir is --workdir, else $MULE_HOME, else ./mule-work.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from pathlib import Path

from mule.commands import catalog, embed, export, run, search, serve, ui
from mule.commands.parser import DEMO_DATASETS, build_parser
from mule.config.overrides import parse_assignments, to_dict
from mule.config.resolution import resolve
from mule.mule_core.errors import is_user_error
from mule.pipeline.declaration import REBUILD, checked_stages

# what the system says of a place that cannot be written: read-only, not ours, full
UNWRITABLE = {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT}
READING = {"ui": ui.run, "catalog": catalog.run, "search": search.run, "serve": serve.run,
           "export": export.run, "embed": embed.run}  # read the workdir, never write its data (commands/__init__.py)


def overrides_from(args: argparse.Namespace) -> dict[str, str]:
    overrides = parse_assignments(args.assignments)
    for option, key in (("dataset", "data.dataset"), ("source", "data.source"), ("images", "data.images"),
                        ("lang", "add.languages")):  # fmt: skip
        value = getattr(args, option, None)
        if value:
            overrides[key] = value
    if getattr(args, "captions", None):  # files named from where the command runs
        from mule.config.sections import caption_file

        given = [caption_file(item) for item in args.captions]
        overrides["add.captions"] = ",".join(f"{lang}={Path(path).expanduser().resolve()}" if lang
                                                   else str(Path(path).expanduser().resolve()) for lang, path in given)  # fmt: skip
    return overrides


def _console(args: argparse.Namespace) -> None:
    """The console for people and the run's log file (commands/console.py): in the workdir
    a command writes (made now, as the command would), or reads when it exists."""
    from mule.commands import console
    from mule.storage.workdir import Workdir

    workdir = getattr(args, "workdir", None)
    root = None
    if args.command in ("demo", "run"):
        root = Workdir.at(workdir).root
    elif args.command in READING:  # a reading command makes nothing: a log only in a workdir mule made
        found = Workdir.at(workdir, create=False).root
        root = found if (found / "workdir.json").is_file() else None
    args.run_log = console.setup(args.command, root, verbose=getattr(args, "verbose", False))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
    _console(args)
    try:
        return _command(args)
    finally:
        from mule.commands import console

        console.teardown()


def _check_dataset(args: argparse.Namespace) -> None:
    """--dataset is a name, which becomes file names inside the workdir; a folder given there
    is what --source takes."""
    value = getattr(args, "dataset", None)
    if not value or args.command == "demo":
        return
    if ("/" in value or os.sep in value) and Path(value).expanduser().is_dir():
        from mule.mule_core.settings import ConfigError

        raise ConfigError(f"--dataset {value} is a folder: --dataset names the dataset in the catalog (any name, e.g. "
                          f"{Path(value).name or 'photos'}), and --source is the folder that holds its files: "
                          f"--dataset {Path(value).name or 'photos'} --source {value}")  # fmt: skip
    from mule.storage.workdir import check_name

    check_name(value, "--dataset")


def _command(args: argparse.Namespace) -> int:
    if os.environ.get("MULE_CRASH_AT") or os.environ.get("MULE_BUG_AT"):  # tests that kill runs ask for it
        from mule.storage import faults

        faults.install()
    try:
        _check_dataset(args)
        if args.command == "demo":
            overrides = parse_assignments(args.assignments)
            overrides.update({"data.dataset": DEMO_DATASETS[args.dataset], "data.seed": args.seed})
            for option in ("train_images", "val_images", "test_images"):
                if getattr(args, option) is not None:
                    overrides[f"data.{option}"] = getattr(args, option)
            return run.run(args, list(REBUILD), overrides)
        if args.command == "run":
            return run.run(args, checked_stages(args.stages), overrides_from(args))
        if args.command == "config":
            if args.list:
                from mule.config.presets import FOLDER, PRESETS, SUMMARIES

                width = max(map(len, PRESETS))
                for name in PRESETS:
                    print(f"{name:<{width}}  {SUMMARIES[name]} ({len(PRESETS[name])} options set)")
                print(f"(files: {FOLDER}; a run that names none: demo on the generated dataset; on any other "
                      f"few-photos under 2,000 photos, some-photos under 15,000, else default)")  # fmt: skip
                return 0
            print(json.dumps(to_dict(resolve(args.preset, overrides_from(args))), indent=2))
            return 0
        return READING[args.command](args)
    except KeyboardInterrupt as stop:
        from mule.stopping.interrupts import Interrupted, finish

        if isinstance(stop, Interrupted):
            return finish(stop.signum)  # the cleanups, the one line
        print("mule: interrupted; run the same command to resume", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 - one clear line for the errors users can fix
        from mule.stopping.interrupts import finish, stopping

        if (signum := stopping()) is not None:  # an error the stop caused while unwinding: the stop is the news
            return finish(signum)
        if is_user_error(error):
            print(f"mule: error: {error}", file=sys.stderr)
            return 2
        if isinstance(error, OSError) and error.errno in UNWRITABLE and error.filename:  # a place, not a bug
            print(f"mule: error: cannot write {error.filename}: {error.strerror} (name a place that can be written)",
                  file=sys.stderr)  # fmt: skip
            return 2
        raise  # a bug: its traceback is what we need
    return 0


def entry() -> None:
    """The console script. After the command, the exit handlers run (Prefect drains its
    logs and events, the temporary server stops); then the process ends without the
    interpreter's teardown of torch and the rest, which takes seconds and writes nothing."""
    from mule.stopping import command

    command.install_stop_handlers()
    code = main()
    import atexit

    from mule.stopping.interrupts import stopped_exit

    stopped_exit()  # what the rooms registered for a stopped exit (Prefect's log drain skipped)

    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()

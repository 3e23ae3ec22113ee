"""`mule serve`: the search page and JSON API on the champion (serving.app, serving.live)."""

from __future__ import annotations

import argparse
import time

from mule.commands.options import browsable, reading_workdir
from mule.config.overrides import index_section, parse_assignments
from mule.mule_core.devices import idle_threads_sleep
from mule.mule_core.settings import ConfigError

# What `mule serve` reads of the config: given to it, never taken from the trained model's
# stored config (a model trained before a change would keep the old value for ever).
SERVING_OPTIONS = ("index.breadth", "index.min_images")


def serving_options(assignments: list[str]):
    """The index section for `mule serve`: the defaults, and the --set serving options."""
    overrides = parse_assignments(assignments)
    other = [k for k in overrides if k not in SERVING_OPTIONS]
    if other:
        raise ConfigError(f"mule serve: {', '.join(other)} is not a serving option; serving options are "
                          f"{', '.join(SERVING_OPTIONS)} (the model's own settings come with the model)")  # fmt: skip
    return index_section(overrides)


def run(args: argparse.Namespace) -> int:
    idle_threads_sleep(always=True)  # a server shares the machine with rebuilds: its threads never spin
    if not 1 <= args.port <= 65535:
        raise ConfigError(f"--port must be between 1 and 65535, got {args.port}")
    if args.max_upload_mb <= 0:
        raise ConfigError(f"--max-upload-mb must be positive, got {args.max_upload_mb}")

    if args.max_megapixels <= 0 or args.max_in_flight < 1 or args.threads < 0:
        raise ConfigError("--max-megapixels and --max-in-flight must be positive, --threads at least 0")
    options = serving_options(args.assignments)
    if (args.reload < 0 or args.header_timeout <= 0 or args.body_timeout <= 0 or args.send_timeout <= 0
            or args.max_uploads < 1):  # fmt: skip
        raise ConfigError("--reload must be at least 0, --header-timeout, --body-timeout and --send-timeout positive, "
                          "--max-uploads at least 1")  # fmt: skip
    from mule.serving import live as serving

    started = time.perf_counter()
    workdir = reading_workdir(args.workdir, "serve")
    request = serving.Request(workdir, args.dataset, args.run, args.version, args.split, args.index, options.breadth,
                              options.min_images)  # fmt: skip
    served, source, how = serving.load(request)
    embedder, gallery = served.embedder, served.gallery
    weights = embedder.warm_up()  # before the first queries, not during them
    captions = sum(len(c.ids) for c in gallery.captions.values())
    print(f"{embedder.label}: {len(gallery.image_ids):,} images and {captions:,} sentences "
          f"({', '.join(gallery.captions)}) of {args.dataset} ({args.split}) embedded in "
          f"{time.perf_counter() - started:.1f} s, {gallery.nbytes / 2**20:.1f} MiB; images searched by "
          f"{how}; image extractor {embedder.extractor} ({weights})", flush=True)  # fmt: skip
    import uvicorn

    from mule.serving.app import Limits, Live, allowed_hosts_for, create_app, deadline_protocol

    live = Live(served)
    limits = Limits(max_upload_bytes=int(args.max_upload_mb * 2**20), max_pixels=int(args.max_megapixels * 1e6),
                    max_in_flight=args.max_in_flight, max_uploads=args.max_uploads, body_timeout=args.body_timeout,
                    cpu_threads=args.threads or None,
                    allowed_hosts=allowed_hosts_for(args.host, tuple(args.allowed_host)))  # fmt: skip
    app = create_app(embedder, gallery, args.dataset, limits, live=live)
    if args.reload:  # a new champion or new gallery images, served without a restart
        serving.Reloader(request, live, source, args.reload).start()
    print(f"search page: http://{browsable(args.host)}:{args.port}/  (JSON API: /api/search?q=..., "
          f"POST /api/image; Ctrl-C stops)", flush=True)  # fmt: skip
    from mule.stopping import interrupts

    interrupts.install(lambda signum: f"mule serve: stopped by {interrupts.how(signum)}; port {args.port} is free")
    # uvicorn takes Ctrl-C and SIGTERM while it serves and stops (answers in flight get a
    # second); it swallows the KeyboardInterrupt it raises again, so ask what stopped it.
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=1,
                http=deadline_protocol(args.header_timeout, args.send_timeout))  # fmt: skip
    stopped_by = interrupts.stopping()
    return interrupts.finish(stopped_by) if stopped_by else 0

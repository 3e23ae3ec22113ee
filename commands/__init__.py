"""The `mule` command: its parser and dispatch (main.py), and one module per command.

Commands that run stages (demo, run) hand them to the rebuild (pipeline.rebuild, with
Prefect's flows when a stage has to run); the reading commands (serve, search, catalog, ui,
export, embed) read a workdir a run may be writing, and never write its data (export and
embed write only outside it; ui writes into MLflow the runs no-change rebuilds left to
record, under the workdir's lock); config prints the resolved config.

Whether torch's idle threads sleep is decided where a command is about to compute with
torch (run's stages, search's query; serve always), not when the package is imported:
the decision samples the CPUs for 0.1 s, which a rebuild with nothing to run never needs.
"""

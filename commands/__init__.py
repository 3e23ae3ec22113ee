"""The `mule` command: its parser and dispatch (main.py), and one module per command.

Commands that run stages (demo, run) hand them to the rebuild (pipeline.rebuild, with
Prefect's flows when a stage has to run); the reading commands (serve, search, catalog, ui)
read a workdir a run may be writing, and never write it; config prints the resolved config.
"""

from mule.mule_core.devices import idle_threads_sleep

idle_threads_sleep()  # before anything imports torch: on a busy machine, idle threads sleep, not spin

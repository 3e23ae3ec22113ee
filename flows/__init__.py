"""Prefect flows (one per stage, per sweep, and `rebuild`): wiring only; the `mule`
command line is commands/.

Import flows.environment first: Prefect reads its settings when it is imported.
"""

from mule.mule_core.devices import idle_threads_sleep

idle_threads_sleep()  # a Prefect worker imports the flows before torch: on a busy machine, idle threads sleep

"""What a stop does: Ctrl-C and SIGTERM become one exception in the main thread, a watchdog
ends a process that C code keeps from stopping, and the cleanups registered with `on_stop`
run once (interrupts.py), for the commands, the flows and `mule serve` alike; what a
`mule` command ends when stopped: its open MLflow and Prefect runs (command.py)."""

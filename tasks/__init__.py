"""Prefect tasks: thin units of work around mule_core and the data catalog."""

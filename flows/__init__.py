"""Prefect flows (one per stage, and `rebuild`) and the `mule` command line.

Import flows.runtime first: Prefect reads its settings when it is imported.
"""

"""Experiment tracking around the stages: MLflow runs, the model registry, a moved
workdir's stored paths, and the reports and figures logged with the runs."""

"""The file MLflow loads a registered mule model from ("models from code": the class is
imported, not unpickled). serving/mlflow_model.py logs it; the model's own copy of it is
what `mlflow.pyfunc.load_model` runs."""

import mlflow

from mule.serving.mlflow_model import MuleEmbeddings

mlflow.models.set_model(MuleEmbeddings())

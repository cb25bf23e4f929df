"""Registers the Batch inference UI plugin (:mod:`batch_inference.ui.plugin`) from the Airflow plugins
folder. The packages beside this file are kept out of the plugin manager by ``.airflowignore``."""

from batch_inference.ui.plugin import BatchInferencePlugin

__all__ = ["BatchInferencePlugin"]

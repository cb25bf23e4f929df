"""Worker engines. See :mod:`batch_worker.engines.base` for the interface and the registry."""

"""The OpenAI-compatible Files + Batches API on the Airflow API server (``docs/openai-batch.md``)."""

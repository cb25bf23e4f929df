"""The OpenAI API suite's fixtures (defined in ``openai_helpers``, which the tests import helpers from)."""

from openai_helpers import airflow, client, summary, tiny_llm, viewer  # noqa: F401

"""Prompt rendering for the LLM engine: an alias of :mod:`batch_contract.prompting`.

The sandboxed user template, the chat template and the tokenizer step are shared by both sides since the
planner renders prompts too (the prefix-aware plan, :mod:`batch_inference.prefix_plan`), so the module
lives in the contract. Importing ``batch_worker.prompting`` gives that very module object (every name,
private ones included), so existing imports keep working and there is one sandbox, never two.
"""

from __future__ import annotations

import sys

from batch_contract import prompting as _prompting

sys.modules[__name__] = _prompting

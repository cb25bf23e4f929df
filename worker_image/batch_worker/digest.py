"""Model digest (the rule lives in the contract: :mod:`batch_contract.modeldigest`)."""

from batch_contract.modeldigest import DIGEST_SUFFIXES, model_digest

__all__ = ["DIGEST_SUFFIXES", "model_digest"]

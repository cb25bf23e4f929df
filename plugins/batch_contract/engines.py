"""The one registry of engine kinds: :class:`~batch_contract.enums.EngineKind` -> config class.

Every other per-engine list derives from :class:`EngineKind` or from :data:`ENGINE_CONFIG_TYPES`: the
``engine`` Param's allowed values (``batch_inference.params``), the worker's engine classes (module
``batch_worker.engines.<kind>``, see ``batch_worker.engines.base.engine_class``). Adding an engine is one
``EngineKind`` member, one config class here, one engine class in the worker (``docs/extending.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from batch_contract.engine_config import ConfigError, EncoderConfig
from batch_contract.enums import EngineKind
from batch_contract.llm_config import LLMConfig

EngineConfig = EncoderConfig | LLMConfig
"""Any engine config object (each is a frozen dataclass with ``kind``, ``to_dict`` and ``from_dict``)."""

DEFAULT_ENGINE_KIND = EngineKind.ENCODER
"""The kind of an engine dict without ``kind`` (and the ``engine`` Param's default)."""

ENGINE_CONFIG_TYPES: Mapping[EngineKind, type[EngineConfig]] = MappingProxyType({
    EngineKind.ENCODER: EncoderConfig,
    EngineKind.LLM: LLMConfig,
})
"""Engine kind -> config class; must name every :class:`EngineKind` member (checked at import)."""

if set(ENGINE_CONFIG_TYPES) != set(EngineKind):  # pragma: no cover - a developer error, caught by any import
    raise RuntimeError(f"ENGINE_CONFIG_TYPES names {sorted(ENGINE_CONFIG_TYPES)}, EngineKind has "
                       f"{sorted(EngineKind)}: add the config class of each engine kind")


def engine_kinds() -> tuple[str, ...]:
    """Every engine kind's value, in :class:`EngineKind` order (e.g. the ``engine`` Param's enum)."""
    return tuple(k.value for k in EngineKind)


def engine_config_from_dict(data: Mapping[str, Any]) -> EngineConfig:
    """Build and validate the engine config named by ``data['kind']`` (default ``encoder``).

    Raises:
        ConfigError: unknown kind or invalid field (the message names it).
    """
    raw = data.get("kind", DEFAULT_ENGINE_KIND.value)
    try:
        kind = EngineKind(raw)
    except ValueError:
        raise ConfigError(f"engine.kind: {raw!r} is not one of {list(engine_kinds())}") from None
    return ENGINE_CONFIG_TYPES[kind].from_dict({**data, "kind": kind.value})

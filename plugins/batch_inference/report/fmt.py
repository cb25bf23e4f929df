"""Number formatting shared by the HTML page, the Markdown summary and the progress line."""

from __future__ import annotations


def usd(value: float | None) -> str:
    """``$1,234.57`` / ``$0.1235`` / ``$0.00000067`` (never scientific notation), ``n/a`` for ``None``."""
    if value is None:
        return "n/a"
    if abs(value) >= 1:
        return f"${value:,.2f}"
    if abs(value) >= 0.01:
        return f"${value:.4f}"
    text = f"{value:.8f}".rstrip("0").rstrip(".")
    return "$0" if text in {"0", "-0"} else f"${text}"


def num(value: float | int | None, digits: int = 1) -> str:
    """Thousands-separated number (integers exact, floats with ``digits`` decimals), ``n/a`` for ``None``."""
    if value is None:
        return "n/a"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def pct(value: float | None) -> str:
    """Fraction as a percentage with one decimal (``0.973`` -> ``97.3%``), ``n/a`` for ``None``."""
    return "n/a" if value is None else f"{100 * value:.1f}%"


def seconds(value: float | None) -> str:
    """Duration: ``42.0s``, ``3m05s`` or ``2h04m``; ``n/a`` for ``None``."""
    if value is None:
        return "n/a"
    if value < 60:
        return f"{value:.1f}s"
    minutes, sec = divmod(int(round(value)), 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"

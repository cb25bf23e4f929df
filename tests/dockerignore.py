"""Docker's ``.dockerignore`` rules, for tests of what a build context sends (``tests/unit/test_deploy_*.py``).

Semantics (Docker's ``moby/patternmatcher``): ``**`` matches any number of directories, ``*`` and ``?``
stay within one path segment, a ``!`` line re-includes, the last matching rule wins, and a rule that
matches a parent directory applies to everything below it.
"""

from __future__ import annotations

import re
from pathlib import Path

Rules = list[tuple[bool, re.Pattern[str]]]


def ignore_rules(path: Path) -> Rules:
    """The ignore file at ``path`` as ``(is_exception, regex)`` pairs, in file order."""
    rules: Rules = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:] if negate else line
        regex, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif pattern[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif pattern[i] == "?":
                regex, i = regex + "[^/]", i + 1
            else:
                regex, i = regex + re.escape(pattern[i]), i + 1
        rules.append((negate, re.compile(f"^{regex.strip('/')}$")))
    return rules


def in_context(path: str, rules: Rules) -> bool:
    """Whether Docker sends ``path`` (relative, ``/``-separated) under ``rules``."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    included = True
    for negate, regex in rules:
        if any(regex.match(p) for p in prefixes):
            included = negate
    return included

"""The import graph of the repository's packages, read from the source with ``ast`` (nothing is imported).

* ``plugins/batch_inference`` has no import cycle. Every import counts: at module level, under ``if
  TYPE_CHECKING:`` and inside functions (a cycle hidden in a function body is still a cycle). Relative
  imports are resolved; an import names the longest module it reaches (``from batch_inference.report
  import text_summary`` imports the package ``__init__`` ``batch_inference.report``; ``from
  batch_inference.report import fmt`` imports ``batch_inference.report.fmt``). A package's ``__init__``
  is a node of its own; the implicit run of a parent package's ``__init__`` is not an edge.
* Every import of a ``batch_inference`` / ``batch_contract`` module inside a function of
  ``batch_inference`` says why it is there: a comment on its line(s), or anywhere in the run of
  import statements it belongs to, or on the line above that run (e.g. ``# parse time: pyarrow``).
* The floors: ``batch_contract`` imports none of ``batch_inference``, ``batch_worker``, ``airflow``;
  ``batch_worker`` imports neither ``batch_inference`` nor ``airflow``; ``batch_inference`` imports none
  of ``torch``, ``vllm``, ``batch_worker``.
"""

from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE_ROOTS = {"batch_inference": REPO / "plugins", "batch_contract": REPO / "plugins",
                 "batch_worker": REPO / "worker_image"}
FLOORS = {
    "batch_contract": {"batch_inference", "batch_worker", "airflow"},
    "batch_worker": {"batch_inference", "airflow"},
    "batch_inference": {"torch", "vllm", "batch_worker"},
}
"""Package -> top-level packages it must never import (anywhere in its source)."""
OWN = ("batch_inference", "batch_contract")
"""Function-level imports of these packages' modules must carry a comment saying why."""


@dataclass(frozen=True)
class Import:
    """One imported name.

    Attributes:
        module: the importing module (dotted).
        target: what is imported, absolute (``pkg.mod`` or ``pkg.mod.name``).
        line: line of the import statement (1-based).
        in_function: inside a function or method body (at any depth).
        commented: the import carries a comment (module docstring rule).
    """

    module: str
    target: str
    line: int
    in_function: bool
    commented: bool


def modules_of(package: str) -> dict[str, Path]:
    """Dotted module name -> source file of every module of ``package`` (``__init__`` as the package)."""
    root = PACKAGE_ROOTS[package]
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _comment_lines(source: str) -> tuple[set[int], set[int]]:
    """(lines with a comment, lines holding only a comment)."""
    any_comment, only_comment = set(), set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            any_comment.add(tok.start[0])
            if not tok.line[:tok.start[1]].strip():
                only_comment.add(tok.start[0])
    return any_comment, only_comment


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module if is_package else module.rpartition(".")[0]
        parts = package.split(".")
        anchor = ".".join(parts[:len(parts) - node.level + 1])
        base = f"{anchor}.{base}" if base else anchor
    return [base if alias.name == "*" else f"{base}.{alias.name}" for alias in node.names]


def _blocks(stmt: ast.stmt) -> list[list[ast.stmt]]:
    """The statement lists nested in one statement (bodies, ``else``, ``finally``, handlers, cases)."""
    blocks = [getattr(stmt, field) for field in ("body", "orelse", "finalbody")
              if isinstance(getattr(stmt, field, None), list)]
    blocks += [handler.body for handler in getattr(stmt, "handlers", [])]
    blocks += [case.body for case in getattr(stmt, "cases", [])]
    return [block for block in blocks if block and isinstance(block[0], ast.stmt)]


def imports_of(module: str, path: Path) -> list[Import]:
    """Every import statement of one module, one :class:`Import` per imported name."""
    source = path.read_text()
    tree = ast.parse(source, str(path))
    any_comment, only_comment = _comment_lines(source)
    is_package = path.name == "__init__.py"
    found: list[Import] = []

    def run_commented(run: list[ast.stmt]) -> bool:
        lines = range(run[0].lineno, run[-1].end_lineno + 1)
        return any(n in any_comment for n in lines) or run[0].lineno - 1 in only_comment

    def visit(body: list[ast.stmt], in_function: bool) -> None:
        runs: list[list[ast.stmt]] = []  # adjacent import statements
        previous: ast.stmt | None = None
        for stmt in body:
            if isinstance(stmt, ast.Import | ast.ImportFrom):
                if isinstance(previous, ast.Import | ast.ImportFrom):
                    runs[-1].append(stmt)
                else:
                    runs.append([stmt])
            previous = stmt
        for run in runs:
            commented = run_commented(run)
            for stmt in run:
                found.extend(Import(module, target, stmt.lineno, in_function, commented)
                             for target in _targets(stmt, module, is_package))
        for stmt in body:
            inner = in_function or isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef)
            for block in _blocks(stmt):
                visit(block, inner)

    visit(tree.body, False)
    return found


def _resolve(target: str, modules: dict[str, Path]) -> str | None:
    """The longest known module ``target`` names, or ``None``."""
    name = target
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph(package: str = "batch_inference") -> dict[str, set[str]]:
    """Module -> modules of ``package`` it imports (every import: module level and in functions)."""
    modules = modules_of(package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for imp in imports_of(name, path):
            target = _resolve(imp.target, modules)
            if target is not None and target != name:
                graph[name].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or ``None`` (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path = [start]
        stack = [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def test_find_cycle_reports_the_loop() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_imports_of_resolves_relative_and_function_level_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .a import x\n")
    (pkg / "a.py").write_text(
        "from . import b\n"
        "def f():\n"
        "    # parse time: heavy\n"
        "    from pkg.c import y\n"
        "\n"
        "    import pkg.d\n"
        "    return y\n"
        "def g():\n"
        "    from pkg import e\n")
    got = {(i.target, i.in_function, i.commented) for i in imports_of("pkg.a", pkg / "a.py")}
    assert got == {("pkg.b", False, False), ("pkg.c.y", True, True), ("pkg.d", True, True),
                   ("pkg.e", True, False)}
    assert [i.target for i in imports_of("pkg", pkg / "__init__.py")] == ["pkg.a.x"]


def test_batch_inference_has_no_import_cycle() -> None:
    graph = import_graph("batch_inference")
    assert len(graph) > 50 and "batch_inference.report" in graph  # the walk found the package
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_function_level_imports_of_own_modules_say_why() -> None:
    bare = []
    for name, path in modules_of("batch_inference").items():
        for imp in imports_of(name, path):
            if imp.in_function and imp.target.split(".")[0] in OWN and not imp.commented:
                bare.append(f"{path.relative_to(REPO)}:{imp.line}: {imp.target}")
    assert not bare, ("function-level imports without a comment saying why (parse time, a heavy library; "
                      "never to hide a cycle):\n" + "\n".join(sorted(set(bare))))


def test_packages_keep_their_floors() -> None:
    offenders = []
    for package, forbidden in FLOORS.items():
        for name, path in modules_of(package).items():
            offenders += [f"{path.relative_to(REPO)}:{imp.line}: {imp.target}" for imp in imports_of(name, path)
                          if imp.target.split(".")[0] in forbidden]
    assert not offenders, offenders

"""Top-level definitions of a record's own script (../shared/reference-code/<record>/train_gpt.py), executed
for a test: the functions, classes and assignments named, nothing else of the script (its CUDA set-up, the
model, the training loop). Tests compare ours with the records' code itself this way, not with a copy."""

from __future__ import annotations

import ast
from pathlib import Path

SHARED_CODE = Path(__file__).resolve().parents[2] / "shared" / "reference-code"


class OnTheCpu(ast.NodeTransformer):
    """A transformer for :func:`record_definitions`: ``device="cuda"`` -> ``device="cpu"``, ``pin_memory=True``
    -> False (no CUDA on this machine)."""

    def visit_keyword(self, node: ast.keyword) -> ast.keyword:
        if node.arg == "device" and isinstance(node.value, ast.Constant) and node.value.value == "cuda":
            node.value = ast.Constant("cpu")
        if node.arg == "pin_memory":
            node.value = ast.Constant(False)
        return node


def defined_names(node: ast.stmt) -> set[str]:
    """The names a top-level statement defines: a function's or class's name, an assignment's plain targets."""
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    return set()


def record_definitions(script: Path, names: set[str], namespace: dict, optional: frozenset[str] = frozenset(),
                       transformer: ast.NodeTransformer | None = None) -> dict:
    """Execute the top-level statements of ``script`` that define any of ``names`` or ``optional`` (in the
    script's order) in ``namespace`` (the imports they use, given by the caller) and return it. ``transformer``
    rewrites them first (e.g. ``device="cuda"`` to the CPU). Compiled without this module's ``from __future__``
    flags, so the script's dataclasses see real annotations. Raises ``AssertionError`` naming the script and
    the names of ``names`` it no longer defines."""
    tree = ast.parse(script.read_text(encoding="utf-8"))
    body = [node for node in tree.body if defined_names(node) & (names | optional)]
    missing = names - set().union(set(), *map(defined_names, body))
    assert not missing, f"{script} no longer defines {sorted(missing)}"
    module = ast.Module(body=body, type_ignores=[])
    if transformer is not None:
        module = transformer.visit(module)
    exec(compile(ast.fix_missing_locations(module), str(script), "exec", dont_inherit=True), namespace)
    return namespace

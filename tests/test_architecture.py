"""The import direction of docs/ARCHITECTURE.md, checked on the source.

Layers, top to bottom; a module may import its own layer and any layer below it, never
one above. ``ledger`` must stay pure: besides itself it may import only ``rewards`` and the
shared bottom modules, and nothing that does I/O or asyncio.
"""

from __future__ import annotations

import ast
from pathlib import Path

import rollout_recovery

PACKAGE_ROOT = Path(rollout_recovery.__file__).parent
LAYERS = [
    "cli",
    "control",
    "rollout",
    "policy",
    "finalize",
    "capture",
    "dataplane",
    "checkpoint",
    "ledger",
    "rewards",
    "errors",
    "_gc",
    "_durable",
]
LEDGER_FORBIDDEN_STDLIB = {"asyncio", "os", "io", "sqlite3", "socket", "subprocess", "pathlib"}


def _layer_of(module_path: Path) -> str | None:
    relative = module_path.relative_to(PACKAGE_ROOT)
    head = relative.parts[0].removesuffix(".py")
    return head if head in LAYERS else None


def _imported_layers(module_path: Path) -> set[tuple[str, str]]:
    """(layer, imported name) pairs for every project import of one module."""
    tree = ast.parse(module_path.read_text(), filename=str(module_path))
    package_parts = module_path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts[:-1]
    found: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package_parts[: len(package_parts) - node.level + 1])
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [target] if node.module else [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "rollout_recovery" and len(parts) > 1 and parts[1] in LAYERS:
                found.add((parts[1], name))
            elif parts[0] != "rollout_recovery":
                found.add(("<external>", name))
    return found


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE_ROOT.rglob("*.py") if _layer_of(p) is not None)


def test_every_module_imports_downwards_only() -> None:
    violations = []
    for module in _modules():
        layer = _layer_of(module)
        assert layer is not None
        for imported_layer, name in _imported_layers(module):
            if imported_layer == "<external>":
                continue
            if LAYERS.index(imported_layer) < LAYERS.index(layer):
                violations.append(f"{module.relative_to(PACKAGE_ROOT)} ({layer}) imports {name}")
    assert not violations, "\n".join(violations)


def test_the_ledger_is_pure() -> None:
    violations = []
    for module in (PACKAGE_ROOT / "ledger").rglob("*.py"):
        for imported_layer, name in _imported_layers(module):
            top = name.split(".")[0]
            if imported_layer == "<external>" and top in LEDGER_FORBIDDEN_STDLIB:
                violations.append(f"{module.name} imports {name}")
            if imported_layer not in {"<external>", "ledger", "rewards", "errors", "_gc"}:
                violations.append(f"{module.name} imports {name}")
    assert not violations, "\n".join(violations)


def test_the_checker_sees_imports() -> None:
    # Guards the guard: the ledger must be seen importing rewards, or the walk is broken.
    seen = set()
    for module in (PACKAGE_ROOT / "ledger").rglob("*.py"):
        seen |= {layer for layer, _ in _imported_layers(module)}
    assert {"rewards", "errors", "ledger"} <= seen

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
    "chaos",
    "job",
    "adapters",
    "recorder",
    "control",
    "history",
    "metrics",
    "cluster",
    "vllm",
    "llm",
    "rollout",
    "serve",
    "policy",
    "finalize",
    "rundir",
    "capture",
    "dataplane",
    "checkpoint",
    "ledger",
    "rewards",
    "_reward_function",
    "_settings",
    "_crashpoints",
    "_checks",
    "_workers",
    "_datasets",
    "_unix_http",
    "_sampler",
    "errors",
    "_outcomes",
    "_row_facts",
    "_messages",
    "_bounds",
    "_cut",
    "_gc",
    "_durable",
    "_lifecycle",
    "_clock",
    "_http",
]
SUBPACKAGES = {"cli", "chaos", "job", "control", "history", "metrics", "cluster", "vllm", "llm"} | {
    "adapters",
    "recorder",
    "rollout",
    "serve",
    "policy",
    "finalize",
    "rundir",
    "capture",
    "dataplane",
    "checkpoint",
    "ledger",
    "rewards",
}
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
            if imported_layer not in {
                "<external>",
                "ledger",
                "rewards",
                "_checks",
                "errors",
                "_messages",
                "_gc",
                "_bounds",
                "_cut",
            }:
                violations.append(f"{module.name} imports {name}")
    assert not violations, "\n".join(violations)


def test_the_checker_sees_imports() -> None:
    # Guards the guard: the ledger must be seen importing rewards, or the walk is broken.
    seen = set()
    for module in (PACKAGE_ROOT / "ledger").rglob("*.py"):
        seen |= {layer for layer, _ in _imported_layers(module)}
    assert {"rewards", "errors", "ledger"} <= seen


def test_sibling_packages_are_imported_through_their_facade() -> None:
    """``..B`` or ``..B.public_module``, never ``..B._private``, from outside package B."""
    violations = []
    for module in PACKAGE_ROOT.rglob("*.py"):
        relative = module.relative_to(PACKAGE_ROOT)
        own = relative.parts[0] if len(relative.parts) > 1 else None
        for imported_layer, name in _imported_layers(module):
            if imported_layer not in SUBPACKAGES or imported_layer == own:
                continue
            inner = name.split(".")[2:]
            if inner and inner[0].startswith("_"):
                violations.append(f"{relative} imports {name}")
    assert not violations, "\n".join(sorted(violations))


def test_the_facade_checker_sees_private_imports() -> None:
    # The walk resolves relative imports to full names, including the module part.
    names = {name for _, name in _imported_layers(PACKAGE_ROOT / "checkpoint" / "_sidecar_io.py")}
    assert "rollout_recovery.ledger.codec_support" in names
    assert "rollout_recovery.checkpoint._native" in names


def test_the_default_install_never_imports_ray() -> None:
    """Ray is the [ray] extra: only a job with generation.backend = "ray" imports it."""
    import subprocess
    import sys

    code = (
        "import sys, rollout_recovery, rollout_recovery.control, rollout_recovery.cli, "
        "rollout_recovery.rollout, rollout_recovery.serve, rollout_recovery.job, "
        "rollout_recovery.history, rollout_recovery.cluster; "
        "assert 'ray' not in sys.modules, 'ray was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_no_package_holds_more_than_15_percent_of_the_code() -> None:
    """One room, one purpose: a room that grows past this is doing two things."""
    sizes = {
        package: sum(
            len(p.read_text().splitlines()) for p in (PACKAGE_ROOT / package).rglob("*.py")
        )
        for package in SUBPACKAGES
    }
    total = sum(len(p.read_text().splitlines()) for p in PACKAGE_ROOT.rglob("*.py"))
    too_big = {name: round(100 * n / total, 1) for name, n in sizes.items() if n > 0.15 * total}
    assert not too_big, too_big


def test_the_default_install_never_imports_torch() -> None:
    """torch and transformers are the [llm] extra: only rollout_recovery.llm imports them."""
    import subprocess
    import sys

    code = (
        "import sys, rollout_recovery, rollout_recovery.control, rollout_recovery.cli, "
        "rollout_recovery.rollout, rollout_recovery.serve, rollout_recovery.policy, "
        "rollout_recovery.checkpoint, rollout_recovery.job, rollout_recovery.history, "
        "rollout_recovery.vllm, rollout_recovery.llm; "
        "loaded = [m for m in ('torch', 'transformers', 'safetensors') if m in sys.modules]; "
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- one lifecycle: every resource is closed by one verb -----------------------------------

#: Verbs no class may define: a resource's one verb is ``aclose`` or ``close``.
FORBIDDEN_VERBS = {"stop", "shutdown"}
#: Classes whose ``close``/``aclose`` is not a resource's, with why.
NOT_RESOURCES = {
    "_JumpingSelector": "a selectors.BaseSelector: close() is that API's, called by the loop",
    # An AsyncResource has async methods, and Ray makes an actor with any async method an
    # asyncio actor (one event loop for every call): the driver's resource is the plane.
    "DataShard": "a Ray actor's body, closed through RayShardedDataPlane",
}


def _classes() -> list[tuple[Path, ast.ClassDef]]:
    found = []
    for module in sorted(PACKAGE_ROOT.rglob("*.py")):
        tree = ast.parse(module.read_text(), filename=str(module))
        found += [(module, node) for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    return found


def _base_names(node: ast.ClassDef) -> set[str]:
    names = set()
    for base in node.bases:
        if isinstance(base, ast.Subscript):  # Generic[T], Protocol[T]
            base = base.value
        if isinstance(base, ast.Name):
            names.add(base.id)
        elif isinstance(base, ast.Attribute):
            names.add(base.attr)
    return names


def lifecycle_violations(classes: list[tuple[Path, ast.ClassDef]]) -> list[str]:
    """Every class that breaks the one-verb rule, as ``file: Class: why``."""
    bases = {node.name: _base_names(node) for _, node in classes}

    def reaches(name: str, target: str, seen: frozenset[str] = frozenset()) -> bool:
        if name == target:
            return True
        return any(
            reaches(base, target, seen | {name})
            for base in bases.get(name, set())
            if base not in seen
        )

    violations = []
    for module, node in classes:
        where = f"{module.relative_to(PACKAGE_ROOT)}: {node.name}"
        methods = {
            item.name
            for item in node.body
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        violations += [f"{where} defines {verb}()" for verb in sorted(methods & FORBIDDEN_VERBS)]
        if node.name in {"AsyncResource", "Resource"}:
            continue
        sync = reaches(node.name, "Resource")
        resource = sync or reaches(node.name, "AsyncResource")
        protocol = "Protocol" in bases[node.name]
        exempt = node.name in NOT_RESOURCES or protocol
        if sync and "aclose" in methods:
            violations.append(f"{where} is a Resource (verb close) and overrides aclose()")
        if resource and not sync and "close" in methods:
            violations.append(f"{where} is an AsyncResource (verb aclose) and defines close()")
        if not exempt and "close" in methods and not resource:
            violations.append(f"{where} defines close() but is no Resource")
        if not exempt and "aclose" in methods and not resource:
            violations.append(f"{where} defines aclose() but is no AsyncResource")
    return violations


def test_every_resource_has_one_shutdown_verb() -> None:
    """One lifecycle (issue 16): a resource derives from ``AsyncResource`` (verb ``aclose``)
    or ``Resource`` (verb ``close``), so one exit stack closes any mix of them; nothing is
    stopped or shut down by another name. A command function such as ``cli.stop`` is no
    method and is not concerned."""
    assert not lifecycle_violations(_classes())


def test_the_lifecycle_checker_sees_each_kind_of_violation() -> None:
    source = """
class Fleet:
    def stop(self) -> None: ...
class Plane(Resource):
    def close(self) -> None: ...
    def shutdown(self) -> None: ...
class Sub(Plane):
    async def aclose(self) -> None: ...
class Pool(AsyncResource):
    async def aclose(self) -> None: ...
    def close(self) -> None: ...
class Loose:
    def close(self) -> None: ...
class Looser:
    async def aclose(self) -> None: ...
class Fine(Resource):
    def close(self) -> None: ...
"""
    classes = [(PACKAGE_ROOT / "x.py", n) for n in ast.walk(ast.parse(source))]
    found = lifecycle_violations([(p, n) for p, n in classes if isinstance(n, ast.ClassDef)])
    assert found == [
        "x.py: Fleet defines stop()",
        "x.py: Plane defines shutdown()",
        "x.py: Sub is a Resource (verb close) and overrides aclose()",
        "x.py: Pool is an AsyncResource (verb aclose) and defines close()",
        "x.py: Loose defines close() but is no Resource",
        "x.py: Looser defines aclose() but is no AsyncResource",
    ]


# -- outcomes once: a backend returns its failures ------------------------------------------

#: The one attempt method every backend has (issue 25, item 5: it replaced
#: ``run_attempt`` + ``resume_attempt``), and the names it may not come back as.
ATTEMPT_METHOD = "run_attempt"
RETIRED_ATTEMPT_METHODS = {"resume_attempt"}


def outcome_violations(classes: list[tuple[Path, ast.ClassDef]]) -> list[str]:
    """Every attempt method that cannot return an ``AttemptFailure`` or take a prefix, and
    every second attempt method, as ``file: Class.method ...``."""
    violations = []
    for module, node in classes:
        for item in node.body:
            if not isinstance(item, ast.AsyncFunctionDef | ast.FunctionDef):
                continue
            where = f"{module.relative_to(PACKAGE_ROOT)}: {node.name}.{item.name}"
            if item.name in RETIRED_ATTEMPT_METHODS:
                violations.append(f"{where} is a second attempt method: use {ATTEMPT_METHOD}")
                continue
            if item.name != ATTEMPT_METHOD or not isinstance(item, ast.AsyncFunctionDef):
                continue
            returns = ast.unparse(item.returns) if item.returns is not None else ""
            if "AttemptFailure" not in returns:
                violations.append(
                    f"{where} returns {returns or 'nothing annotated'}, not "
                    "AttemptResult | AttemptFailure"
                )
            args = item.args.args
            prefix = next((a for a in args if a.arg == "prefix"), None)
            with_defaults = args[len(args) - len(item.args.defaults) :]
            defaults = {a.arg: d for a, d in zip(with_defaults, item.args.defaults, strict=True)}
            annotation = ast.unparse(prefix.annotation) if prefix and prefix.annotation else ""
            default = defaults.get("prefix")
            if (
                prefix is None
                or annotation != "StagedPrefix | None"
                or not (isinstance(default, ast.Constant) and default.value is None)
            ):
                violations.append(f"{where} does not take prefix: StagedPrefix | None = None")
    return violations


def test_every_backend_returns_its_failures() -> None:
    """Issue 16, item 5, and issue 25, item 5: every backend (and the protocol and the Ray
    worker) has one attempt method, ``run_attempt(request, capture, prefix=None)``, which
    returns ``AttemptResult | AttemptFailure``; the controller catches no
    ``GenerationError`` (raised out of a backend, it is a bug)."""
    assert not outcome_violations(_classes())
    control = PACKAGE_ROOT / "control"
    catching = [
        f"{module.relative_to(PACKAGE_ROOT)}:{handler.lineno}"
        for module in sorted(control.rglob("*.py"))
        for handler in ast.walk(ast.parse(module.read_text()))
        if isinstance(handler, ast.ExceptHandler)
        and handler.type is not None
        and "GenerationError" in ast.unparse(handler.type)
    ]
    assert not catching, catching


def test_the_outcome_checker_sees_a_backend_that_raises() -> None:
    source = """
class Raising:
    async def run_attempt(
        self, request, capture, prefix: StagedPrefix | None = None
    ) -> AttemptResult: ...
class Good:
    async def run_attempt(
        self, r, c, prefix: StagedPrefix | None = None
    ) -> AttemptResult | AttemptFailure: ...
class NoPrefix:
    async def run_attempt(self, r, c) -> AttemptResult | AttemptFailure: ...
class Twice:
    async def resume_attempt(self, r, c, p) -> AttemptResult | AttemptFailure: ...
"""
    tree = ast.parse(source)
    classes = [(PACKAGE_ROOT / "x.py", n) for n in tree.body if isinstance(n, ast.ClassDef)]
    assert outcome_violations(classes) == [
        "x.py: Raising.run_attempt returns AttemptResult, not AttemptResult | AttemptFailure",
        "x.py: NoPrefix.run_attempt does not take prefix: StagedPrefix | None = None",
        "x.py: Twice.resume_attempt is a second attempt method: use run_attempt",
    ]


# -- no cycles inside a room: a component takes its section, a section builds its part -----

#: Optional extras: a module that imports one at its top is imported by its room inside the
#: function that needs it, so a default install never loads the extra.
EXTRAS = {"ray", "torch", "transformers", "safetensors", "gguf"}


def _runtime_imports(module: Path, root: Path) -> tuple[set[str], set[str], set[str]]:
    """(own-room modules imported at the top, own-room modules imported inside a function,
    outside packages imported at the top) of one module; imports under ``TYPE_CHECKING``
    name types for the checker and load nothing, so they count in neither."""
    tree = ast.parse(module.read_text(), filename=str(module))
    package_parts = module.relative_to(root.parent).with_suffix("").parts[:-1]
    top: set[str] = set()
    nested: set[str] = set()
    external: set[str] = set()

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.ImportFrom) and child.level:
                base = ".".join(package_parts[: len(package_parts) - child.level + 1])
                target = f"{base}.{child.module}" if child.module else base
                names = [target] + [f"{target}.{alias.name}" for alias in child.names]
                own = {
                    n
                    for n in names
                    if (root.parent / f"{n.replace('.', '/')}.py").is_file()
                }
                (nested if in_function else top).update(own)
            elif isinstance(child, ast.Import | ast.ImportFrom) and not in_function:
                heads = (
                    [alias.name for alias in child.names]
                    if isinstance(child, ast.Import)
                    else [child.module or ""]
                )
                external.update(head.split(".")[0] for head in heads)
            visit(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))

    visit(tree, False)
    return top, nested, external


#: Function-level imports of an own-room module kept for the start's sake, not a cycle:
#: the command line's entry point looks for a run directory's warm standby before it
#: imports the commands (0.4 s), which a rerun that runs in the standby never needs.
DEFERRED_FOR_THE_START = frozenset(
    {("rollout_recovery.cli.__init__", "rollout_recovery.cli._main")}
)


def room_import_violations(root: Path = PACKAGE_ROOT) -> list[str]:
    """A runtime import cycle between two modules of one room, and a function-level import
    of an own-room module that loads no extra (a cycle broken by a lazy import)."""
    modules = {
        ".".join(path.relative_to(root.parent).with_suffix("").parts): path
        for path in root.rglob("*.py")
    }
    facts = {name: _runtime_imports(path, root) for name, path in modules.items()}

    def room(name: str) -> str:
        return name.split(".")[1] if name.count(".") >= 2 else name

    def reach(start: str) -> set[str]:
        seen: set[str] = set()
        todo = [start]
        while todo:
            for target in facts.get(todo.pop(), (set(), set(), set()))[0]:
                if room(target) == room(start) and target not in seen:
                    seen.add(target)
                    todo.append(target)
        return seen

    def loads_an_extra(name: str) -> bool:
        return any(facts[m][2] & EXTRAS for m in {name} | reach(name) if m in facts)

    violations = []
    for name in sorted(modules):
        if name in reach(name):
            violations.append(f"{name} imports itself through its room at run time (a cycle)")
        for target in sorted(facts[name][1]):
            if (name, target) in DEFERRED_FOR_THE_START:
                continue
            if room(target) == room(name) and not loads_an_extra(target):
                violations.append(
                    f"{name} imports {target} inside a function, and it loads no extra: "
                    "import it at the top (a section builds its part; the part names the "
                    "section's type under TYPE_CHECKING)"
                )
    return violations


def test_no_room_has_an_import_cycle_or_a_lazy_import_of_its_own() -> None:
    """Issue 25, item 2: sections used to build their parts through function-level imports
    that broke cycles (7 of them). Now a room's runtime imports form no cycle, and a module
    imports one of its room inside a function only to keep an optional extra (Ray, torch)
    off a default install."""
    assert not room_import_violations(), "\n".join(room_import_violations())


def test_the_room_import_checker_sees_a_cycle_and_a_lazy_import(tmp_path: Path) -> None:
    room = tmp_path / "pkg" / "room"
    room.mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (room / "__init__.py").write_text("")
    (room / "_a.py").write_text("from ._b import B\n")
    (room / "_b.py").write_text("from ._a import A\n")
    (room / "_section.py").write_text("def build():\n    from ._part import Part\n")
    (room / "_part.py").write_text("from ._section import build\n")
    (room / "_heavy.py").write_text("import torch\n")
    (room / "_light.py").write_text("def build():\n    from ._heavy import x\n")
    found = room_import_violations(tmp_path / "pkg")
    assert [line.split(" ")[0] for line in found] == [
        "pkg.room._a",
        "pkg.room._b",
        "pkg.room._section",
    ]

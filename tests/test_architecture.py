"""The package's shape: no import cycle, families that never import the app back, a core that
knows no family, modules of one concept (under about 400 lines, data modules apart), and no
module reaching into another module's private fields."""

from __future__ import annotations

import ast
from pathlib import Path

from support import ROOT

PACKAGE = ROOT / "openai_ext"
# The composition root and the entry points: the only modules that may know every family.
COMPOSITION = {"openai_ext.app", "openai_ext.state", "openai_ext.__main__", "openai_ext.extension"}
# Pure data (sentences, tables): long by nature, no logic to read.
DATA_MODULES = {"openai_ext.moderations.prototypes"}
MAX_LINES = 400
# Private names of other modules' objects that a module may still use, each with its reason:
# (module, name) -> why.
FOREIGN_PRIVATE = {
    # another library's functions, not this package's fields
    ("openai_ext.core.tunnel", "_run_cloudflared"):
        "flask-cloudflared's function that starts the tunnel and returns its address (the public "
        "start_cloudflared prints the address instead)",
    ("openai_ext.core.tunnel", "_cleanup_existing_cloudflared"):
        "flask-cloudflared's function that ends its cloudflared process, whose exit handler never runs under "
        "uvicorn (see tunnel.stop)",
}


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports, wherever in it the import stands (an import
    inside a function is still a dependency)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            # the module itself, or the package a name was taken from
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_walk_sees_the_imports():
    edges = graph()
    assert "openai_ext.text.service" in edges["openai_ext.text.generation"]
    assert "openai_ext.core.errors" in edges["openai_ext.text.grammar.errors"]
    # a package's name imported from it counts as the package itself
    assert "openai_ext.text.tools" in edges["openai_ext.text.chat"]


def test_the_walk_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_package_has_no_import_cycle():
    assert cycles(graph()) == []


def test_only_the_composition_root_knows_the_app_and_the_state():
    for name, deps in graph().items():
        if name not in COMPOSITION:
            assert not deps & {"openai_ext.app", "openai_ext.state"}, name


def test_the_core_and_the_hosts_know_no_family():
    families = ("text", "messages", "responses", "embeddings", "moderations", "audio", "images", "admin",
                "realtime")
    for name, deps in graph().items():
        layer = name.split(".")[1] if name.count(".") else ""
        if layer in ("core", "hosts"):
            above = {d for d in deps if d.split(".")[1:2] and d.split(".")[1] in families}
            assert not above, (name, above)


def test_modules_hold_one_concept():
    long = {name: n for name, path in modules().items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES and name not in DATA_MODULES}
    assert not long, long


def test_test_modules_have_unique_basenames():
    """pytest imports test modules by basename (the folders have no __init__.py): two files of one
    name stop the whole run at collection."""
    seen: dict[str, Path] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if any(part.startswith(".") for part in path.relative_to(ROOT).parts):
            continue   # scratch virtual environments of the install tests
        assert path.name not in seen, f"{path} and {seen[path.name]} share a basename"
        seen[path.name] = path


def own_private_names(tree: ast.AST) -> set[str]:
    """Private names a module defines for its own objects: the methods and class attributes of
    its classes, and the fields its code assigns to ``self``/``cls``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(item.name)
                targets = item.targets if isinstance(item, ast.Assign) else \
                    [item.target] if isinstance(item, ast.AnnAssign) else []
                names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _on_self(node):
            names.add(node.attr)
    return {n for n in names if _private(n)}


def foreign_private_uses(source: str) -> list[tuple[int, str]]:
    """(line, expression) of each private attribute used on something other than ``self`` or
    ``cls`` whose name the module does not define itself: a field of another module's object (or
    of another library's). A name is told apart by where it is defined, so an object of another
    module whose private field happens to share a name with one of this module's goes unseen."""
    tree = ast.parse(source)
    own = own_private_names(tree)
    return [(node.lineno, ast.unparse(node)) for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and _private(node.attr) and not _on_self(node)
            and node.attr not in own]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _on_self(node: ast.Attribute) -> bool:
    return isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")


def test_the_private_walk_tells_own_fields_from_another_modules():
    source = """
class Line:
    def __init__(self):
        self._waiting = 0
    def _pass_on(self): ...
class Place:
    def release(self, line: Line, host):
        line._pass_on()
        line._waiting -= 1
        self._line = line
        host._ctx.close()
"""
    assert foreign_private_uses(source) == [(11, "host._ctx")]


def test_no_module_reaches_into_another_modules_private_fields():
    found, allowed = {}, set()
    for name, path in modules().items():
        for line, expr in foreign_private_uses(path.read_text()):
            key = (name, expr.rpartition(".")[2])
            if key in FOREIGN_PRIVATE:
                allowed.add(key)
            else:
                found[f"{name}:{line}"] = expr
    assert not found, found
    assert allowed == set(FOREIGN_PRIVATE), f"no longer needed: {set(FOREIGN_PRIVATE) - allowed}"

"""The layering of docs/architecture.md, checked statically on every keras_vit
module's imports, function-level ones included (issue #23 item 6), and then
at run time on what importing a module really loads.

The static check reads each module's source with `ast`: `import x`,
`from x import y` (relative ones resolved), `importlib.import_module("x")`,
`import_module(f"x.{name}")` over the module's own strings, and any string
naming a keras_vit module (the lazy-export tables of the package `__init__`s,
the command table of keras_vit.cli). A module may import only its own layer
and the layers below it, and no two modules may import each other, however
indirectly.
"""

import ast
import fnmatch
import json
import os
import subprocess
import sys
import textwrap
from typing import Dict, Set

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "keras_vit")

# Bottom first. A module's layer is that of its most specific pattern (an exact name beats a wildcard).
LAYERS = [
    ("foundation", ["keras_vit.errors", "keras_vit.config", "keras_vit.variants", "keras_vit.images",
                    "keras_vit.utils", "keras_vit.utils.*", "keras_vit.data", "keras_vit.data.*"]),
    ("layers", ["keras_vit.layers", "keras_vit.layers.*"]),
    # Texts to token ids (an image-text checkpoint's own tokenizer): read by the weights' loader.
    ("text", ["keras_vit.text", "keras_vit.text.*"]),
    # Reading checkpoints into a model it is given (the constructors' weights=): below the model.
    ("weights", ["keras_vit.weights", "keras_vit.weights.*"]),
    ("model", ["keras_vit.model", "keras_vit.model.*"]),
    # What builds or loads a whole model: from_pretrained, feature models, the run folder.
    ("whole models", ["keras_vit.model.pretrained", "keras_vit.model.features", "keras_vit.runs",
                      "keras_vit.runs.folder", "keras_vit.runs.adapter"]),
    ("model sources", ["keras_vit.runs.source", "keras_vit"]),
    # What is learned and served (fields, model, loss, metrics, outputs): read by training, export and evaluate.
    ("tasks", ["keras_vit.tasks", "keras_vit.tasks.*"]),
    ("inspection and export", ["keras_vit.inspection", "keras_vit.inspection.*", "keras_vit.export",
                               "keras_vit.export.*"]),
    ("training", ["keras_vit.training", "keras_vit.training.*"]),
    ("command line", ["keras_vit.cli", "keras_vit.cli.*", "keras_vit.training.cli", "keras_vit.export.cli",
                      "keras_vit.inspection.cli_*"]),
]

# Modules whose import_module(name) takes a name that is not in their own source, and why that is fine.
DISPATCHERS = {
    "keras_vit.utils.lazy": "imports the names of a package's lazy table, which the table's module holds",
    "keras_vit.cli": "imports the command named on the command line, from COMMANDS in the same module",
    "keras_vit.errors": "require() imports optional third-party packages, never keras_vit",
    "keras_vit.tasks": "task_class() imports a user's own Task named on the command line (package.module:Class)",
}


def module_files(package_dir=PACKAGE, root=ROOT) -> Dict[str, str]:
    """{module name: file} for every module of the package."""
    found = {}
    for folder, _, files in os.walk(package_dir):
        for file in files:
            if file.endswith(".py"):
                name = os.path.relpath(os.path.join(folder, file), root)[:-3].replace(os.sep, ".")
                found[name[:-len(".__init__")] if name.endswith(".__init__") else name] = os.path.join(folder, file)
    return found


def _resolve(name: str, modules) -> str:
    """The module `name` lives in: itself, or the nearest enclosing package (`from pkg import attribute`)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def _docstrings(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                yield first.value


def _is_import_module(node) -> bool:
    return isinstance(node, ast.Call) and node.args and (
        getattr(node.func, "attr", None) == "import_module" or getattr(node.func, "id", None) in (
            "import_module", "__import__"))


def imports_of(name: str, source: str, modules, is_package=False) -> Set[str]:
    """The keras_vit modules that module `name` (source `source`) imports, anywhere in it."""
    tree = ast.parse(source)
    package = name if is_package else name.rpartition(".")[0]
    docstrings = {id(node) for node in _docstrings(tree)}
    strings = {node.value for node in ast.walk(tree)
               if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings}
    named = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            named.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                         for alias in node.names)
        elif _is_import_module(node) and isinstance(node.args[0], ast.JoinedStr):
            head = node.args[0].values[0]
            prefix = head.value if isinstance(head, ast.Constant) else ""
            named.update(prefix + s for s in strings if prefix and prefix + s in modules)
    # Lazy tables, command tables, import_module("x"); a bare "keras_vit" is a Keras package name
    # (register_keras_serializable(package="keras_vit")), never a table entry.
    named.update(s for s in strings if s in modules and s != "keras_vit")
    found = {_resolve(n, modules) for n in named if n == "keras_vit" or n.startswith("keras_vit.")}
    return {m for m in found if m and m != name}


def import_graph() -> Dict[str, Set[str]]:
    modules = module_files()
    return {name: imports_of(name, open(path, encoding="utf-8").read(), modules, path.endswith("__init__.py"))
            for name, path in modules.items()}


def layer_of(module: str) -> int:
    matches = [(0 if "*" in p else 1, len(p), i) for i, (_, patterns) in enumerate(LAYERS) for p in patterns
               if fnmatch.fnmatchcase(module, p)]
    assert matches, f"{module} is in no layer: add it to LAYERS in {__file__}"
    return max(matches)[2]


def find_cycle(graph: Dict[str, Set[str]]):
    """One import cycle as a list of modules (first == last), or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return stack[stack.index(target):] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        state[node] = "done"
        stack.pop()
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


GRAPH = import_graph()


# --- the checker sees every kind of import ------------------------------------------------------------------

def test_the_checker_sees_function_level_relative_dynamic_and_table_imports():
    modules = {"keras_vit", "keras_vit.a", "keras_vit.pkg", "keras_vit.pkg.b", "keras_vit.pkg.c", "keras_vit.d",
               "keras_vit.e", "keras_vit.fmt.x", "keras_vit.fmt.y", "keras_vit.fmt"}
    source = textwrap.dedent('''
        """Docstring naming keras_vit.e, which is no import."""
        import importlib

        def late():
            import keras_vit.a
            from . import c
            from .b import something
            from keras_vit import d
            return importlib.import_module("keras_vit.fmt")

        NAMES = ("x", "y")
        TABLE = {"thing": "keras_vit.fmt.x"}
        PACKAGE = "keras_vit"  # a Keras serialisation package name: no import

        def each():
            return [importlib.import_module(f"keras_vit.fmt.{n}") for n in NAMES]
        ''')
    found = imports_of("keras_vit.pkg.b", source, modules)
    assert found == {"keras_vit.a", "keras_vit.pkg.c", "keras_vit.d", "keras_vit.fmt", "keras_vit.fmt.x",
                     "keras_vit.fmt.y"}, found  # b itself and the docstring's keras_vit.e are left out
    assert imports_of("keras_vit.pkg", "from .b import f\nfrom .. import a\n", modules, is_package=True) == {
        "keras_vit.pkg.b", "keras_vit.a"}


def test_the_checker_finds_a_cycle_through_a_function_level_import():
    # The cycle of issue #23: model -> weights -> npz -> runs -> model, the last one inside a function.
    graph = {"model": {"weights"}, "weights": {"npz"}, "npz": {"runs"}, "runs": {"model"}, "other": {"model"}}
    assert find_cycle(graph) == ["model", "weights", "npz", "runs", "model"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_every_module_has_a_layer_and_the_real_graph_has_edges():
    for module in GRAPH:
        layer_of(module)
    assert "keras_vit.weights" in GRAPH["keras_vit.model.vit"]  # function-level (weights=): seen
    assert "keras_vit.training.cli" in GRAPH["keras_vit.cli"]  # through the command table
    assert "keras_vit.model" in GRAPH["keras_vit"]  # through the lazy-export table
    assert "keras_vit.export.tflite" in GRAPH["keras_vit.export.registry"]  # import_module(f"...{module}")


# --- the package ----------------------------------------------------------------------------------------------

def test_each_module_imports_only_its_own_layer_and_below():
    upward = [f"{source} ({LAYERS[layer_of(source)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
              for source, targets in sorted(GRAPH.items()) for target in sorted(targets)
              if layer_of(target) > layer_of(source)]
    assert not upward, "\n".join(upward)


def test_there_is_no_import_cycle():
    cycle = find_cycle(GRAPH)
    assert cycle is None, " -> ".join(cycle)


def test_dynamic_imports_name_their_modules_in_the_source():
    unexplained = []
    for name, path in module_files().items():
        tree = ast.parse(open(path, encoding="utf-8").read())
        for node in ast.walk(tree):
            if _is_import_module(node) and not isinstance(node.args[0], (ast.Constant, ast.JoinedStr)) \
                    and name not in DISPATCHERS:
                unexplained.append(f"{name}:{node.lineno}")
    assert not unexplained, ("import_module with a computed name: the checker cannot see what it imports; "
                             f"use a literal or add the module to DISPATCHERS with why: {unexplained}")


# --- at run time: what importing a module really loads ---------------------------------------------------------

# One fresh process imports these in this order and reports, after each, every module loaded so far. A module's
# set is then what importing it loads, plus what the modules before it loaded: a superset of what it loads in a
# process of its own, so "X loads no trainer" read from it can only be stricter. Importing any keras_vit module
# imports the package first, so "keras_vit" leads; the shared homes come before any model-building module, so
# their union is theirs alone (with the package's), as when each had a process of its own.
IMPORT_ORDER = ["keras_vit", "keras_vit.data.mnist5k", "keras_vit.runs", "keras_vit.model", "keras_vit.model.pretrained",
                "keras_vit.runs.source", "keras_vit.export.pipeline", "keras_vit.inspection.figures"]
BELOW_THE_TRAINER = ["keras_vit.model", "keras_vit.model.pretrained", "keras_vit.runs.source", "keras_vit.export.pipeline",
                     "keras_vit.inspection.figures"]


def imported_after(modules, first="sys"):
    """{module: the modules loaded once it is imported} for `modules` imported in this order (after `first`),
    in one fresh process."""
    script = (f"import json, sys, importlib, {first}\n"
              f"for name in {list(modules)!r}:\n"
              "    importlib.import_module(name)\n"
              "    print(json.dumps([name, sorted(sys.modules)]))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-2000:]
    steps = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("[")]
    assert [name for name, _ in steps] == list(modules), done.stdout[-2000:]
    return {name: set(loaded) for name, loaded in steps}


@pytest.fixture(scope="module")
def loaded():
    """The two fresh processes of the run-time checks: the command line's import, and IMPORT_ORDER."""
    cli = imported_after(["keras_vit", "keras_vit.cli.variants", "keras_vit.weights.hub"], first="keras_vit_cli")
    return {"cli": cli["keras_vit"], "cli variants": cli["keras_vit.weights.hub"], **imported_after(IMPORT_ORDER)}


@pytest.mark.slow
def test_the_command_lines_import_of_keras_vit_starts_neither_keras_nor_tensorflow(loaded):
    """The `keras-vit` command (keras_vit_cli) answers --help at once; a program's
    `import keras_vit` imports Keras, to register the layers (#30, tests/test_guest.py)."""
    assert not {"keras", "tensorflow", "jax", "torch"} & loaded["cli"], sorted(loaded["cli"])
    # `keras-vit variants` (NEEDS_TENSORFLOW = False) lists the table of checkpoints: the weights
    # package's other modules, which need Keras, are not loaded for it (TensorFlow's start-up lines were).
    assert not {"keras", "tensorflow"} & loaded["cli variants"], sorted(loaded["cli variants"])
    assert {"keras", "keras_vit.model"} <= loaded["keras_vit"]


@pytest.mark.parametrize("module", BELOW_THE_TRAINER)
@pytest.mark.slow
def test_below_the_trainer_nothing_loads_it(loaded, module):
    assert module in loaded[module]
    trainer = sorted(name for name in loaded[module] if name.startswith("keras_vit.training"))
    assert not trainer, f"{module} (or a module imported before it in IMPORT_ORDER) loads {trainer}"


@pytest.mark.slow
def test_the_shared_homes_stand_alone(loaded):
    both = loaded["keras_vit.runs"]  # the package, keras_vit.data.mnist5k and keras_vit.runs, in that order
    assert {"keras_vit.data.mnist5k", "keras_vit.runs"} <= both
    above = sorted(name for name in both
                   if name.startswith(("keras_vit.training", "keras_vit.export", "keras_vit.inspection")))
    assert not above, above

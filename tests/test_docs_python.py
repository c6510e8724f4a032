"""#30: every Python snippet in the README and docs/ works as written, as the commands do.

Every ```python block of README.md and docs/**/*.md (found by the block parser
of tests/test_docs_commands.py; a block preceded by
`<!-- docs-test: skip REASON -->` is left out) is checked without running it:

1. it compiles;
2. every name it reads is defined: imported or assigned in the block or in an
   earlier python block of the same page (a page builds on its earlier
   blocks), a builtin, or one of STAND_INS, the few values the prose defines
   in words (`pixels`: "pixels 0..255");
3. every `keras_vit.<attr>...` chain, and every name imported from keras_vit,
   is a real object as a fresh process that ran the page's imports sees it (a
   submodule is an attribute of its package only once imported: by the page,
   by the package's __init__, or as one of its lazy exports); every call of a
   keras_vit function or class binds to its signature
   (`inspect.signature(f).bind(...)` with the block's arguments), and the
   keywords a `**kwargs` takes are checked against where keras_vit passes them
   on (_forwarded, from keras_vit's own tables), so a misspelt keyword fails;
4. an official checkpoint named for a model (`ViT_B16(weights="imagenet21k")`,
   `TrainConfig.create(model="Ti/16", weights=...)`,
   `from_pretrained("NAME:VARIANT")`) is one keras_vit.available_weights lists
   for it, and a bare name that is no checkpoint is an error.

Blocks that need the network (hf:, timm:, official downloads) or files the
docs only name (/data/ViT-B_16.npz, runs/demo) are checked by 1-4 only. The
blocks in RUNS work offline in seconds and also run for real, in a temporary
folder, each after the earlier RUNS blocks of its page (training.md: the
scikit-image photo folder, then fine-tuning on it from Python; models.md: the
Mu/4 model). An official checkpoint they name is a random one in the official
layout (tests/official_format.py) under its published file name, served from
a local folder through KERAS_VIT_WEIGHTS_URL (a file:// mirror) into a
temporary KERAS_HOME, so keras_vit's own download and cache run; and
`keras_vit.training.train` is wrapped to cut the run to 2 steps at batch 8
(`config.replace(steps=2, batch_size=8, progress=False)`), as the commands
test cuts `keras-vit train` to --steps 2. scikit-image (the photo folder's
source) is in setup.cfg's test extra: without it the run fails, never skips.
"""

import ast
import builtins
import collections
import dataclasses
import importlib
import importlib.util
import inspect
import os
import re
import symtable
import textwrap

import pytest

import keras_vit
from keras_vit.variants import canonical_name
from keras_vit.weights import hub
from tests.official_format import official_params, write_npz
from tests.test_docs_commands import ROOT, _blocks, _documents

# Values the prose defines in words, never in code: {name: where and what}.
STAND_INS = {
    "pixels": "README.md and docs/index.md: 'pixels 0..255', an image batch (B, H, W, 3)",
}
# Blocks run for real (see the module docstring): {page: a string each block holds}.
RUNS = {
    "docs/training.md": ("skimage.data", "image_dataset_from_directory"),
    "docs/models.md": ('keras_vit.ViT("Mu/4"',),
}

Block = collections.namedtuple("Block", "page line source")


def _python_blocks():
    found = []
    for path in _documents():
        with open(path, encoding="utf-8") as f:
            text = f.read()
        lines = text.splitlines()
        for start, block in _blocks(text):
            if lines[start - 1].strip()[3:].strip().split()[:1] in (["python"], ["py"]):
                found.append(Block(os.path.relpath(path, ROOT), start + 1, textwrap.dedent("\n".join(block))))
    return found


BLOCKS = _python_blocks()


def _id(block):
    return f"{block.page}:{block.line}"


# --- what a statement reads and binds --------------------------------------------------------------------------

def _reads_and_binds(statement):
    """(names read from the module scope, names bound there) by one top-level statement."""
    table = symtable.symtable(ast.unparse(statement), "<doc>", "exec")
    binds = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported() or s.is_namespace()}
    reads = {s.get_name() for s in table.get_symbols() if s.is_referenced()}
    nested = list(table.get_children())
    while nested:  # comprehensions, lambdas, functions: what they read from the module
        child = nested.pop()
        reads |= {s.get_name() for s in child.get_symbols() if s.is_referenced() and s.is_global()}
        nested += child.get_children()
    return reads - binds, binds


# --- keras_vit objects as the page's imports make them -----------------------------------------------------------

class _Value:
    """An argument that is not a literal: bound by position or name, never looked at."""

    def __init__(self, node):
        self.text = ast.unparse(node)

    def __repr__(self):
        return self.text


def _submodules_imported_by(package):
    """Full names of the modules a package's __init__ imports (its own source, read, not run)."""
    with open(package.__file__, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _attribute(value, name, imported):
    """getattr(value, name) as a fresh process that ran the page's imports sees it; AttributeError if not."""
    full = f"{getattr(value, '__name__', '')}.{name}"
    if inspect.ismodule(value) and hasattr(value, "__path__") and importlib.util.find_spec(full) is not None:
        lazy = value.__dict__.get("__getattr__")  # a submodule: an attribute only once something imported it
        try:
            exported = lazy is not None and inspect.ismodule(lazy(name))
        except AttributeError:
            exported = False
        if not (exported or full in imported or full in _submodules_imported_by(value)):
            raise AttributeError(f"{full} is not imported: `import {full}` first")
    return getattr(value, name)


def _parents(module_name):
    parts = module_name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def _vit_fields():
    return {f.name for f in dataclasses.fields(keras_vit.ViTConfig)}


def _forwarded(func):
    """The keywords a keras_vit callable's **kwargs passes on (keras_vit's own tables); None: not listed
    here, which fails the check of a call that gives it any."""
    from keras_vit.model import pretrained
    from keras_vit.training import config as training

    vit_args = set(inspect.signature(keras_vit.ViT).parameters) - {"kwargs"}
    if func is keras_vit.ViT:  # Keras Model arguments, the rest ViTConfig.replace
        return _vit_fields() | {"trainable", "dtype"}
    if _variant_of_constructor(func):  # keras_vit.ViT_B16(...) -> keras_vit.ViT("B/16", ...)
        return (vit_args - {"config"}) | _vit_fields() | {"trainable", "dtype"}
    if func is keras_vit.from_pretrained:
        return set(pretrained._MODEL_ARGS) | _vit_fields()
    if getattr(func, "__func__", None) is training.TrainConfig.create.__func__:
        return set(training.RECIPE_FIELDS) | {f.name for f in dataclasses.fields(training.TrainConfig)}
    return None



def _variant_of_constructor(func):
    """"B/16" for keras_vit.ViT_B16 (the variant its closure holds), else None."""
    if not inspect.isfunction(func) or func.__module__ != "keras_vit":
        return None
    return inspect.getclosurevars(func).nonlocals.get("variant")


# --- the checks -------------------------------------------------------------------------------------------------

class _Page:
    """What the blocks of a page checked so far defined: names, keras_vit objects (by name), the modules
    imported; and the (variant, official checkpoint) pairs the last block named."""

    def __init__(self):
        self.defined = set()
        self.objects = {}
        self.imported = set()
        self.checkpoints = []


def check(block, page=None):
    """The problems of `block` (strings naming the doc line), given what `page`'s earlier blocks defined.
    `page` is updated with what this block defines; the (variant, checkpoint name) pairs it names go to
    page.checkpoints."""
    page = page if page is not None else _Page()
    page.checkpoints = []
    problems = []
    try:
        tree = ast.parse(block.source)
        compile(tree, _id(block), "exec")
    except SyntaxError as error:
        return [f"{block.page}:{block.line + (error.lineno or 1) - 1}: does not compile: {error.msg}"]

    def where(node):
        return f"{block.page}:{block.line + node.lineno - 1}"

    known = set(dir(builtins)) | set(STAND_INS)
    for statement in tree.body:
        reads, binds = _reads_and_binds(statement)
        for name in sorted(reads - page.defined - binds - known):
            problems.append(f"{where(statement)}: {name!r} is not defined (import or assign it in this page's "
                            f"blocks, or add it to STAND_INS if the prose defines it)")
        problems += _check_keras_vit(statement, page, where)
        if not isinstance(statement, (ast.Import, ast.ImportFrom)):
            for name in binds:
                page.objects.pop(name, None)  # rebound to something else
        page.defined |= binds
    return problems


def _check_keras_vit(statement, page, where):
    problems = []
    if isinstance(statement, ast.Import):
        for alias in statement.names:
            if alias.name.split(".")[0] != "keras_vit":
                page.objects.pop(alias.asname or alias.name.split(".")[0], None)
                continue
            module = importlib.import_module(alias.name)
            page.imported |= _parents(alias.name)
            if alias.asname:
                page.objects[alias.asname] = module
            else:
                page.objects["keras_vit"] = keras_vit
        return problems
    if isinstance(statement, ast.ImportFrom):
        if statement.level or not (statement.module or "").split(".")[0] == "keras_vit":
            for alias in statement.names:
                page.objects.pop(alias.asname or alias.name, None)
            return problems
        module = importlib.import_module(statement.module)
        page.imported |= _parents(statement.module)
        for alias in statement.names:
            try:
                value = getattr(module, alias.name)
            except AttributeError:
                try:  # `from package import submodule` imports it
                    value = importlib.import_module(f"{statement.module}.{alias.name}")
                except ImportError:
                    problems.append(f"{where(statement)}: {statement.module} has no {alias.name!r}")
                    continue
            if inspect.ismodule(value):
                page.imported.add(value.__name__)
            page.objects[alias.asname or alias.name] = value
        return problems

    resolved = {}  # id(node) -> the keras_vit object it is; absent: not one (or unknown)

    def resolve(node):
        if isinstance(node, ast.Name):
            if node.id in page.objects:
                resolved[id(node)] = page.objects[node.id]
        elif isinstance(node, ast.Attribute):
            resolve(node.value)
            if id(node.value) in resolved:
                base = resolved[id(node.value)]
                try:
                    resolved[id(node)] = _attribute(base, node.attr, page.imported)
                except AttributeError as error:
                    problems.append(f"{where(node)}: {ast.unparse(node)}: {error}")
        elif isinstance(node, ast.Call):
            resolve(node.func)
            for child in [*node.args, *(k.value for k in node.keywords)]:
                resolve(child)
            if id(node.func) in resolved:
                problems.extend(_check_call(resolved[id(node.func)], node, page, where))
            else:  # whatever is called: model="VARIANT", weights="NAME" are compared
                keywords = {k.arg: _literal(k.value) for k in node.keywords if k.arg in ("model", "weights")}
                if isinstance(keywords.get("weights"), str) and isinstance(keywords.get("model"), str):
                    problems.extend(_published(keywords["model"], keywords["weights"], node, page, where))
        else:
            for child in ast.iter_child_nodes(node):
                resolve(child)

    resolve(statement)
    for node in ast.walk(statement):  # "NAME:VARIANT" sources, wherever they are
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and ":" in node.value:
            name, variant = node.value.split(":", 1)
            if name in hub.CHECKPOINTS:
                problems.extend(_published(variant, name, node, page, where))
    return problems


def _literal(node):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return _Value(node)


def _check_call(func, node, page, where):
    text = ast.unparse(node.func)
    if not callable(func) or any(isinstance(a, ast.Starred) for a in node.args) or any(
            k.arg is None for k in node.keywords):
        return []
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return []
    try:
        bound = signature.bind(*map(_literal, node.args), **{k.arg: _literal(k.value) for k in node.keywords})
    except TypeError as error:
        return [f"{where(node)}: {text}(...) does not take these arguments: {error}"]
    bound.apply_defaults()
    problems = []
    rest = {}
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            rest = bound.arguments.get(parameter.name, {})
    if rest:
        accepted = _forwarded(func)
        if accepted is None:
            problems.append(f"{where(node)}: {text} passes {sorted(rest)} through **kwargs: say in "
                            f"_forwarded where keras_vit sends them")
        elif set(rest) - accepted:
            problems.append(f"{where(node)}: {text}(...) takes no keyword {sorted(set(rest) - accepted)}")
    arguments = {**bound.arguments, **rest}
    variant = _variant_of_constructor(func)
    if func is keras_vit.ViT:
        variant = arguments.get("config")
    elif variant is None:
        variant = arguments.get("model")
    weights = arguments.get("weights")
    if isinstance(weights, str) and (variant is not None or weights in hub.CHECKPOINTS):
        problems.extend(_published(variant, weights, node, page, where))
    return problems


BARE_NAME = re.compile(r"^[A-Za-z0-9_+-]+$")


def _published(variant, name, node, page, where):
    if name not in hub.CHECKPOINTS:
        if BARE_NAME.match(name):
            return [f"{where(node)}: weights {name!r} is neither a path nor a checkpoint name "
                    f"({sorted(hub.CHECKPOINTS)})"]
        return []
    if not isinstance(variant, str):
        return []  # the architecture is not written out: nothing to compare
    published = keras_vit.available_weights(variant)
    if name not in published:
        return [f"{where(node)}: no {name!r} checkpoint is published for {variant}; "
                f"keras_vit.available_weights({variant!r}) = {published}"]
    page.checkpoints.append((variant, name))
    return []


def _earlier(block):
    """The page's state after its blocks before `block`."""
    page = _Page()
    for other in BLOCKS:
        if other.page == block.page and other.line < block.line:
            check(other, page)
    return page


# --- the tests --------------------------------------------------------------------------------------------------

def test_the_docs_hold_python_blocks_of_every_page():
    pages = collections.Counter(block.page for block in BLOCKS)
    for page in ("README.md", "docs/index.md", "docs/models.md", "docs/training.md", "docs/weights.md"):
        assert pages[page] >= 1, (page, pages)
    assert len(BLOCKS) >= 7, pages


@pytest.mark.parametrize("block", BLOCKS, ids=_id)
def test_a_documented_python_block_compiles_and_names_what_exists(block):
    problems = check(block, _earlier(block))
    assert not problems, "\n".join(problems)


# The fine-tuning snippet of docs/training.md before #30, with the faults the check must find.
BROKEN = Block("docs/training.md", 279, textwrap.dedent("""\
    train_ds, val_ds = (keras.utils.image_dataset_from_directory("photos", validation_split=0.2, subset=s, seed=1)
                        for s in ("training", "validation"))
    keras_vit.training.train(TrainConfig.create("finetune", model="Ti/16", weights="imagenet21k",
                                                workdir="runs/photos"), dataset=(train_ds, val_ds))
    """))
FAULTS = {
    "the old fine-tuning snippet": (BROKEN, ["'keras' is not defined", "'TrainConfig' is not defined",
                                             "'keras_vit' is not defined",
                                             "no 'imagenet21k' checkpoint is published for Ti/16"]),
    "a subpackage used before it is imported": (Block("x.md", 1, "import keras_vit\nkeras_vit.training.train\n"),
                                                ["keras_vit.training is not imported: `import keras_vit.training`"]),
    "a misspelt keyword": (Block("x.md", 1, 'import keras_vit\nkeras_vit.ViT_B16(num_clases=10)\n'),
                           ["keras_vit.ViT_B16(...) takes no keyword ['num_clases']"]),
    "a misspelt keyword of a named argument": (
        Block("x.md", 1, 'import keras_vit\nkeras_vit.load_model("runs/demo", compiled=True)\n'),
        ["does not take these arguments"]),
    "a misspelt recipe field": (
        Block("x.md", 1, "from keras_vit.training import TrainConfig\nTrainConfig.create('finetune', step=2)\n"),
        ["TrainConfig.create(...) takes no keyword ['step']"]),
    "a name keras_vit does not have": (Block("x.md", 1, "import keras_vit\nkeras_vit.ViT_B17()\n"),
                                       ["x.md:2: keras_vit.ViT_B17: "]),
    "an import keras_vit does not have": (Block("x.md", 1, "from keras_vit import ViT_B17\n"),
                                          ["keras_vit has no 'ViT_B17'"]),
    "a checkpoint source of an unpublished pair": (
        Block("x.md", 1, 'import keras_vit\nkeras_vit.from_pretrained("imagenet21k:S/16")\n'),
        ["no 'imagenet21k' checkpoint is published for S/16"]),
    "a weights name that is no checkpoint": (
        Block("x.md", 1, 'import keras_vit\nkeras_vit.ViT("B/16", weights="imagenet22k")\n'),
        ["weights 'imagenet22k' is neither a path nor a checkpoint name"]),
    "a name used before the block that assigns it": (Block("x.md", 1, "print(model)\nmodel = 1\n"),
                                                     ["x.md:1: 'model' is not defined"]),
    "a syntax error": (Block("x.md", 1, "model = (\n"), ["does not compile"]),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_the_check_finds(fault):
    block, expected = FAULTS[fault]
    problems = "\n".join(check(block))
    for text in expected:
        assert text in problems, problems


def test_published_pairs_pass():
    ok = Block("x.md", 1, textwrap.dedent("""\
        import keras_vit
        from keras_vit.training import TrainConfig
        keras_vit.ViT_B16(image_size=384, num_classes=10, weights="imagenet21k", dropout_rate=0.1)
        keras_vit.ViT("S/16", weights="augreg-imagenet21k")
        TrainConfig.create("finetune", model="Ti/16", weights="augreg-imagenet21k", batch_size=32)
        keras_vit.from_pretrained("augreg-recommended-imagenet21k+imagenet2012-384:B/16", num_classes=5)
        """))
    assert check(ok) == []


def test_every_stand_in_is_used():
    # The table stays the few values the prose defines: one no block reads any more goes.
    read = set()
    for block in BLOCKS:
        for statement in ast.parse(block.source).body:
            read |= _reads_and_binds(statement)[0]
    assert set(STAND_INS) <= read, set(STAND_INS) - read


def _runs():
    found = []
    for page, markers in RUNS.items():
        for marker in markers:
            matching = [b for b in BLOCKS if b.page == page and marker in b.source]
            assert len(matching) == 1, (page, marker, [_id(b) for b in matching])
            trains = re.search(r"\btrain\(", matching[0].source) is not None
            found.append(pytest.param(matching[0], id=_id(matching[0]), marks=[pytest.mark.slow] if trains else []))
    return found


RUN_BLOCKS = _runs()


def _mirror(tmp_path, monkeypatch, checkpoints):
    """A random official-format .npz under the published path of each (variant, name), served from a
    file:// mirror (KERAS_VIT_WEIGHTS_URL) into an empty KERAS_HOME."""
    www = tmp_path / "www"
    for variant, name in set(checkpoints):
        config, published = keras_vit.get_variant(variant), hub.CHECKPOINTS[name][canonical_name(variant)]
        # As published: pre-trained at 224 px with ImageNet-21k's head, fine-tuned on ImageNet at 384 (or 224).
        size = 384 if "384" in published or name == "imagenet21k+imagenet2012" else 224
        classes = 21843 if name.endswith("imagenet21k") else 1000
        (www / published).parent.mkdir(parents=True, exist_ok=True)
        write_npz(www / published, official_params(config, (size // config.total_stride,) * 2, classes))
    monkeypatch.setenv("KERAS_VIT_WEIGHTS_URL", www.as_uri() + "/")
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))


@pytest.mark.parametrize("block", RUN_BLOCKS)
def test_a_documented_python_block_that_runs_offline_runs(block, tmp_path, monkeypatch):
    import keras_vit.training
    from keras_vit.training import trainer

    runs = [b for b in RUN_BLOCKS if b.values[0].page == block.page and b.values[0].line <= block.line]
    page, sources = _Page(), []
    for other in (p.values[0] for p in runs):
        assert check(other, page) == []
        sources.append((other, list(page.checkpoints)))
    _mirror(tmp_path, monkeypatch, [pair for _, pairs in sources for pair in pairs])
    trained = []

    def cut(config, *args, **kwargs):  # 2 steps at batch 8, as the commands test's --steps 2
        trained.append(config)
        return original(config.replace(steps=2, batch_size=8, progress=False), *args, **kwargs)

    original = trainer.train
    monkeypatch.setattr(keras_vit.training, "train", cut)
    monkeypatch.setattr(trainer, "train", cut)
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__docs__"}
    for other, _ in sources:
        exec(compile(other.source, _id(other), "exec"), namespace)
    if re.search(r"\btrain\(", block.source):
        assert trained, "the block trained without keras_vit.training.train: its run was not cut"
        workdir = tmp_path / trained[-1].workdir
        assert (workdir / "model.keras").is_file() and (workdir / "results.json").is_file()
    for variant, name in (pair for _, pairs in sources for pair in pairs):  # the stand-ins were read
        file = os.path.basename(hub.CHECKPOINTS[name][canonical_name(variant)])
        assert list((tmp_path / "keras_home").rglob(file)), file

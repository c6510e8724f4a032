"""The documentation site: `mkdocs build --strict` passes, and fails on what it must catch.

The site (mkdocs.yml, docs/) is built into a temporary folder exactly as a
person building the docs would; strict mode turns every warning (a broken
link or anchor, a page missing from the navigation, a `:::` reference that
does not resolve, a snippet file that is not there) into a failure. A few
seconds. Beside it, every object the API reference renders (the `:::`
identifiers in docs/api/*.md), and every public method or property of it that
the reference shows, must carry a docstring: mkdocstrings leaves an
undocumented member out silently, so the reference would lose it unseen.
Docstrings are read with griffe, the same static reader mkdocstrings uses;
each identifier is also imported, so the reference names what the package
really exports.
"""

import importlib
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "mkdocs.yml")
API = os.path.join(ROOT, "docs", "api")
DIRECTIVE = re.compile(r"^:::\s*(\S+)\s*$")


def _build(config, site_dir):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", config,
                           "--site-dir", str(site_dir)], cwd=os.path.dirname(config), env=env,
                          capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path):
    code, output = _build(CONFIG, tmp_path / "site")
    assert code == 0, output[-4000:]
    model_page = (tmp_path / "site" / "api" / "model" / "index.html").read_text(encoding="utf-8")
    assert 'id="keras_vit.model.ViT"' in model_page and 'id="keras_vit.model.ViT.forward_intermediates"' in model_page
    changelog = (tmp_path / "site" / "changelog" / "index.html").read_text(encoding="utf-8")
    assert "Unreleased" in changelog  # CHANGELOG.md itself is included, not a copy of it


def _copy_of_the_site(tmp_path):
    """mkdocs.yml and docs/ copied; the package and CHANGELOG.md linked (mkdocstrings reads the source)."""
    shutil.copy(CONFIG, tmp_path / "mkdocs.yml")
    shutil.copytree(os.path.join(ROOT, "docs"), tmp_path / "docs")
    for name in ("keras_vit", "CHANGELOG.md"):
        os.symlink(os.path.join(ROOT, name), tmp_path / name)
    return tmp_path


BREAKAGES = {
    "a link to a missing page": ("docs/models.md", "\nSee [the gone page](gone.md).\n", "gone.md"),
    "a link to a missing anchor": ("docs/models.md", "\nSee [nowhere](training.md#no-such-section).\n",
                                   "no-such-section"),
    "a missing image": ("docs/inspection.md", "\n![lost](figures/lost.png)\n", "lost.png"),
    "a reference to an object that does not exist": ("docs/api/model.md", "\n::: keras_vit.model.NoSuchThing\n",
                                                     "NoSuchThing"),
    "a page left out of the navigation": ("docs/orphan.md", "# Orphan\n", "orphan.md"),
}


# mkdocs reports every broken link, anchor, image and orphan page of a build, so those four
# share one build; a `:::` reference that does not resolve stops the build at once, so it has
# its own. Two builds instead of five, each breakage still named in the output.
ABORTS_THE_BUILD = {"a reference to an object that does not exist"}


def _broken_build(tmp_path, breakages):
    site = _copy_of_the_site(tmp_path)
    for breakage in breakages:
        path, text, _ = BREAKAGES[breakage]
        with open(site / path, "a", encoding="utf-8") as f:
            f.write(text)
    return _build(str(site / "mkdocs.yml"), tmp_path / "out")


@pytest.fixture(scope="module")
def broken_builds(tmp_path_factory):
    """{breakage: (exit code, output)} of the two builds holding every breakage."""
    reported = {}
    for group in (sorted(set(BREAKAGES) - ABORTS_THE_BUILD), sorted(ABORTS_THE_BUILD)):
        result = _broken_build(tmp_path_factory.mktemp("broken"), group)
        reported.update({breakage: result for breakage in group})
    return reported


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
@pytest.mark.slow
def test_the_strict_build_fails_on(breakage, broken_builds):
    code, output = broken_builds[breakage]
    assert code != 0, output[-2000:]
    assert BREAKAGES[breakage][2] in output, output[-2000:]


def _references():
    """(page, identifier, options) of every `:::` directive in docs/api/*.md."""
    found = []
    for page in sorted(os.listdir(API)):
        if not page.endswith(".md"):
            continue
        with open(os.path.join(API, page), encoding="utf-8") as f:
            lines = f.read().splitlines()
        for number, line in enumerate(lines):
            match = DIRECTIVE.match(line)
            if not match:
                continue
            block = []
            for following in lines[number + 1:]:
                if not following.startswith("    "):
                    break
                block.append(following[4:])
            options = (yaml.safe_load("\n".join(block)) or {}).get("options", {})
            found.append((page, match.group(1), options))
    return found


REFERENCES = _references()


def _handler_options():
    with open(CONFIG, encoding="utf-8") as f:
        config = yaml.safe_load(f)
    for plugin in config["plugins"]:
        if isinstance(plugin, dict) and "mkdocstrings" in plugin:
            return plugin["mkdocstrings"]["handlers"]["python"]["options"]
    raise AssertionError("mkdocs.yml configures no mkdocstrings python handler")


def _shown(name, filters):
    """Whether mkdocstrings' filters (regexes; a leading "!" excludes) keep a member name."""
    if any(re.search(f[1:], name) for f in filters if f.startswith("!")):
        return False
    positive = [f for f in filters if not f.startswith("!")]
    return not positive or any(re.search(f, name) for f in positive)


def test_the_reference_covers_the_public_api():
    shown = {identifier for _, identifier, _ in REFERENCES}
    assert len(REFERENCES) >= 40
    for needed in ("keras_vit.model.ViT", "keras_vit.config.ViTConfig", "keras_vit.model.pretrained.from_pretrained",
                   "keras_vit.weights.hf.save_pretrained", "keras_vit.weights.sources.load_weights",
                   "keras_vit.training.trainer.train", "keras_vit.training.trainer.Trainer",
                   "keras_vit.training.config.TrainConfig", "keras_vit.export.pipeline.export",
                   "keras_vit.export.format.ExportFormat",
                   "keras_vit.inspection.predict.predict_files", "keras_vit.layers.EncoderBlock"):
        assert needed in shown, needed


def _import(identifier):
    parts = identifier.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            obj = getattr(obj, attribute)
        return obj
    raise ImportError(identifier)


@pytest.fixture(scope="module")
def package():
    import griffe

    return griffe.load("keras_vit", search_paths=[ROOT], resolve_aliases=True)


@pytest.mark.parametrize("page, identifier, options", REFERENCES,
                         ids=[f"{page}:{identifier}" for page, identifier, _ in REFERENCES])
def test_what_the_reference_shows_is_documented(page, identifier, options, package):
    _import(identifier)  # the package exports it, under this name
    obj = package[identifier.split(".", 1)[1]]
    obj = obj.final_target if obj.is_alias else obj
    assert obj.docstring and obj.docstring.value.strip(), f"{identifier} has no docstring"
    if not obj.is_class or options.get("members") is False:
        return
    filters = options.get("filters", _handler_options()["filters"])
    listed = options.get("members")
    missing = []
    for name, member in obj.members.items():
        if member.is_alias or not (member.is_function or "property" in member.labels):
            continue  # dataclass fields and class constants are described in the class docstring
        if (listed is not None and name not in listed) or (listed is None and not _shown(name, filters)):
            continue
        if not (member.docstring and member.docstring.value.strip()):
            missing.append(name)
    assert not missing, f"{identifier}: public members without a docstring: {', '.join(missing)}"

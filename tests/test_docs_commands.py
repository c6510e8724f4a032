"""#22.2: every `keras-vit` command written in the README and docs/ works as written.

Each command in a fenced block (a `$ ` prompt or none; `\\` continuations
joined; a trailing `# comment` dropped; lines that are output, such as
`keras-vit train: ...`, and commands elided with `...` left out) is parsed by
its command's own parser and, for `train`, given every check made before
TensorFlow starts (flags, model, official weights names, workdir): an unknown
flag, a wrong choice or a checkpoint not published for the model fails here.
Those that run offline in seconds run for real, in a folder of stand-ins:
training on the bundled digits with the micro model (steps cut to 2, and the
few-shot pool to the first 500 training digits, 43 or more of each class),
`variants`, and `predict` / `inspect` of `runs/demo` (what the docs' own
`--workdir runs/demo` command trains, run once: it is both that command's test
and the stand-in) on `digits` and `train_digits` (a few digits, flat and in
class folders); a command whose documented output is an error line must fail
with exit status 2. A block preceded by `<!-- docs-test: skip REASON -->` is left out,
with the reason in the docs themselves.
"""

import importlib
import itertools
import os
import re
import shlex

import pytest

from keras_vit import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = re.compile(r"<!--\s*docs-test:\s*skip\b(.*?)-->")


def _documents():
    paths = [os.path.join(ROOT, "README.md")]
    for folder, _, files in os.walk(os.path.join(ROOT, "docs")):
        paths += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".md")]
    return paths


def _blocks(text):
    """(first line number, lines) of each fenced block not marked to be skipped."""
    lines = text.splitlines()
    blocks, inside, start, skip = [], False, 0, False
    for number, line in enumerate(lines, 1):
        if line.strip().startswith("```"):
            if inside:
                if not skip:
                    blocks.append((start, lines[start:number - 1]))
                inside, skip = False, False
            else:
                inside, start = True, number
                skip = number >= 2 and bool(SKIP.search(lines[number - 2]))
    return blocks


def _status(command, following, rest):
    """The exit status the docs show: 2 for an error line right after the command; 1 for a
    predict whose output (up to the next command) says some inputs failed; else 0."""
    if following.startswith(f"keras-vit {command}: error:"):
        return 2
    output = itertools.takewhile(lambda line: not re.match(r"(\$ )?keras-vit [\w-]+ ", line), rest)
    return 1 if any(re.match(rf"keras-vit {command}: \d+ of \d+ inputs failed", line) for line in output) else 0


def _commands():
    found = []
    for path in _documents():
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for start, block in _blocks(text):
            joined, first = "", None
            for offset, line in enumerate(block):
                line = line.rstrip()
                if first is None:
                    first = start + 1 + offset
                joined += line[:-1] + " " if line.endswith("\\") else line
                if line.endswith("\\"):
                    continue
                command, joined, where = joined.strip(), "", f"{os.path.relpath(path, ROOT)}:{first}"
                first = None
                command = command[2:] if command.startswith("$ ") else command
                words = command.split()
                if len(words) < 2 or words[0] != "keras-vit" or words[1] not in cli.COMMANDS or "..." in command:
                    continue
                command = re.sub(r"\s+#\s.*$", "", command)
                following = block[offset + 1].strip() if offset + 1 < len(block) else ""
                found.append(pytest.param(shlex.split(command)[1:], _status(words[1], following, block[offset + 1:]),
                                          id=where))
    return found


COMMANDS = _commands()


def test_the_docs_hold_commands_of_every_kind():
    kinds = {param.values[0][0] for param in COMMANDS}
    assert {param.values[1] for param in COMMANDS} == {0, 1, 2}  # documented errors and failed inputs are recognised
    assert {"train", "export", "predict", "inspect", "variants"} <= kinds, kinds
    assert len(COMMANDS) >= 15


@pytest.mark.parametrize("argv, status", COMMANDS)
def test_a_documented_command_parses_and_passes_the_checks(argv, status, tmp_path, monkeypatch):
    from keras_vit.weights.sources import is_checkpoint_name

    name, rest = argv[0], argv[1:]
    module = importlib.import_module(cli.COMMANDS[name][0])
    parser = cli._Parser(prog=f"keras-vit {name}")
    module.add_arguments(parser)
    args = parser.parse_args([a for a in rest if a not in ("--debug", "--verbose")])
    if name == "train" and status == 0:
        # A --weights the docs name as a local folder (`--weights clip`: the one downloaded above it) is
        # there for the reader; train refuses a --weights that neither exists nor names a checkpoint (#37).
        monkeypatch.chdir(tmp_path)
        if args.weights and not is_checkpoint_name(args.weights):
            os.makedirs(args.weights, exist_ok=True)
        module.check_args(args)


def _runs_offline(argv):
    text = " ".join(argv)
    if argv[0] in ("predict", "inspect", "evaluate"):
        return argv[1] == "runs/demo"
    return argv[0] == "variants" or (argv[0] == "train" and "--dataset mnist5k" in text and "--weights" not in text
                                     and "Mu/4" in text)


def _as_run(argv, workdir):
    """The command as the offline test runs it: a train cut to 2 small steps (and, with few-shot
    figures, a pool of the first 500 training digits: the shots are what the command documents,
    the pool's size is not) into `workdir`; an --out into `workdir` too."""
    argv = list(argv)
    if argv[0] == "train":
        argv += ["--steps", "2", "--workdir", workdir, "--no-progress", "--eval-batch-size", "500",
                 "--batch-size", "16"]
        if "--fewshot-shots" in argv:
            argv += ["--fewshot-pool", "500"]
    if "--out" in argv:
        argv[argv.index("--out") + 1] = workdir
    return argv


OFFLINE = [p for p in COMMANDS if _runs_offline(p.values[0])]
DEMO = [p for p in OFFLINE if p.values[0][0] == "train" and "runs/demo" in p.values[0]]


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    """runs/demo (trained by the docs' own `--workdir runs/demo` command, as the offline test runs
    it), digits/ (3 digits and a broken file), train_digits/<class>/; -> (folder, {id: exit status
    of each documented command run here})."""
    from PIL import Image

    from keras_vit.data import mnist5k

    root = tmp_path_factory.mktemp("docs")
    assert len(DEMO) == 1, [p.id for p in DEMO]  # the run predict/inspect read is documented once
    (argv, status), = [DEMO[0].values]
    ran = {DEMO[0].id: cli.main(_as_run(argv, str(root / "runs" / "demo")))}
    assert ran[DEMO[0].id] == status == 0, ran
    (_, _), (images, labels) = mnist5k.split()
    (root / "digits").mkdir()
    for i in range(3):
        Image.fromarray(images[i, ..., 0]).save(root / "digits" / f"digit{i}_label{labels[i]}.png")
        for c in ("0", "1", "2"):
            (root / "train_digits" / c).mkdir(parents=True, exist_ok=True)
            Image.fromarray(images[3 * i + int(c), ..., 0]).save(root / "train_digits" / c / f"{i}.png")
    (root / "digits" / "broken.png").write_bytes(b"not a png")
    return root, ran


@pytest.mark.slow
@pytest.mark.parametrize("argv, status", OFFLINE)
def test_a_documented_command_that_runs_offline_runs(argv, status, stand_ins, tmp_path, monkeypatch, request):
    root, ran = stand_ins
    where = request.node.callspec.id
    if where in ran:  # the demo run: the stand-in fixture ran this very command (same arguments)
        assert ran[where] == status
        return
    monkeypatch.chdir(root)
    assert cli.main(_as_run(argv, str(tmp_path / "out"))) == status


def test_every_guide_page_with_commands_is_read():
    # The site's pages are read as the README is: moving commands into a page keeps them tested.
    pages = {param.id.rsplit(":", 1)[0] for param in COMMANDS}
    for page in ("README.md", "docs/models.md", "docs/training.md", "docs/export.md", "docs/inspection.md",
                 "docs/weights.md"):
        assert page in pages, page


INSTALL = re.compile(r"pip install\s+[\"']?keras-vit\b")


def test_the_docs_never_install_the_other_keras_vit():
    # `keras-vit` on the package index is an unrelated project: every install line names ours.
    for path in _documents() + [os.path.join(ROOT, "CHANGELOG.md")]:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                assert not INSTALL.search(line), f"{os.path.relpath(path, ROOT)}:{number}: {line.strip()}"

"""Each optional dependency missing gives one line naming its extra, through
the Python API and the command line, and the core works with all of them
missing (#23.2). Each case runs in a fresh interpreter whose import of the
blocked modules fails as if they were not installed (sys.modules[name] = None:
`import name` then raises ModuleNotFoundError naming the module)."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from PIL import Image

from keras_vit.errors import install_hint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What each extra brings that keras_vit imports (setup.cfg [options.extras_require]).
EXTRAS = {
    "train": ["tensorflow_datasets"],
    "tflite": ["ai_edge_litert"],
    "onnx": ["tf2onnx", "onnx", "onnxruntime"],
    "hub": ["huggingface_hub"],
    "plot": ["matplotlib"],
}
# Left the install (#23.2): nothing may import them any more.
FORMER = ["mlxtend", "scipy", "importlib_resources", "sklearn"]


def _run(blocked, code, timeout=300):
    prelude = "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in blocked)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _without(extra, calls, argv):
    """With the extra's modules blocked, in one interpreter: each call's
    MissingExtra as 'TYPE: MESSAGE' on stdout, then the command line `argv`
    (its stderr and exit status are the process's)."""
    body = "".join(f"""
        try:
            {call}
        except MissingExtra as error:
            print(type(error).__name__ + ": " + str(error))
        else:
            print("no error")
    """ for call in calls)
    result = _run(EXTRAS[extra], "from keras_vit.errors import MissingExtra\n" + textwrap.dedent(body) +
                  f"from keras_vit.cli import main\nsys.exit(main({argv!r}))")
    messages = [line for line in result.stdout.splitlines() if line.startswith(("MissingExtra: ", "no error"))]
    assert len(messages) == len(calls), result.stdout + result.stderr
    for message in messages:
        assert message.startswith("MissingExtra: ") and message.endswith(install_hint(extra)), message
    return result


def _assert_one_line(result, extra, command):
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert lines[-1].startswith(f"keras-vit {command}: error: ") and install_hint(extra) in lines[-1], lines


@pytest.fixture(scope="module")
def photo(tmp_path_factory):
    path = tmp_path_factory.mktemp("photo") / "digit.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(path)
    return str(path)


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """A tiny model.keras (32 px, 10 classes) for the commands that need one: written here, in the test's
    process (every extra installed); only the commands run without their extra, in fresh interpreters."""
    import keras_vit

    path = tmp_path_factory.mktemp("model") / "model.keras"
    model = keras_vit.ViT(keras_vit.ViTConfig(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=4, num_layers=1),
                          image_size=32, num_classes=10)
    model.save(str(path))
    return str(path)


def test_install_hint_names_this_distribution():
    assert install_hint("plot") == 'pip install "keras-vision-transformer[plot]"'


@pytest.mark.slow
def test_train_without_tensorflow_datasets(tmp_path):
    result = _without("train", ["from keras_vit import training; from keras_vit.training import data; "
                                "data.open_source(training.TrainConfig.create('scratch', model='Mu/4', "
                                f"dataset='tfds:mnist', workdir={str(tmp_path / 'api')!r}))"],
                      ["train", "--model", "Mu/4", "--dataset", "tfds:mnist", "--steps", "1",
                       "--workdir", str(tmp_path / "cli")])
    _assert_one_line(result, "train", "train")


@pytest.mark.slow
def test_hub_sources_without_huggingface_hub(photo):
    calls = [f"import keras_vit; keras_vit.from_pretrained({source!r})"
             for source in ("hf:google/vit-base-patch16-224", "timm:vit_tiny_patch16_224.augreg_in21k")]
    result = _without("hub", calls, ["predict", "hf:google/vit-base-patch16-224", photo])
    _assert_one_line(result, "hub", "predict")


@pytest.mark.slow
def test_figures_without_matplotlib(saved_model, photo, tmp_path):
    result = _without("plot", ["import numpy as np; from keras_vit.inspection import plots; "
                               f"plots.plot_position_similarity(np.zeros((4, 4, 4, 4)), {str(tmp_path / 'p.png')!r})"],
                      ["inspect", saved_model, "--image", photo, "--out", str(tmp_path / "figures")])
    _assert_one_line(result, "plot", "inspect")
    assert not (tmp_path / "p.png").exists()
    assert not (tmp_path / "figures").exists()  # refused before any folder is made


@pytest.mark.slow
def test_the_core_works_with_every_extra_and_former_dependency_missing():
    blocked = [name for names in EXTRAS.values() for name in names] + FORMER
    result = _run(blocked, """
        import numpy as np
        import keras_vit
        from keras_vit import export, inspection, training, weights  # importing needs no extra
        from keras_vit.data import mnist5k
        model = keras_vit.ViT(keras_vit.ViTConfig(patch_size=8, hidden_size=32, mlp_dim=64, num_heads=4,
                                                  num_layers=1), image_size=32, num_classes=3)
        out = np.asarray(model(np.zeros((2, 32, 32, 3), np.float32)))
        images, labels = mnist5k.read()
        print(out.shape, images.shape, len(set(labels.tolist())))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "(2, 3) (5000, 28, 28, 1) 10"

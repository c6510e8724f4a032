"""The key table (keras_vit.weights.layout, issue #38 item 2): the official
layout is written once, every checkpoint adapter names its source's tensors
for the table's parts, the HF writer is the ViT adapter read backwards, and
the activations and the qkv-bias refusal are one table and one message for
every source."""

import ast
import pathlib
import re

import numpy as np
import pytest
import transformers

import keras_vit
from keras_vit.errors import UserError
from keras_vit.weights import checkpoint, hf_families, hf_modules, layout
from keras_vit.weights.hf import hf_config, hf_tensors
from keras_vit.weights.npz import checkpoint_params
from tests.conftest import tiny_config
from tests.sources_helpers import perturb_keras, perturb_torch, photos, torch_logits

PACKAGE = pathlib.Path(keras_vit.__file__).parent
# The official layout's nested names (blocks, MAP head, position tables, final norm).
NESTED = re.compile(r"encoderblock|MultiHeadDotProductAttention|MlpBlock_|MAPHead_0|posembed_input|encoder_norm"
                    r"|LayerNorm_[02]")


def _string_literals(path):
    """The string constants of a module that are not docstrings."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_the_official_keys_are_written_in_the_key_table_only():
    """Outside weights/layout.py, only the layers name themselves (a layer's name is
    its key's part); no reader, writer or rule spells an official key."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative == "weights/layout.py" or relative.startswith("layers/") or relative == "model/vit.py":
            continue
        found += [f"{relative}:{line}: {value!r}" for line, value in _string_literals(path) if NESTED.search(value)]
    assert not found, found


def test_the_scan_sees_a_key_written_elsewhere(tmp_path):
    """The check above can fail: a module spelling a block key is found."""
    module = tmp_path / "reader.py"
    module.write_text('"""doc: Transformer/encoderblock_0 here is fine."""\n'
                      'KEY = "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"\n')
    assert [value for _, value in _string_literals(module) if NESTED.search(value)] == [
        "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"]


@pytest.mark.parametrize("include_top,representation", [(True, None), (False, None), (False, 16)])
def test_the_hf_writer_is_the_vit_adapter_read_backwards(include_top, representation):
    """checkpoint_params -> HF names -> the ViT adapter gives every tensor back, exactly."""
    config = tiny_config(patch_size=8, representation_size=representation)
    model = keras_vit.ViT(config, image_size=32, num_classes=3, include_top=include_top)
    perturb_keras(model, 3)
    params = checkpoint_params(model)
    written = hf_tensors(model)
    assert all(name.startswith("vit.") or not include_top for name in written if not name.startswith("classifier"))
    mapped = hf_families.map_family(hf_config(model), written, "written")
    assert sorted(mapped.params) == sorted(params)
    for key, value in params.items():
        np.testing.assert_array_equal(mapped.params[key], value, err_msg=key)
    assert mapped.fields["representation_size"] == representation


def test_every_adapter_names_the_tables_block_parts():
    """The block rules of each source cover exactly the table's parts (LayerScale where given)."""
    table = {}
    checkpoint.torch_block(table, 0, "b.", dict(hf_modules.VIT.parts, ls1="l1", ls2="l2"), heads=2)
    leaves = {key.rsplit("/", 1)[0] for key in table}
    assert leaves == {layout.block_key(0, part) for part in layout.BLOCK_PARTS} - {layout.block_key(0, "relative_bias")}
    keras_table = {}
    checkpoint.keras_block(keras_table, 0, "b/", {part: part for part in layout.BLOCK_PARTS})
    assert {key.rsplit("/", 1)[0] for key in keras_table} == leaves - {layout.block_key(0, "ls1"),
                                                                        layout.block_key(0, "ls2")}


def test_a_transform_and_its_inverse_give_the_tensor_back():
    rng = np.random.default_rng(0)
    for transform, shape in ((checkpoint.LINEAR, (6, 4)), (checkpoint.CONV, (8, 3, 2, 2)),
                             (checkpoint.qkv_kernels(2), (8, 8)), (checkpoint.qkv_biases(2), (8,)),
                             (checkpoint.out_kernels(2), (8, 8))):
        tensor = rng.normal(size=shape).astype(np.float32)
        np.testing.assert_array_equal(transform.backward(transform(tensor)), tensor)


def test_one_activation_table_for_every_source():
    for name, expected in checkpoint.ACTIVATIONS.items():
        assert checkpoint.activation(name, "hidden_act", "x") == expected
    for field in ("hidden_act", "act_layer"):
        with pytest.raises(UserError, match=f"x uses {field}='relu', which keras-vit's MLP does not compute"):
            checkpoint.activation("relu", field, "x")


def test_an_hf_vit_with_quick_gelu_loads_with_transformers_logits(tmp_path):
    """ViT is a family of the dispatch: the activations any family reads, ViT reads too."""
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                    image_size=32, patch_size=8, num_labels=3, hidden_act="quick_gelu")
    hf = transformers.ViTForImageClassification(config).eval()
    perturb_torch(hf, 2)
    hf.save_pretrained(tmp_path / "hf")
    model = keras_vit.from_pretrained(str(tmp_path / "hf"))
    assert model.config.mlp_activation == "quick_gelu"
    images = photos(32)
    expected = torch_logits(hf, images)
    assert np.abs(expected).max() > 0.5
    np.testing.assert_allclose(np.asarray(model(images)), expected, atol=1e-4, rtol=0)

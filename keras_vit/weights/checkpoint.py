"""What every checkpoint source is turned into before loading.

Each source (official .npz, HF transformers, timm, keras-hub) is a small
adapter that reads its own config into a `ViTConfig` and renames/reshapes
its tensors into the official key layout (keras_vit.weights.layout); the one
strict loader (npz.load_checkpoint) then checks and assigns them. A tensor an
adapter does not know keeps its source name, so the loader reports it as
"not in the model" instead of it being dropped silently.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Dict, List, Optional, Tuple

import numpy as np

from keras_vit.config import ResNetConfig, ViTConfig
from keras_vit.errors import MissingExtra, UserError
# POSEMB_KEY is the key table's (keras_vit.weights.layout), imported here for the adapters.
from keras_vit.weights.layout import POSEMB_KEY, block_key, block_of, map_key  # noqa: F401


@dataclasses.dataclass
class Checkpoint:
    """A checkpoint in the official layout, with the architecture it was saved from.

    config: the source's architecture and numerics (GELU form, LayerNorm eps).
    params: {official key: float32 array}; unknown tensors under their own names.
    image_size: (height, width) the position embedding was trained for.
    labels: class names of the head, when the source has them.
    source: where it came from, for messages.
    dynamic_image_size: the source takes every image at its own grid (SigLIP2's
        NaFlex): from_pretrained builds a model for any size by default.
    """

    config: ViTConfig
    params: Dict[str, np.ndarray]
    image_size: Tuple[int, int]
    labels: Optional[List[str]] = None
    source: str = ""
    num_channels: int = 3
    dynamic_image_size: bool = False

    @property
    def num_classes(self) -> Optional[int]:
        head = self.params.get("head/kernel")
        return None if head is None else int(head.shape[-1])


def read_json(path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        raise UserError(f"{os.fspath(path)!r} is not a readable JSON config ({error}).") from error


def read_tensors_file(path: str, pickled: Optional[str] = None) -> Optional[Dict[str, np.ndarray]]:
    """The tensors of the safetensors file `path`, or None where it is not there; a pickled file
    `pickled` in its place is refused (refuse_pickle)."""
    if not os.path.isfile(path):
        if pickled is not None and os.path.isfile(pickled):
            refuse_pickle(pickled)
        return None
    return read_safetensors(path)


def read_safetensors(path) -> Dict[str, np.ndarray]:
    """{name: array} from a .safetensors file (never a pickle)."""
    try:
        from safetensors.numpy import load_file
    except ImportError as error:  # pragma: no cover - install_requires has it
        raise MissingExtra("Reading .safetensors checkpoints needs the `safetensors` package: "
                           "pip install safetensors") from error
    try:
        return {k: np.asarray(v) for k, v in load_file(os.fspath(path)).items()}
    except OSError as error:
        raise UserError(f"{os.fspath(path)!r} is not a readable .safetensors file ({error}).") from error
    except Exception as error:  # safetensors' own SafetensorError: the bytes are wrong, the fix is a new copy
        raise UserError(f"{os.fspath(path)!r} is damaged or cut short, as an interrupted download or copy leaves "
                        f"it ({type(error).__name__}: {error}): download or copy it again.") from error


def write_safetensors(tensors: Dict[str, np.ndarray], path) -> None:
    from safetensors.numpy import save_file

    # transformers refuses files whose metadata does not name a framework.
    save_file({k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()}, os.fspath(path),
              metadata={"format": "pt"})


def refuse_pickle(path) -> None:
    raise UserError(
        f"{os.fspath(path)!r} is a PyTorch pickle (pytorch_model.bin / .pt / .pth): keras-vit never unpickles "
        f"files. Convert it to safetensors where you trust it, e.g. "
        f"`transformers.ViTForImageClassification.from_pretrained(DIR).save_pretrained(NEW_DIR)` (transformers "
        f"writes model.safetensors), and pass NEW_DIR."
    )


# --- the numerics and features a source may name, refused once ---

# A source's activation name -> (ViTConfig.mlp_activation, gelu_approximate): transformers'
# hidden_act names and timm's act_layer names. gelu_new, gelu_fast and timm's gelu_tanh are
# the tanh approximation written three ways. (SwiGLU is told by its tensors' shapes.)
ACTIVATIONS = {
    "gelu": ("gelu", False),
    "gelu_pytorch_tanh": ("gelu", True),
    "gelu_new": ("gelu", True),
    "gelu_fast": ("gelu", True),
    "gelu_tanh": ("gelu", True),
    "quick_gelu": ("quick_gelu", False),
}


def activation(name: str, field: str, where: str) -> Tuple[str, bool]:
    """ACTIVATIONS[name], or the one refusal of an activation keras-vit's MLP does not compute."""
    if name not in ACTIVATIONS:
        raise UserError(f"{where} uses {field}={name!r}, which keras-vit's MLP does not compute (GELU, exact or tanh, "
                        f"QuickGELU and SwiGLU): it cannot be loaded without changing its outputs.")
    return ACTIVATIONS[name]


def no_qkv_bias(where: str) -> UserError:
    """The one refusal of attention without query/key/value biases (qkv_bias=False)."""
    return UserError(f"{where} has qkv_bias=False: keras-vit's attention always has query/key/value biases, so "
                     f"this layout cannot be expressed.")


# --- torch layouts -> official (Flax) layouts, shared by the HF and timm adapters ---

def linear_kernel(weight: np.ndarray) -> np.ndarray:
    """torch Linear weight (out, in) -> Dense kernel (in, out)."""
    return np.ascontiguousarray(weight.T)


def conv_kernel(weight: np.ndarray) -> np.ndarray:
    """torch Conv2d weight (out, in, kh, kw) -> (kh, kw, in, out)."""
    return np.ascontiguousarray(weight.transpose(2, 3, 1, 0))


def qkv_kernel(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """A query/key/value torch weight (heads * head_dim, D) -> (D, heads, head_dim)."""
    return linear_kernel(weight).reshape(weight.shape[1], num_heads, -1)


def qkv_bias(bias: np.ndarray, num_heads: int) -> np.ndarray:
    return bias.reshape(num_heads, -1)


def out_kernel(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """The attention output torch weight (D, heads * head_dim) -> (heads, head_dim, D)."""
    return linear_kernel(weight).reshape(num_heads, -1, weight.shape[0])


class Transform:
    """A source tensor -> its official array (a rule's transform), and back (a writer's)."""

    def __init__(self, forward, backward):
        self.forward, self.backward = forward, backward

    def __call__(self, array: np.ndarray) -> np.ndarray:
        return self.forward(array)


LINEAR = Transform(linear_kernel, lambda kernel: kernel.T)
CONV = Transform(conv_kernel, lambda kernel: kernel.transpose(3, 2, 0, 1))


def patch_linear_kernels(patch_size: int) -> Transform:
    """A patch embedding applied as a torch Linear to flattened patches (SigLIP2: each
    patch's pixels in (row, column, channel) order, (D, p * p * C)) -> the patch
    convolution's (p, p, C, D), which computes the same on the image itself."""
    p = int(patch_size)
    return Transform(lambda w: np.ascontiguousarray(w.reshape(w.shape[0], p, p, -1).transpose(1, 2, 3, 0)),
                     lambda kernel: kernel.transpose(3, 0, 1, 2).reshape(kernel.shape[-1], -1))


def qkv_kernels(heads: int) -> Transform:
    return Transform(lambda w: qkv_kernel(w, heads), lambda kernel: kernel.reshape(kernel.shape[0], -1).T)


def qkv_biases(heads: int) -> Transform:
    return Transform(lambda b: qkv_bias(b, heads), lambda bias: bias.reshape(-1))


def out_kernels(heads: int) -> Transform:
    return Transform(lambda w: out_kernel(w, heads), lambda kernel: kernel.reshape(-1, kernel.shape[-1]).T)


# --- rules: {official key: (source name, transform or None)}, written from the key table ---

def torch_dense(table: dict, ours: str, theirs: str, bias: bool = True, kernel=LINEAR, bias_transform=None) -> None:
    """A torch Linear `theirs` (.weight, .bias) as the Dense `ours` (/kernel, /bias)."""
    table[ours + "/kernel"] = (theirs + ".weight", kernel)
    if bias:
        table[ours + "/bias"] = (theirs + ".bias", bias_transform)


def torch_norm(table: dict, ours: str, theirs: str) -> None:
    """A torch LayerNorm `theirs` (.weight, .bias) as the LayerNorm `ours` (/scale, /bias)."""
    table[ours + "/scale"] = (theirs + ".weight", None)
    table[ours + "/bias"] = (theirs + ".bias", None)


def torch_attention(table: dict, ours, theirs: dict, heads: int) -> None:
    """query, key, value, out: `ours(part)` is our key of a part, `theirs` its torch Linear's name."""
    for part in ("query", "key", "value"):
        torch_dense(table, ours(part), theirs[part], kernel=qkv_kernels(heads), bias_transform=qkv_biases(heads))
    torch_dense(table, ours("out"), theirs["out"], kernel=out_kernels(heads))


def torch_block(table: dict, i: int, prefix: str, names: dict, heads: int) -> None:
    """Rules for encoder block i of a torch layout whose names start with `prefix`; `names`
    maps our parts (layout.BLOCK_PARTS: query, key, value, out, norm1, norm2, fc1, fc2, and
    ls1/ls2 naming whole tensors) to the source's modules."""
    torch_attention(table, lambda part: block_key(i, part), {p: prefix + names[p] for p in names}, heads)
    for part in ("norm1", "norm2"):
        torch_norm(table, block_key(i, part), prefix + names[part])
    for part in ("fc1", "fc2"):
        torch_dense(table, block_key(i, part), prefix + names[part])
    for part in ("ls1", "ls2"):
        if part in names:
            table[block_key(i, part) + "/scale"] = (prefix + names[part], None)


def torch_map_head(table: dict, prefix: str, names: dict, heads: int) -> None:
    """Rules for a MAP head (layout.MAP_PARTS) of a torch layout: `names` maps probe, query,
    key, value, out, norm, fc1, fc2 to the source's names under `prefix`."""
    table[map_key("probe")] = (prefix + names["probe"], None)
    torch_attention(table, map_key, {p: prefix + names[p] for p in names}, heads)
    torch_norm(table, map_key("norm"), prefix + names["norm"])
    for part in ("fc1", "fc2"):
        torch_dense(table, map_key(part), prefix + names[part])


def keras_block(table: dict, i: int, prefix: str, names: dict) -> None:
    """Rules for encoder block i of a Keras layout (official shapes: kernel/bias, gamma/beta)."""
    for part in ("query", "key", "value", "out", "fc1", "fc2"):
        for leaf in ("kernel", "bias"):
            table[f"{block_key(i, part)}/{leaf}"] = (f"{prefix}{names[part]}/{leaf}", None)
    for part in ("norm1", "norm2"):
        table[block_key(i, part) + "/scale"] = (f"{prefix}{names[part]}/gamma", None)
        table[block_key(i, part) + "/bias"] = (f"{prefix}{names[part]}/beta", None)


def rename(tensors: Dict[str, np.ndarray], table) -> Dict[str, np.ndarray]:
    """Applies {official key: (source name, transform or None)}. A source name
    that is absent leaves its official key missing, and a source tensor no
    rule uses keeps its own name: the strict loader reports both."""
    out, used = {}, set()
    for key, (name, transform) in table.items():
        if name in tensors:
            used.add(name)
            value = np.asarray(tensors[name], np.float32)
            out[key] = transform(value) if transform else value
    out.update({name: np.asarray(v) for name, v in tensors.items() if name not in used})
    return out


def unrename(params: Dict[str, np.ndarray], table) -> Dict[str, np.ndarray]:
    """rename's inverse (a writer's): {source name: tensor} for every rule whose key `params`
    holds; each rule's transform is a Transform (or None)."""
    return {name: (transform.backward(params[key]) if transform else params[key])
            for key, (name, transform) in table.items() if key in params}


def grid_side(tokens: int, what: str) -> int:
    side = int(round(tokens ** 0.5))
    if side * side != tokens:
        raise UserError(f"{what}: the position embedding's {tokens} grid tokens are not a square grid; "
                        f"pass image_size=(height, width).")
    return side


# --- the official layout: the architecture from the shapes alone ---

_UNIT = re.compile(r"block(\d+)/unit(\d+)/")


def infer_official_config(params: Dict[str, np.ndarray], source: str = "") -> Checkpoint:
    """The architecture of an official-layout checkpoint, read from its tensor shapes."""
    try:
        embedding = params["embedding/kernel"]  # (p, p, C, D)
        blocks = {block_of(key) for key in params} - {None}
        query = params[block_key(0, "query") + "/kernel"]
        mlp = params[block_key(0, "fc1") + "/kernel"]
        posemb = params[POSEMB_KEY]
    except KeyError as error:
        raise UserError(f"{source or 'The checkpoint'} is not an official ViT checkpoint: it has no "
                        f"{error.args[0]!r} tensor.") from error
    resnet = None
    units = {}
    for key in params:
        m = _UNIT.match(key)
        if m:
            stage, unit = int(m.group(1)), int(m.group(2))
            units[stage] = max(units.get(stage, 0), unit)
    if "conv_root/kernel" in params:
        width = params["conv_root/kernel"].shape[-1]
        resnet = ResNetConfig(num_layers=tuple(units[s] for s in sorted(units)), width_factor=width // 64)
    classifier = "token" if "cls" in params else "gap"
    representation = params["pre_logits/kernel"].shape[-1] if "pre_logits/kernel" in params else None
    config = ViTConfig(
        patch_size=int(embedding.shape[0]), hidden_size=int(embedding.shape[-1]), mlp_dim=int(mlp.shape[-1]),
        num_heads=int(query.shape[1]), num_layers=len(blocks), classifier=classifier,
        representation_size=representation, resnet=resnet,
    )
    side = grid_side(posemb.shape[1] - (classifier == "token"), source or "the checkpoint")
    size = side * config.total_stride
    return Checkpoint(config=config, params=dict(params), image_size=(size, size), source=source,
                      num_channels=3 if resnet else int(embedding.shape[2]))

"""Names of the official checkpoints and where they are published.

`weights="imagenet21k"` resolves through this table to a public URL under
`BASE_URL`, and is downloaded once into the Keras cache (~/.keras/keras_vit).
Set KERAS_VIT_WEIGHTS_URL to use a mirror.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Dict, List

from keras_vit.utils import console as _console, storage
from keras_vit.errors import UserError
from keras_vit.variants import canonical_name

BASE_URL = "https://storage.googleapis.com/vit_models/"

_AUGREG_I21K = {
    "Ti/16": "Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0",
    "S/16": "S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0",
    "S/32": "S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0",
    "B/8": "B_8-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0",
    "B/16": "B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0",
    "B/32": "B_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.03-do_0.0-sd_0.0",
    "L/16": "L_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1",
    "R26+S/32": "R26_S_32-i21k-300ep-lr_0.001-aug_light0-wd_0.03-do_0.1-sd_0.1",
    "R+Ti/16": "R_Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0",
}
# The AugReg ImageNet fine-tunes at 224 px used lr 0.03 for the small models.
_AUGREG_FT_LR = {"Ti/16": "0.03", "S/16": "0.03", "S/32": "0.03", "B/32": "0.03", "R26+S/32": "0.03",
                 "R+Ti/16": "0.03"}

# The vit_jax README's recommended AugReg checkpoints ("the best pre-training
# metrics"): {variant: (i21k checkpoint, learning rate of its 384 px ImageNet fine-tune)}.
_AUGREG_RECOMMENDED = {
    "L/16": ("L_16-i21k-300ep-lr_0.001-aug_strong1-wd_0.1-do_0.0-sd_0.0", "0.01"),
    "B/16": ("B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0", "0.03"),
    "S/16": ("S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0", "0.03"),
    "R50+L/32": ("R50_L_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1", "0.01"),
    "R26+S/32": ("R26_S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0", "0.01"),
    "Ti/16": ("Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0", "0.03"),
    "B/32": ("B_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0", "0.01"),
    "S/32": ("S_32-i21k-300ep-lr_0.001-aug_none-wd_0.1-do_0.0-sd_0.0", "0.01"),
    "R+Ti/16": ("R_Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0", "0.03"),
}


def _original(variant: str) -> str:
    # "B/16" -> "ViT-B_16", "R50+B/16" -> "R50+ViT-B_16"
    if "+" in variant:
        resnet, vit = variant.split("+")
        return f"{resnet}+ViT-{vit.replace('/', '_')}"
    return "ViT-" + variant.replace("/", "_")


# {weights name: {variant: path under BASE_URL}}
CHECKPOINTS: Dict[str, Dict[str, str]] = {
    "imagenet21k": {
        v: f"imagenet21k/{_original(v)}.npz"
        for v in ("B/16", "B/32", "L/16", "L/32", "H/14", "R50+B/16", "R50+L/32")
    },
    # Fine-tuned on ImageNet at 384 px.
    "imagenet21k+imagenet2012": {
        v: f"imagenet21k+imagenet2012/{_original(v)}.npz"
        for v in ("B/16", "B/32", "L/16", "L/32", "R50+B/16")
    },
    "augreg-imagenet21k": {v: f"augreg/{name}.npz" for v, name in _AUGREG_I21K.items()},
    "augreg-imagenet21k+imagenet2012": {
        v: f"augreg/{name}--imagenet2012-steps_20k-lr_{_AUGREG_FT_LR.get(v, '0.01')}-res_224.npz"
        for v, name in _AUGREG_I21K.items()
    },
    "augreg-recommended-imagenet21k": {v: f"augreg/{name}.npz" for v, (name, _) in _AUGREG_RECOMMENDED.items()},
    # Fine-tuned on ImageNet at 384 px (the position embedding is resized for other sizes).
    "augreg-recommended-imagenet21k+imagenet2012-384": {
        v: f"augreg/{name}--imagenet2012-steps_20k-lr_{lr}-res_384.npz"
        for v, (name, lr) in _AUGREG_RECOMMENDED.items()
    },
}


def available_weights(variant=None) -> List[str]:
    """Checkpoint names known for `variant` (all names if None)."""
    if variant is None:
        return list(CHECKPOINTS)
    variant = canonical_name(variant)
    return [name for name, table in CHECKPOINTS.items() if variant in table]


def checkpoint_url(variant, weights: str) -> str:
    """The public URL of checkpoint `weights` for `variant`; ValueError if none."""
    if weights not in CHECKPOINTS:
        raise UserError(
            f"Unknown weights {weights!r}: pass a path to a .npz file or one of "
            f"{list(CHECKPOINTS)}."
        )
    name = canonical_name(variant)
    if name not in CHECKPOINTS[weights]:
        raise UserError(
            f"No {weights!r} checkpoint is published for ViT {name}. Weights available for {name}: "
            f"{available_weights(name) or 'none'}; or pass a path to a .npz file."
        )
    base = os.environ.get("KERAS_VIT_WEIGHTS_URL", BASE_URL)
    return base.rstrip("/") + "/" + urllib.parse.quote(CHECKPOINTS[weights][name], safe="/")


def cache_dir() -> str:
    """KERAS_HOME (read now, not when Keras was imported), else ~/.keras: the
    Keras cache, which the checkpoints share. Not created here: a download
    creates the folders it needs, and removes them again if it fails."""
    return os.path.expanduser(os.environ.get("KERAS_HOME", os.path.join("~", ".keras")))


# Seconds the server may stay silent (connecting, or between two reads)
# before a download counts as failed; a slow but live link never waits so long.
_TIMEOUT = 60
_CHUNK = 1 << 20
# What a download raises when the network or the server fails it (urllib
# wraps the failures of connecting in URLError; reading raises the others).
# A full disk or a folder that cannot be written is an OSError of another
# kind, raised as it is.
_NETWORK_ERRORS = (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError, ssl.SSLError)


def download(url: str) -> str:
    """Downloads `url` once into the Keras cache (with a progress bar); returns the local path.

    The file appears whole or not at all (written under a temporary name
    beside its place, then renamed), and a failed download leaves nothing:
    no partial file, and none of the cache folders it created."""
    path = urllib.parse.unquote(url).split("/")
    fname, subdir = path[-1], path[-2].replace("+", "_")
    folder = os.path.join(cache_dir(), "keras_vit", subdir)
    target = os.path.join(folder, fname)
    if os.path.isfile(target):
        return target
    try:
        with _folders_kept_on_success(folder):
            storage.write_bytes(target, lambda f: _stream(url, f))
    except _NETWORK_ERRORS as error:
        raise _could_not_download(url, fname, error) from error
    return target


def _stream(url: str, out) -> None:
    """Copies `url` into the open file `out`, with Keras' progress bar."""
    import keras

    print(f"Downloading data from {url}", flush=True)
    with urllib.request.urlopen(url, timeout=_TIMEOUT) as response:
        size = response.headers.get("Content-Length")
        size = int(size) if size and size.isdigit() else None
        progress = keras.utils.Progbar(size)
        done = 0
        while chunk := response.read(_CHUNK):
            out.write(chunk)
            done += len(chunk)
            progress.update(done)
    if size is not None and done < size:  # a connection closed early reads as a short end, not an error
        raise urllib.error.ContentTooShortError(f"retrieval incomplete: got only {done} of {size} bytes", None)


@contextlib.contextmanager
def _folders_kept_on_success(folder: str):
    """Creates `folder` and its missing parents; if the `with` fails, removes
    the ones it created (never a folder that was there before)."""
    created = []
    parent = os.path.abspath(folder)
    while not os.path.isdir(parent):
        created.append(parent)
        parent = os.path.dirname(parent)
    os.makedirs(folder, exist_ok=True)
    try:
        yield
    except BaseException:
        for made in created:  # deepest first; a folder something else filled meanwhile stays
            with contextlib.suppress(OSError):
                os.rmdir(made)
        raise


def _could_not_download(url: str, fname: str, error: BaseException) -> UserError:
    local = f"/path/to/{fname}"
    example = (f"{_console.argument('weights', local)} (or the file itself where a command takes MODEL)"
               if _console.COMMAND_LINE else _console.argument("weights", local))
    return UserError(  # a ValueError, as before: the fix is a local path
        f"Could not download the checkpoint {url} ({type(error).__name__}: {error}). "
        f"If this machine is offline, download that file elsewhere and pass its local path, "
        f"e.g. {example}."
    )

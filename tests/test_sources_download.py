"""hf:ORG/NAME and timm:NAME through huggingface_hub, never the internet:
HF_HUB_OFFLINE with a cache pre-filled in huggingface_hub's layout
(models--ORG--NAME/refs/REV -> snapshots/COMMIT/FILES)."""

import json
import os
import shutil
import time

import huggingface_hub.constants
import huggingface_hub.utils
import numpy as np
import pytest
import transformers

import keras_vit
from tests.sources_helpers import perturb_torch, photos, torch_logits
from tests.test_sources_timm import hf_reference, timm_config, timm_state, write_timm

COMMIT = "0123456789abcdef0123456789abcdef01234567"
httpx = huggingface_hub.utils.httpx  # huggingface_hub's HTTP client


def _hf_cache(tmp_path, monkeypatch, offline):
    """An empty Hugging Face cache; returns a function that puts a repo snapshot in it."""
    cache = tmp_path / "hf_cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    # huggingface_hub reads both when it is imported: set its constants too.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))

    def put(repo, source_dir, refs=("main",)):
        root = cache / ("models--" + repo.replace("/", "--"))
        shutil.copytree(source_dir, root / "snapshots" / COMMIT)
        (root / "refs").mkdir(parents=True)
        for ref in refs:
            (root / "refs" / ref).write_text(COMMIT)
        return root

    return put


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An offline, empty Hugging Face cache; returns a function that puts a repo snapshot in it."""
    return _hf_cache(tmp_path, monkeypatch, offline=True)


@pytest.fixture
def unreachable_hub(tmp_path, monkeypatch):
    """Online (HF_HUB_OFFLINE unset), but every connection is refused, as on a
    machine without a network; returns (put, the URLs asked for)."""
    asked = []

    def refuse(transport, request):
        asked.append(str(request.url))
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    monkeypatch.setattr(httpx.HTTPTransport, "handle_request", refuse)
    return _hf_cache(tmp_path, monkeypatch, offline=False), asked


def test_hf_repo_from_the_cache(tmp_path, hub_cache):
    hf = transformers.ViTForImageClassification(transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32,
        patch_size=8, num_labels=3)).eval()
    perturb_torch(hf, 11)
    hf.save_pretrained(tmp_path / "hf")
    hub_cache("google/vit-tiny-test", tmp_path / "hf", refs=("main", "v1"))
    images = photos(32)
    for source in ("hf:google/vit-tiny-test", "hf:google/vit-tiny-test@v1", f"hf:google/vit-tiny-test@{COMMIT}"):
        model = keras_vit.from_pretrained(source)
        np.testing.assert_allclose(np.asarray(model(images)), torch_logits(hf, images), atol=1e-4, rtol=0)


def test_offline_without_the_repo_names_it_and_the_fix(hub_cache):
    with pytest.raises(ValueError, match=r"hf:google/vit-base-patch16-224.*offline.*HF_HUB_OFFLINE.*not in the "
                                         r"Hugging Face cache.*pass its local directory"):
        keras_vit.from_pretrained("hf:google/vit-base-patch16-224")


def test_a_gated_repo_names_the_terms_and_the_token(hub_cache, monkeypatch):
    # facebook/dinov3-*: the Hub refuses a token that has not accepted the terms (here, no token at all).
    from huggingface_hub import errors

    def hf_hub_download(repo, filename, **kwargs):
        url = f"https://huggingface.co/{repo}/resolve/main/{filename}"
        raise errors.GatedRepoError(f"403 Client Error. Cannot access gated repo for url {url}.",
                                    response=httpx.Response(403, request=httpx.Request("GET", url)))

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    with pytest.raises(ValueError, match=r"^hf:facebook/dinov3-vits16-pretrain-lvd1689m: facebook/dinov3-vits16-"
                                         r"pretrain-lvd1689m is gated: accept its terms at https://huggingface.co/"
                                         r"facebook/dinov3-vits16-pretrain-lvd1689m .*HF_TOKEN"):
        keras_vit.from_pretrained("hf:facebook/dinov3-vits16-pretrain-lvd1689m")


def test_a_pickle_only_repo_is_refused(tmp_path, hub_cache):
    (tmp_path / "pickled").mkdir()
    (tmp_path / "pickled" / "config.json").write_text(json.dumps({"model_type": "vit"}))
    (tmp_path / "pickled" / "pytorch_model.bin").write_bytes(b"never unpickled")
    hub_cache("someone/old-vit", tmp_path / "pickled")
    with pytest.raises(ValueError, match="no model.safetensors.*never unpickles.*Convert it to safetensors"):
        keras_vit.from_pretrained("hf:someone/old-vit")


def test_timm_name_from_the_cache(tmp_path, hub_cache):
    hf = hf_reference()
    write_timm(tmp_path / "timm", timm_state(hf, tmp_path), timm_config())
    hub_cache("timm/vit_tiny_patch8_32.test", tmp_path / "timm")
    model = keras_vit.from_pretrained("timm:vit_tiny_patch8_32.test")
    images = photos(32)
    np.testing.assert_allclose(np.asarray(model(images)), torch_logits(hf, images), atol=1e-4, rtol=0)
    # The constructors take the same name when the architecture (and timm's numerics) is given.
    config = keras_vit.ViTConfig(patch_size=8, hidden_size=48, mlp_dim=96, num_heads=3, num_layers=2,
                                 gelu_approximate=False)
    same = keras_vit.ViT(config, image_size=32, num_classes=5, weights="timm:vit_tiny_patch8_32.test")
    np.testing.assert_allclose(np.asarray(same(images)), torch_logits(hf, images), atol=1e-4, rtol=0)


# --- an unreachable Hub, bugs and mistakes (#30) -----------------------------------------------------------

def _tiny_hf(tmp_path):
    hf = transformers.ViTForImageClassification(transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32,
        patch_size=8, num_labels=3)).eval()
    hf.save_pretrained(tmp_path / "hf")
    return hf


def test_an_unreachable_hub_answers_at_once_without_retries(tmp_path, unreachable_hub, capsys):
    """huggingface_hub alone retries an unreachable Hub for ~23 s; one refused probe is enough to know."""
    from tests.test_runs import _cli, _png, assert_user_error

    put, asked = unreachable_hub
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"hf:google/vit-base-patch16-224.*offline.*not in the Hugging Face "
                                         r"cache.*pass its local directory"):
        keras_vit.from_pretrained("hf:google/vit-base-patch16-224")
    assert time.monotonic() - start < 5
    assert len([url for url in asked if "vit-base-patch16-224" in url]) == 1, asked  # no retries
    code, err = _cli(["predict", "hf:google/vit-base-patch16-224", _png(tmp_path / "a.png")], capsys)
    assert_user_error(code, err, "predict", "offline")
    # What is in the cache is used at once, as huggingface_hub would after its retries.
    hf = _tiny_hf(tmp_path)
    put("google/vit-tiny-test", tmp_path / "hf")
    start = time.monotonic()
    model = keras_vit.from_pretrained("hf:google/vit-tiny-test")
    assert time.monotonic() - start < 5
    images = photos(32)
    np.testing.assert_allclose(np.asarray(model(images)), torch_logits(hf, images), atol=1e-4, rtol=0)
    assert os.environ.get("HF_HUB_OFFLINE") is None and huggingface_hub.constants.HF_HUB_OFFLINE is False


def test_a_bug_in_the_hub_download_is_shown_as_a_bug(tmp_path, hub_cache, monkeypatch, capsys):
    from tests.test_runs import _cli, _png, assert_bug

    def hf_hub_download(*args, **kwargs):
        raise TypeError("hf_hub_download() got an unexpected keyword argument 'simulated_bug'")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    code, err = _cli(["predict", "hf:google/vit-base-patch16-224", _png(tmp_path / "a.png")], capsys)
    assert_bug(code, err, "simulated_bug")
    assert "offline" not in err


def test_the_peft_base_of_an_hf_name_is_read_from_the_cache_without_the_network(tmp_path, unreachable_hub):
    """A LoRA run's end asks whether its hf: base is a family peft's layout is written for (for
    WORKDIR/peft) from the cache the run's start filled: no connection, and a model without it or
    an uncached name is no peft base."""
    from keras_vit.runs.adapter import peft_base

    put, asked = unreachable_hub
    _tiny_hf(tmp_path)
    put("google/vit-tiny-test", tmp_path / "hf", refs=("main", "v1"))
    transformers.Dinov2Model(transformers.Dinov2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                                       image_size=32, patch_size=8)).save_pretrained(tmp_path / "d")
    put("facebook/dinov2-tiny-test", tmp_path / "d")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.json").write_text('{"model_type": "vit_msn"}')  # no peft layout written for it
    put("facebook/vit-msn-tiny-test", tmp_path / "a")
    assert peft_base("hf:google/vit-tiny-test").name == peft_base("hf:google/vit-tiny-test@v1").name == (
        "google/vit-tiny-test")
    assert peft_base(str(tmp_path / "hf")).name == str(tmp_path / "hf")
    assert peft_base("hf:facebook/dinov2-tiny-test").config["model_type"] == "dinov2"
    assert peft_base("hf:facebook/vit-msn-tiny-test") is None and peft_base("hf:google/not-cached") is None
    assert asked == []

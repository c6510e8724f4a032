"""Official-format checkpoints: strict loading, resizing, saving, downloading."""

import functools
import http.server
import threading

import numpy as np
import pytest
import scipy.ndimage

import keras_vit
from keras_vit.weights import read_npz, resize_position_embedding
from tests.conftest import tiny_config, tiny_hybrid_config
from tests.layers import reference
from tests.official_format import official_params, write_npz

POSEMB = "Transformer/posembed_input/pos_embedding"


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_loaded_model_computes_the_official_forward_pass(tmp_path, rng, classifier):
    config = tiny_config(classifier=classifier, representation_size=16)
    params = official_params(config, grid=(4, 4), num_classes=7, representation_size=16, rng=rng)
    path = write_npz(tmp_path / "ckpt.npz", params)
    model = keras_vit.ViT(config, image_size=16, num_classes=7, weights=path)
    images = rng.uniform(-1, 1, size=(3, 16, 16, 3)).astype("float32")
    np.testing.assert_allclose(np.asarray(model(images)), reference.vit_forward(params, images, config),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("group_norm_4d", [False, True])
def test_hybrid_checkpoint_loads_every_tensor(tmp_path, rng, group_norm_4d):
    config = tiny_hybrid_config()
    params = official_params(config, grid=(4, 4), num_classes=3, rng=rng, group_norm_4d=group_norm_4d)
    model = keras_vit.ViT(config, image_size=32, num_classes=3, weights=write_npz(tmp_path / "h.npz", params))
    by_key = keras_vit.weights.variables_by_key(model)
    assert set(by_key) == set(params)
    for key, value in params.items():
        np.testing.assert_array_equal(np.asarray(by_key[key]), value.reshape(by_key[key].shape), err_msg=key)


def _load(config, params, tmp_path, **kw):
    path = write_npz(tmp_path / "c.npz", params)
    return keras_vit.ViT(config, weights=path, **kw)


def test_missing_tensor_is_named(tmp_path, rng):
    params = official_params(tiny_config(), (4, 4), 3, rng=rng)
    del params["Transformer/encoderblock_1/MlpBlock_3/Dense_0/bias"]
    with pytest.raises(ValueError, match="missing from the checkpoint.*encoderblock_1/MlpBlock_3/Dense_0/bias"):
        _load(tiny_config(), params, tmp_path, image_size=16, num_classes=3)


def test_extra_tensor_is_named(tmp_path, rng):
    params = official_params(tiny_config(num_layers=3), (4, 4), 3, rng=rng)
    with pytest.raises(ValueError, match="not in the model.*encoderblock_2"):
        _load(tiny_config(), params, tmp_path, image_size=16, num_classes=3)


def test_mismatched_shape_is_named(tmp_path, rng):
    params = official_params(tiny_config(mlp_dim=48), (4, 4), 3, rng=rng)
    with pytest.raises(ValueError, match=r"shape mismatches.*Dense_0/bias: checkpoint \(48,\), model \(64,\)"):
        _load(tiny_config(), params, tmp_path, image_size=16, num_classes=3)


def test_failed_load_changes_nothing(tmp_path, rng):
    model = keras_vit.ViT(tiny_config(), image_size=16, num_classes=3)
    before = [w.copy() for w in model.get_weights()]
    params = official_params(tiny_config(), (4, 4), 3, rng=rng)
    params["Transformer/encoder_norm/scale"] = np.ones(5, np.float32)
    with pytest.raises(ValueError):
        keras_vit.load_weights(model, params)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_matching_head_is_loaded(tmp_path, rng):
    params = official_params(tiny_config(), (4, 4), 3, rng=rng)
    model = _load(tiny_config(), params, tmp_path, image_size=16, num_classes=3)
    np.testing.assert_array_equal(np.asarray(model.head.kernel), params["head/kernel"])


def test_new_head_is_zero_and_the_user_is_told(tmp_path, rng, capsys):
    params = official_params(tiny_config(), (4, 4), 21, rng=rng)
    capsys.readouterr()
    model = _load(tiny_config(), params, tmp_path, image_size=16, num_classes=3)
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "starts at zero" in line]
    assert line.startswith("keras-vit: warning: the checkpoint has a head of 21 classes")  # the one channel
    assert "(3 classes) starts at zero" in line
    assert not np.any(np.asarray(model.head.kernel)) and not np.any(np.asarray(model.head.bias))
    # ...and the rest was loaded.
    np.testing.assert_array_equal(np.asarray(model.class_token.cls), params["cls"])


def test_representation_layer_dropped_for_fine_tuning(tmp_path, rng, capsys):
    params = official_params(tiny_config(), (4, 4), 21, representation_size=16, rng=rng)
    model = _load(tiny_config(), params, tmp_path, image_size=16, num_classes=3)
    assert model.pre_logits is None and "dropping the checkpoint's representation layer" in capsys.readouterr().err
    with_repr = _load(tiny_config(representation_size=16), params, tmp_path, image_size=16, num_classes=21)
    np.testing.assert_array_equal(np.asarray(with_repr.pre_logits.kernel), params["pre_logits/kernel"])


def test_model_with_representation_needs_it_in_the_checkpoint(tmp_path, rng):
    params = official_params(tiny_config(), (4, 4), 3, rng=rng)
    with pytest.raises(ValueError, match="missing from the checkpoint.*pre_logits/bias, pre_logits/kernel"):
        _load(tiny_config(representation_size=16), params, tmp_path, image_size=16, num_classes=3)


def test_features_model_ignores_the_head(tmp_path, rng):
    params = official_params(tiny_config(), (4, 4), 3, rng=rng)
    model = _load(tiny_config(), params, tmp_path, image_size=16, include_top=False)
    assert model.head is None


# --- Position embedding resize -------------------------------------------------------

def official_resize(posemb, new_side, classifier="token"):
    """The official loader's resize, with scipy itself."""
    if classifier == "token":
        tok, grid = posemb[:, :1], posemb[0, 1:]
    else:
        tok, grid = posemb[:, :0], posemb[0]
    old = int(np.sqrt(len(grid)))
    grid = grid.reshape(old, old, -1)
    grid = scipy.ndimage.zoom(grid, (new_side / old, new_side / old, 1), order=1)
    return np.concatenate([tok, grid.reshape(1, new_side * new_side, -1)], axis=1)


@pytest.mark.parametrize("old,new", [(14, 24), (24, 14), (7, 12), (4, 4), (3, 1), (2, 9)])
def test_resize_matches_scipy_zoom(rng, old, new):
    posemb = rng.normal(size=(1, 1 + old * old, 5)).astype(np.float32)
    np.testing.assert_allclose(resize_position_embedding(posemb, new), official_resize(posemb, new),
                               rtol=1e-5, atol=1e-6)


def test_resize_gap_and_non_square(rng):
    posemb = rng.normal(size=(1, 36, 4)).astype(np.float32)
    np.testing.assert_allclose(resize_position_embedding(posemb, 9, num_prefix_tokens=0),
                               official_resize(posemb, 9, classifier="gap"), rtol=1e-5, atol=1e-6)
    out = resize_position_embedding(posemb, (3, 8), num_prefix_tokens=0)
    expected = scipy.ndimage.zoom(posemb[0].reshape(6, 6, 4), (3 / 6, 8 / 6, 1), order=1)
    np.testing.assert_allclose(out, expected.reshape(1, 24, 4), rtol=1e-5, atol=1e-6)


def test_resize_rejects_non_square_without_old_grid(rng):
    with pytest.raises(ValueError, match="not a square grid: pass old_grid"):
        resize_position_embedding(rng.normal(size=(1, 1 + 12, 4)), 4)


def test_loading_at_a_new_resolution_resizes(tmp_path, rng, capsys):
    params = official_params(tiny_config(), (4, 4), 3, rng=rng)
    model = _load(tiny_config(), params, tmp_path, image_size=24, num_classes=3)
    assert "resizing the position embedding from 17 to 37 tokens" in capsys.readouterr().err
    np.testing.assert_allclose(np.asarray(model.position_embedding.pos_embedding),
                               official_resize(params[POSEMB], 6), rtol=1e-5, atol=1e-6)


# --- Saving -------------------------------------------------------------------------------

def test_save_round_trip(tmp_path, rng):
    config = tiny_hybrid_config(representation_size=8)
    params = official_params(config, (4, 4), 3, representation_size=8, rng=rng)
    model = keras_vit.ViT(config, image_size=32, num_classes=3, weights=params)
    path = keras_vit.save_weights(model, tmp_path / "saved.npz")
    saved = read_npz(path)
    assert set(saved) == set(params)
    for key in params:
        np.testing.assert_array_equal(saved[key], params[key], err_msg=key)
    again = keras_vit.ViT(config, image_size=32, num_classes=3, weights=path)
    images = rng.uniform(-1, 1, size=(2, 32, 32, 3)).astype("float32")
    np.testing.assert_array_equal(np.asarray(again(images)), np.asarray(model(images)))


def test_corrupt_file_is_a_clear_error(tmp_path):
    path = tmp_path / "broken.npz"
    path.write_bytes(b"PK\x03\x04 this is not a zip archive")
    with pytest.raises(ValueError, match="not a readable .npz checkpoint.*truncated or corrupt"):
        keras_vit.ViT(tiny_config(), image_size=16, weights=str(path))


def test_truncated_file_is_a_clear_error(tmp_path, rng):
    good = write_npz(tmp_path / "good.npz", official_params(tiny_config(), (4, 4), 3, rng=rng))
    data = open(good, "rb").read()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="not a readable .npz checkpoint"):
        keras_vit.ViT(tiny_config(), image_size=16, weights=str(tmp_path / "cut.npz"))


# --- Downloading named checkpoints (from a loopback server, never the internet) -----

@pytest.fixture
def checkpoint_server(tmp_path, monkeypatch):
    """Serves tmp_path/www over HTTP on 127.0.0.1 as the checkpoint bucket."""
    www = tmp_path / "www"
    www.mkdir()
    requests = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            requests.append(self.path)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(www)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("KERAS_VIT_WEIGHTS_URL", f"http://127.0.0.1:{server.server_address[1]}/")
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
    yield www, requests
    server.shutdown()


def test_named_weights_download_once_into_the_cache(checkpoint_server, rng, monkeypatch):
    www, requests = checkpoint_server
    config = keras_vit.get_variant("Ti/16").replace(num_layers=1)  # a 1-block Ti/16 keeps it small
    # available_weights is keyed by variant, so serve the real file name with this model's tensors.
    monkeypatch.setattr(keras_vit.weights.hub, "canonical_name", lambda _: "Ti/16")
    params = official_params(config, (2, 2), 5, rng=rng)
    (www / "augreg").mkdir()
    name = keras_vit.weights.CHECKPOINTS["augreg-imagenet21k"]["Ti/16"]
    write_npz(www / name, params)
    model = keras_vit.ViT(config, image_size=32, num_classes=5, weights="augreg-imagenet21k")
    np.testing.assert_array_equal(np.asarray(model.head.kernel), params["head/kernel"])
    assert len([r for r in requests if r.endswith(".npz")]) == 1
    keras_vit.ViT(config, image_size=32, num_classes=5, weights="augreg-imagenet21k")
    assert len([r for r in requests if r.endswith(".npz")]) == 1  # served from the cache


def test_url_of_a_named_checkpoint():
    assert keras_vit.weights.checkpoint_url("B/16", "imagenet21k") == \
        "https://storage.googleapis.com/vit_models/imagenet21k/ViT-B_16.npz"
    assert keras_vit.weights.checkpoint_url("R50+B/16", "imagenet21k+imagenet2012") == \
        "https://storage.googleapis.com/vit_models/imagenet21k%2Bimagenet2012/R50%2BViT-B_16.npz"
    assert keras_vit.available_weights("H/14") == ["imagenet21k"]
    assert "augreg-imagenet21k" in keras_vit.available_weights("S/16")


def test_offline_error_names_the_url_and_the_fix(checkpoint_server, monkeypatch):
    # Nothing is served at that path: the download fails as it would offline.
    with pytest.raises(ValueError, match=r"Could not download the checkpoint http://127\.0\.0\.1:\d+/imagenet21k/"
                                         r"ViT-B_32\.npz.*pass its local path.*weights='/path/to/ViT-B_32\.npz'"):
        keras_vit.ViT_B32(weights="imagenet21k")


# --- failures: the user's one line, or a bug's traceback; nothing left behind (#30) -------------------------

def _closed_port():
    """A loopback port nothing listens on: connecting is refused, as offline."""
    import socket

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        return closed.getsockname()[1]


def test_a_failed_download_leaves_no_cache_folder(checkpoint_server, tmp_path):
    home = tmp_path / "keras_home"  # KERAS_HOME, not there yet
    with pytest.raises(ValueError, match="Could not download the checkpoint .*HTTPError"):  # 404
        keras_vit.from_pretrained("augreg-imagenet21k:Ti/16")
    assert not home.exists()
    # A cache that was there stays as it was; only what the download created goes.
    (home / "keras_vit").mkdir(parents=True)
    (home / "keras_vit" / "other.npz").write_bytes(b"kept")
    with pytest.raises(ValueError, match="Could not download"):
        keras_vit.from_pretrained("augreg-imagenet21k:Ti/16")
    assert [p.name for p in home.rglob("*")] == ["keras_vit", "other.npz"]


def test_a_download_cut_short_leaves_no_partial_file(tmp_path, monkeypatch):
    class CutShort(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            self.wfile.write(b"\x00" * 1000)  # then the connection closes

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), CutShort)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("KERAS_VIT_WEIGHTS_URL", f"http://127.0.0.1:{server.server_address[1]}/")
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
    try:
        with pytest.raises(ValueError, match="Could not download the checkpoint .*ContentTooShortError.*got only "
                                             "1000 of 100000 bytes"):
            keras_vit.from_pretrained("augreg-imagenet21k:Ti/16")
    finally:
        server.shutdown()
    assert not (tmp_path / "keras_home").exists()


def test_refused_download_and_corrupt_npz_are_one_line_exit_2(tmp_path, rng, monkeypatch, capsys):
    from tests.test_runs import _cli, _png, assert_user_error

    monkeypatch.setenv("KERAS_VIT_WEIGHTS_URL", f"http://127.0.0.1:{_closed_port()}/")
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
    image = _png(tmp_path / "a.png")
    code, err = _cli(["predict", "augreg-imagenet21k:Ti/16", image], capsys)
    assert_user_error(code, err, "predict", "Could not download the checkpoint")
    assert "refused" in err and not (tmp_path / "keras_home").exists()
    good = write_npz(tmp_path / "good.npz", official_params(tiny_config(), (4, 4), 3, rng=rng))
    (tmp_path / "cut.npz").write_bytes(open(good, "rb").read()[:2000])
    code, err = _cli(["predict", tmp_path / "cut.npz", image], capsys)
    assert_user_error(code, err, "predict", "is not a readable .npz checkpoint")


def test_bugs_in_a_download_helper_and_a_weights_loader_are_shown_as_bugs(checkpoint_server, tmp_path, rng,
                                                                        monkeypatch, capsys):
    from keras_vit.model import pretrained
    from keras_vit.weights import hub
    from tests.test_runs import _cli, _png, assert_bug

    image = _png(tmp_path / "a.png")

    def stream(url, out):
        raise TypeError("write() argument must be bytes, not None (simulated bug)")

    monkeypatch.setattr(hub, "_stream", stream)
    code, err = _cli(["predict", "augreg-imagenet21k:Ti/16", image], capsys)
    assert_bug(code, err, "simulated bug")
    assert "Could not download" not in err and not (tmp_path / "keras_home").exists()

    def load_checkpoint(model, params):
        raise TypeError("unhashable type: 'list' (simulated bug)")

    monkeypatch.setattr(pretrained, "load_checkpoint", load_checkpoint)
    good = write_npz(tmp_path / "good.npz", official_params(tiny_config(), (4, 4), 3, rng=rng))
    code, err = _cli(["predict", good, image], capsys)
    assert_bug(code, err, "simulated bug")

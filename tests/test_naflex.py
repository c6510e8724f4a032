"""SigLIP2's NaFlex through the command-line paths: `predict` reads each photo at its own
NaFlex size (its aspect ratio kept, the most patches the table holds) and gives what
transformers gives for those pixels; the SavedModel's bytes signature decodes, sizes and
classifies each image as `predict` does. (The model's exactness, padded batches and the
size rule against transformers' own: tests/test_hf_families.py.)"""

import numpy as np
import pytest
import torch
from PIL import Image

import keras_vit
from keras_vit.model.naflex import naflex_pixels
from tests.test_hf_families import CASES, naflex_inputs, saved

SHAPES = ((30, 50), (64, 20), (32, 32), (9, 200))  # wide, tall, the table's own, a sliver


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """A perturbed Siglip2ForImageClassification (8 x 8 table, patch 4), keras_vit's model of it,
    and PNG files of four aspect ratios."""
    tmp = tmp_path_factory.mktemp("naflex")
    hf, directory = saved(tmp, "siglip2_classifier", positions=5.0)
    model = keras_vit.from_pretrained(str(directory))
    rng = np.random.default_rng(0)
    files = []
    for i, shape in enumerate(SHAPES):
        files.append(str(tmp / f"photo{i}.png"))
        Image.fromarray(rng.integers(0, 256, size=(*shape, 3), dtype=np.uint8)).save(files[-1])
    return hf, model, files


def test_predict_reads_each_photo_at_its_own_naflex_size(classifier):
    from keras_vit.images import decode
    from keras_vit.inspection.predict import predict_files

    hf, model, files = classifier
    predictions, failures = predict_files(model, files, top_k=5, batch_size=3)  # two padded batches
    assert not failures and [p.path for p in predictions] == files
    pixels = [naflex_pixels(decode(f, 3), model) for f in files]
    # Each at the size transformers' processor gives it: at most 64 patches of 4 px, its aspect ratio kept.
    from transformers.models.siglip2.image_processing_pil_siglip2 import get_image_size_for_max_num_patches

    assert [p.shape[:2] for p in pixels] == [get_image_size_for_max_num_patches(*s, 4, 64) for s in SHAPES]
    assert pixels[0].shape[:2] == (24, 40) and pixels[3].shape[:2] == (8, 128)
    with torch.no_grad():
        logits = hf(**naflex_inputs([p / 127.5 - 1 for p in pixels], CASES["siglip2_classifier"][4])).logits
    want = torch.softmax(logits, -1).numpy()
    for prediction, row in zip(predictions, want):
        np.testing.assert_allclose(prediction.probabilities, row[prediction.indices], atol=1e-5, rtol=0)
    assert np.ptp(want, axis=0).max() > 1e-3  # the photos get answers of their own


@pytest.mark.slow
def test_serving_bytes_classifies_each_image_at_its_own_aspect_ratio(classifier, tmp_path):
    import tensorflow as tf

    from keras_vit.export import export
    from keras_vit.inspection.predict import predict_files

    _, model, files = classifier
    pixels = np.random.default_rng(1).uniform(0, 255, size=(4, 32, 32, 3)).astype("float32")
    report = export(model, "saved_model", str(tmp_path), validation_data=pixels, name="naflex", latency_runs=1,
                    verbose=False)
    assert report["passed"]
    served = tf.saved_model.load(report["artifacts"][0]["path"]).signatures["serving_bytes"]
    probabilities = served(image_bytes=tf.constant([open(f, "rb").read() for f in files]))["probabilities"].numpy()
    predictions, _ = predict_files(model, files, top_k=5)
    for prediction, row in zip(predictions, probabilities):
        np.testing.assert_allclose(row[prediction.indices], prediction.probabilities, atol=1e-6, rtol=0)


def test_predict_pads_like_shapes_together_within_twice_the_patch_budget():
    from keras_vit.model.naflex import batches_by_shape

    grids = [(8, 32), (32, 8), (16, 16), (1, 256), (256, 1), (9, 28), (30, 8)]
    batches = batches_by_shape(grids, 2 * 256, batch_size=3)
    assert sorted(i for batch in batches for i in batch) == list(range(len(grids)))  # each image once
    for batch in batches:
        rows, cols = max(grids[i][0] for i in batch), max(grids[i][1] for i in batch)
        assert len(batch) <= 3 and (len(batch) == 1 or rows * cols <= 512), (batch, rows, cols)
    assert [1, 6] in batches or [6, 1] in batches  # the two tall ones share a batch

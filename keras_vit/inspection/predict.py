"""Top-k predictions for image files, with the model's labels."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

from keras_vit import runs
from keras_vit.utils import console as _console
from keras_vit.images import IMAGE_EXTENSIONS, find_images, load_images, model_inputs
from keras_vit.errors import UserError

# The run folder is read by keras_vit.runs, the one reader of workdirs.
load_model = runs.load_model
read_labels_file = runs.read_labels


def find_labels(model_path, labels_path=None):
    """The class names for a model: `labels_path` if given, else its workdir's
    (labels.txt, or a labels list in results.json), else None (class indices)."""
    if labels_path:
        return runs.read_labels(labels_path)
    return runs.find_labels(model_path)


def predict_probabilities(model, images, batch_size=32):
    """Pixels (B, H, W, C) in 0..255 -> class probabilities (B, num_classes)."""
    check_classifies(model)
    outputs = []
    for start in range(0, len(images), batch_size):
        x = model_inputs(model, images[start:start + batch_size])
        outputs.append(np.asarray(model.predict_on_batch(x), dtype=np.float32))
    return to_probabilities(model, np.concatenate(outputs) if outputs else np.zeros((0, model.num_classes)))


def to_probabilities(model, outputs):
    """The model's outputs (B, num_classes) as probabilities: softmax of
    logits, unchanged where the head already ends in softmax or sigmoid."""
    from keras_vit.model import returns_probabilities

    outputs = np.asarray(outputs, dtype=np.float32)
    if returns_probabilities(model):
        return outputs
    logits = outputs - outputs.max(axis=-1, keepdims=True)
    e = np.exp(logits)
    return e / e.sum(axis=-1, keepdims=True)


def check_classifies(model):
    """Raises a UserError naming the way on when `model` has no classification head
    (a backbone checkpoint: DINOv2, CLIP's vision tower, a ViTModel)."""
    from keras_vit.runs.source import no_head_error

    if getattr(model, "include_top", True) and getattr(model, "num_classes", 1) is not None:
        return
    raise no_head_error("predict")


@dataclasses.dataclass
class Prediction:
    """The top-k classes of one image, best first."""

    path: str
    indices: list
    labels: list
    probabilities: list

    def to_dict(self):
        """The prediction as a dict of plain values (for JSON)."""
        return dataclasses.asdict(self)


def predict_task(path, task, paths, batch_size=32, recursive=False):
    """The served outputs (Task.serving_outputs) of the run at `path` for image files and folders:
    ([(file, {output: numpy value}, (height, width) of the upright image)] in input order,
    [(file, reason)] of files that failed). Each image is resized to the run's size and scaled as
    it trained; a run whose ViT has rotary positions (DINOv3) reads each at its own aspect ratio
    within the run's patches, as its exported serving_bytes does (PatchGridModel.own_size_rule)."""
    from keras_vit.model.patch_grid import task_model

    model = task_model(runs.load_model(path), "predict")
    *run_size, channels = model.input_size
    read_size = model.own_size_rule() if model.rotary else (lambda height, width: tuple(run_size))
    if model.rotary:
        model = model.with_image_size(dynamic_image_size=True)
    files = find_images(paths, recursive=recursive)
    predictions, failures = [], []
    for start in range(0, len(files), batch_size):
        pixels, read, sizes = [], [], []
        for file in files[start:start + batch_size]:
            own = []

            def sized(height, width):  # the decoded image's own size, kept for its outputs
                own.append((height, width))
                return read_size(height, width)

            image, _, failed = load_images([file], sized, channels)
            failures += failed
            if image:
                pixels.append(image[0])
                read.append(file)
                sizes.append(own[0])
        # Images at their own sizes run one by one (their grids differ); at the run's size, together.
        groups = [[i] for i in range(len(read))] if model.rotary else [list(range(len(read)))] if read else []
        for group in groups:
            outputs = {k: np.asarray(v) for k, v in task.serve(model, np.stack([pixels[i] for i in group])).items()}
            predictions += [(read[i], {k: v[j] for k, v in outputs.items()}, sizes[i]) for j, i in enumerate(group)]
    return predictions, failures


def predict_files(model, paths, top_k=5, labels=None, batch_size=32, recursive=False, progress=None,
                  image_size=None, max_num_patches=None):
    """Top-k predictions for image files and folders.

    Args:
        model: a keras_vit ViT with a classification head.
        paths: image files and/or folders (expanded by `find_images`).
        top_k: classes per image (at most num_classes).
        labels: class names indexed by class; None uses the indices.
        batch_size: images decoded and run per step (memory stays bounded).
        recursive: also look inside sub-folders.
        progress: show a tqdm bar on stderr; None shows it for more than one batch.
        image_size: (height, width) or a side to resize images to; None: the
            model's. Another size needs a model that takes it
            (dynamic_image_size=True).
        max_num_patches: a NaFlex (SigLIP2) model's patch budget, each image
            read at its own aspect ratio within it (transformers'
            Siglip2ImageProcessor(max_num_patches=...)); None: the table's.

    Returns:
        (predictions, failures): a `Prediction` per readable image in input
        order, and (path, reason) for every file that could not be read.
    """
    check_classifies(model)
    own_sizes = naflex_sizing(model, image_size, max_num_patches)
    files = find_images(paths, recursive=recursive)
    size = model.image_size if image_size is None else (
        (image_size, image_size) if isinstance(image_size, int) else tuple(image_size))
    top_k = max(1, min(int(top_k), model.num_classes))
    if labels is not None and len(labels) < model.num_classes:
        raise UserError(f"{len(labels)} labels for a model with {model.num_classes} classes.")
    if progress is None:
        progress = len(files) > batch_size
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(files), unit="img", file=sys.stderr, desc="predict")
    from keras_vit.model.naflex import outputs_naflex, size_rule

    predictions, failures = [], []
    for start in range(0, len(files), batch_size):
        chunk = files[start:start + batch_size]
        read_at = size_rule(model, max_num_patches) if own_sizes else size
        pixels, read, failed = load_images(chunk, read_at, model.num_channels)
        failures.extend(failed)
        if read:
            probabilities = (to_probabilities(model, outputs_naflex(model, pixels, batch_size, max_num_patches))
                             if own_sizes else predict_probabilities(model, pixels, batch_size=batch_size))
            for path, p in zip(read, probabilities):
                best = np.argsort(-p, kind="stable")[:top_k]
                predictions.append(Prediction(
                    path=path,
                    indices=[int(i) for i in best],
                    labels=[labels[i] if labels is not None else str(i) for i in best],
                    probabilities=[float(p[i]) for i in best],
                ))
        if bar is not None:
            bar.update(len(chunk))
    if bar is not None:
        bar.close()
    return predictions, failures


def naflex_sizing(model, image_size=None, max_num_patches=None) -> bool:
    """Whether images are read each at its own NaFlex size (a NaFlex model, no `image_size`);
    refuses, in one line, a patch budget that would not apply (keras_vit.model.naflex.patch_budget)."""
    from keras_vit.model.naflex import is_naflex, patch_budget

    if max_num_patches is not None and image_size is not None:
        raise UserError(f"{_console.either('--max-num-patches', 'max_num_patches')} and "
                        f"{_console.either('--image-size', 'image_size')} both size the images: give one "
                        f"(the budget keeps each image's aspect ratio, the size squashes it).")
    patch_budget(model, max_num_patches)  # the budget's own checks
    return image_size is None and is_naflex(model)


def folders_without_images(paths, recursive=False):
    """(folder, why) for each folder in `paths` that gives no image file: one
    without any, or one whose images are all in sub-folders (a folder of
    class sub-folders, as trained on), which --recursive reads."""
    problems = []
    for path in paths:
        if not Path(path).is_dir() or find_images([path], recursive=recursive):
            continue
        nested = [] if recursive else find_images([path], recursive=True)
        if nested:
            folders = {Path(file).relative_to(path).parts[0] for file in nested}
            why = (f"no image directly inside, {len(nested)} in {len(folders)} sub-folder(s): add {_console.argument('recursive')} to "
                   f"read them")
        else:
            why = f"a folder without image files ({', '.join(IMAGE_EXTENSIONS)})"
        problems.append((str(path), why))
    return problems


def report_skipped(command: str, failures, done: int, verb: str) -> int:
    """Names each input that failed on stderr, then how many of all did; the exit status: 1 when
    any failed (the others were `verb`, e.g. "predicted"), else 0."""
    import sys

    for path, reason in failures:
        print(f"keras-vit {command}: skipped {path}: {reason}", file=sys.stderr)
    if not failures:
        return 0
    print(f"keras-vit {command}: {len(failures)} of {len(failures) + done} inputs failed (named above); the others "
          f"were {verb}.", file=sys.stderr)
    return 1


def nothing_read(failures, shown=3) -> str:
    """The one line for "no image could be read": each input and why (the first `shown`)."""
    reasons = "; ".join(f"{path}: {why}" for path, why in failures[:shown])
    more = f"; and {len(failures) - shown} more" if len(failures) > shown else ""
    return f"no image could be read: {reasons}{more}"

"""Whole models on disk: the run folder that `train` writes and every command reads
(folder), and what a command means by MODEL: a run folder, a `.keras` file or a
checkpoint (source, imported on use: it reaches the weights loaders).

`keras_vit.runs.load_model`, `find_labels`, ... are the run folder's, as before the
package had two modules."""

from keras_vit.runs.folder import (  # noqa: F401
    MODEL_FILE, CONFIG_FILE, LABELS_FILE, RESULTS_FILE, CHECKPOINTS_DIR, TENSORBOARD_DIR, PathLike, ModelFileError,
    model_path, is_run_folder, workdir_of, load_model, read_labels, find_labels, write_labels, read_json,
    read_config, write_config, read_results, write_results, is_finished, changed_settings, segments, save_model,
    checkpoints_dir, tensorboard_dir, check_labels, default_labels)

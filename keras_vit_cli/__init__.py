"""The `keras-vit` command's entry point (`python -m keras_vit_cli` runs the same).

It lives outside the keras_vit package on purpose. `import keras_vit`
registers the ViT layers with Keras, so that `keras.saving.load_model` finds
them, and Keras offers no way to register without importing it (seconds,
with TensorFlow). The command line must answer `--help` at once and start
TensorFlow with its own output kept quiet, in its own process: importing
this module first tells keras_vit that the command line owns the process,
and keras_vit.cli imports Keras and TensorFlow when a subcommand needs them.
"""


def main(argv=None):
    from keras_vit import cli

    return cli.main(argv)

"""`keras-vit variants`: the variant table (sizes from keras_vit/variants.py) and the checkpoints of each."""

NEEDS_TENSORFLOW = False


def add_arguments(parser):
    del parser  # no options


def run(args):
    del args
    from keras_vit.variants import VARIANTS
    from keras_vit.weights.hub import available_weights

    side = max(len(name) for name in VARIANTS)  # the names' column
    print(f"{'variant':{side}} {'width':>5} {'depth':>5} {'heads':>5} {'mlp':>5} {'patch':>5}  resnet        weights")
    for name, c in VARIANTS.items():
        resnet = str(c.resnet.num_layers) if c.resnet else "-"
        # The descendants' weights are transformers checkpoints (docs/families), not official .npz names.
        weights = ", ".join(available_weights(name)) or ("-" if "-" not in name else "from_pretrained('hf:...')")
        print(f"{name:{side}} {c.hidden_size:5} {c.num_layers:5} {c.num_heads:5} {c.mlp_dim:5} "
              f"{c.total_stride:5}  {resnet:12}  {weights}")

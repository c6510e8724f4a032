"""`keras-vit scenes DIR`: synthetic scenes for segmentation and depth (keras_vit.data.scenes):
DIR/train and DIR/val with images/, masks/ and depth/, and DIR/classes.txt, ready for
`--dataset masks:DIR` and `--dataset depth:DIR`."""

NEEDS_TENSORFLOW = False


def add_arguments(parser):
    parser.add_argument("folder", metavar="DIR", help="where to write them (created; must be empty or new)")
    parser.add_argument("--count", type=int, default=400, help="scenes in all (default: %(default)s)")
    parser.add_argument("--size", type=int, default=96, help="pixels a side (default: %(default)s)")
    parser.add_argument("--val-share", type=float, default=0.2,
                        help="the share written to val/ (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")


def run(args):
    import os

    from keras_vit.data.scenes import CLASSES, write_scenes
    from keras_vit.errors import UserError

    if args.count < 1 or args.size < 16 or not 0 <= args.val_share < 1:
        raise UserError("--count must be at least 1, --size at least 16 and --val-share in [0, 1).")
    if os.path.exists(args.folder) and (not os.path.isdir(args.folder) or os.listdir(args.folder)):
        raise UserError(f"{args.folder} exists and is not an empty folder: give a new one.")
    counts = write_scenes(args.folder, args.count, args.size, args.seed, args.val_share)
    print(f"keras-vit scenes: {counts['train']} training and {counts['val']} validation scenes of "
          f"{args.size}x{args.size} px in {args.folder} (classes: {', '.join(CLASSES)}); train with "
          f"--dataset masks:{args.folder} or depth:{args.folder}")
    return 0

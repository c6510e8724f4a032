"""Start-up time of a big image folder: the trainer's check against a full decode.

    python benchmarks/startup.py --counts 2000 10000 50000 --scratch /tmp/keras-vit-startup

For each N it writes `root/<class>/*.jpg` (N JPEGs, 500x375, quality 90,
100 classes; crops, flips and colour shifts of scikit-image's sample photos,
or smooth random fields plus noise without scikit-image), then times, each
in a fresh process:

  check        keras_vit.training.data.open_source(config) for folder:root:
               listing plus a header check of every file
               (images.find_unopenable), i.e. the trainer's start-up check;
  first batch  in the same process, from data.train_dataset(source, ...,
               tf.distribute.InputContext(), 0) to its first batch in hand
               (--batch images, Inception crop + flip at 224);
  full decode  what the old start-up did: keras_vit.images.decode of every
               file with a ThreadPoolExecutor of 8 workers (listing included).

"cold" runs start with every data file's pages evicted from the page cache
(sync, then posix_fadvise DONTNEED per file: dropping the whole page cache
needs root, which we lack); directory entries and inodes stay cached, and the
virtual disk's host may cache too, so "cold" is a lower bound on a truly cold
disk. "warm" is the same child run again right after. A least-squares line
(seconds = a + b N) per series is extrapolated to ImageNet's 1,281,167 files.
Writes results_startup.json/.md/.png beside this file (or --output PREFIX).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
IMAGENET = 1_281_167
CLASSES = 100
SIZE = (500, 375)  # width, height: a typical ImageNet photo


# --- the data ---------------------------------------------------------------------------

def _photos():
    """The sample photos to cut images from (uint8 RGB), or None without scikit-image."""
    try:
        from skimage import data
    except ImportError:
        return None
    photos = []
    for name in ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry",
                 "colorwheel", "camera", "coins", "moon", "page", "text", "grass", "gravel", "brick"):
        try:
            p = np.asarray(getattr(data, name)())
        except Exception:  # noqa: BLE001 - a sample that needs a download is skipped
            continue
        if p.ndim == 2:
            p = np.repeat(p[..., None], 3, axis=-1)
        if p.dtype == np.uint8 and min(p.shape[:2]) >= 256:
            photos.append(p[..., :3])
    return photos or None


def _image(rng, photos):
    from PIL import Image

    w, h = SIZE
    if photos is None:  # smooth random colour field plus noise (as bench_training.write_jpeg_folder)
        field = Image.fromarray(rng.randint(0, 256, (6, 8, 3)).astype(np.uint8)).resize((w, h), Image.BICUBIC)
        pixels = np.asarray(field, np.int16)
    else:
        photo = photos[rng.randint(len(photos))]
        ph, pw = photo.shape[:2]
        scale = rng.uniform(0.35, 1.0)
        ch, cw = max(32, int(ph * scale)), max(32, int(min(pw, ph * scale * w / h)))
        y, x = rng.randint(ph - ch + 1), rng.randint(pw - cw + 1)
        crop = Image.fromarray(photo[y:y + ch, x:x + cw]).resize((w, h), Image.BILINEAR)
        pixels = np.asarray(crop, np.int16)
        if rng.rand() < 0.5:
            pixels = pixels[:, ::-1]
        pixels = pixels * rng.uniform(0.75, 1.25, 3) + rng.uniform(-25, 25, 3)  # colour shift
    pixels = pixels + rng.normal(0, 3, (h, w, 3))  # sensor noise: every file distinct
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def _write_some(job):
    root, indices = job
    rng, photos = np.random.RandomState(indices[0]), _photos()
    for i in indices:
        directory = os.path.join(root, f"class{i % CLASSES:03d}")
        os.makedirs(directory, exist_ok=True)
        _image(rng, photos).save(os.path.join(directory, f"{i:07d}.jpg"), quality=90)


def write_folder(root, count, workers=2):
    """N JPEGs in root/class000..class099/ (parallel, deterministic per chunk)."""
    from multiprocessing import Pool

    chunks = [(root, list(range(s, min(count, s + 500)))) for s in range(0, count, 500)]
    with Pool(workers) as pool:
        pool.map(_write_some, chunks)
    return root


def link_subset(big, root, count):
    """A smaller folder of hard links to the first `count` files of `big` (no new writing)."""
    for i in range(count):
        name = os.path.join(f"class{i % CLASSES:03d}", f"{i:07d}.jpg")
        os.makedirs(os.path.join(root, os.path.dirname(name)), exist_ok=True)
        os.link(os.path.join(big, name), os.path.join(root, name))
    return root


def evict(root):
    """Drops the folder's file pages from the page cache (sync, then fadvise DONTNEED)."""
    os.sync()
    for directory, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(directory, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


# --- the timed children (each in a fresh process) -----------------------------------------

def child_check(root, batch):
    import tensorflow as tf

    from keras_vit.training import data
    from keras_vit.training.config import TrainConfig

    config = TrainConfig.create("finetune", model="S/16", dataset=f"folder:{root}", workdir=root + ".run",
                                batch_size=batch, image_size=224, train_augment="inception_crop_flip",
                                progress=False)
    start = time.perf_counter()
    source = data.open_source(config)
    opened = time.perf_counter()
    from keras_vit.training import plan as plan_lib

    plan = plan_lib.resolve(config, source)
    first = next(iter(data.train_dataset(source, plan, tf.distribute.InputContext(), 0)))
    first["image"].numpy()
    done = time.perf_counter()
    return {"check_s": opened - start, "first_batch_s": done - opened, "files": int(source.shard_size(
        source.train_split, 0, 1)) + int(source.shard_size(source.eval_split, 0, 1))}


def child_decode(root, workers=8):
    from concurrent.futures import ThreadPoolExecutor

    import tensorflow  # noqa: F401  (loaded in a trainer; images.convert_channels would import it on first use)

    from keras_vit import images

    start = time.perf_counter()
    paths = [os.path.join(root, c, f) for c in sorted(os.listdir(root)) for f in images.list_images(
        os.path.join(root, c))]
    paths = [os.fspath(p) for p in paths]
    with ThreadPoolExecutor(workers) as pool:
        pixels = sum(p.size for p in pool.map(lambda p: images.decode(p, 3), paths, chunksize=64))
    return {"decode_s": time.perf_counter() - start, "files": len(paths), "pixels": int(pixels)}


def run_child(kind, root, batch):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=os.path.dirname(HERE))
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", kind, root, "--batch", str(batch)],
                         capture_output=True, text=True, env=env, timeout=7200)
    if out.returncode:
        raise RuntimeError(f"{kind} {root}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# --- report -------------------------------------------------------------------------------

SERIES = [("check_s", "header check (open_source)"), ("first_batch_s", "first batch after the check"),
          ("decode_s", "full decode, 8 threads (old start-up)")]


def fit_lines(rows):
    fits = {}
    for key, _ in SERIES:
        for cache in ("cold", "warm"):
            n = np.array([r["count"] for r in rows], float)
            s = np.array([r[cache][key] for r in rows], float)
            b, a = np.polyfit(n, s, 1)
            fits[f"{key} {cache}"] = {"intercept_s": a, "seconds_per_file": b, "files_per_s": 1 / b if b > 0 else None,
                                      "imagenet_s": a + b * IMAGENET}
    return fits


def _load_range(rows):
    loads = [v for r in rows for c in ("cold", "warm") for k, v in r[c].items() if k.startswith("load")]
    return f"{min(loads):.1f}-{max(loads):.1f}"


def markdown(report):
    m = report["machine"]
    lines = [f"Date: {report['date']}. Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; "
             f"{m['disk']}; Python {m['python']}, TensorFlow {m['tensorflow']}, Keras {m['keras']}, "
             f"Pillow {m['pillow']}. Images: {report['content']}, {SIZE[0]}x{SIZE[1]}, quality 90, {CLASSES} classes, "
             f"mean {report['mean_kib']:.0f} KiB. First batch: {report['batch']} images at 224.", "",
             f"Load average (1 min) after the children: {_load_range(report['rows'])} (2 cores, shared machine). "
             f"Cold: {report['cold']}.", "",
             "| files | cache | header check s | first batch s | full decode s | decode / check |",
             "|---:|---|---:|---:|---:|---:|"]
    for r in report["rows"]:
        for cache in ("cold", "warm"):
            c = r[cache]
            lines.append(f"| {r['count']:,} | {cache} | {c['check_s']:.2f} | {c['first_batch_s']:.2f} | "
                         f"{c['decode_s']:.2f} | {c['decode_s'] / c['check_s']:.1f}x |")
    lines += ["", f"Least-squares lines (seconds = a + b N), extrapolated to ImageNet ({IMAGENET:,} files):", "",
              "| series | a (s) | b (ms/file) | files/s | ImageNet (min) |", "|---|---:|---:|---:|---:|"]
    names = dict(SERIES)
    for label, f in report["fits"].items():
        key, cache = label.split(" ")
        lines.append(f"| {names[key]}, {cache} | {f['intercept_s']:.2f} | {1000 * f['seconds_per_file']:.3f} | "
                     f"{f['files_per_s'] or 0:,.0f} | {f['imagenet_s'] / 60:.1f} |")
    return "\n".join(lines) + "\n"


def plot(report, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5))
    n = np.array([r["count"] for r in report["rows"]], float)
    grid = np.geomspace(n.min(), IMAGENET, 50)
    for (key, name), colour in zip(SERIES, ("C0", "C2", "C3")):
        for cache, style in (("cold", "-"), ("warm", ":")):
            f = report["fits"][f"{key} {cache}"]
            ax.plot(n, [r[cache][key] for r in report["rows"]], "o", color=colour, fillstyle="full" if cache == "cold"
                    else "none")
            ax.plot(grid, np.maximum(f["intercept_s"] + f["seconds_per_file"] * grid, 1e-2), style, color=colour,
                    label=f"{name}, {cache}: {f['imagenet_s'] / 60:.1f} min at ImageNet")
    ax.axvline(IMAGENET, color="grey", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="image files in the folder", ylabel="seconds",
           title=f"Start-up of folder:ROOT ({report['machine']['cores']} cores; lines: fits, extrapolated)")
    ax.text(IMAGENET, 0.02, "ImageNet 1.28M ", fontsize=8, color="grey", ha="right", va="bottom",
            transform=ax.get_xaxis_transform())
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", nargs="+", type=int, default=[2000, 10000, 50000])
    parser.add_argument("--scratch", default="/tmp/keras-vit-startup")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--output", default=os.path.join(HERE, "results_startup"))
    parser.add_argument("--keep", action="store_true", help="leave the generated folders")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "ROOT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, root = args.child
        print(json.dumps(child_check(root, args.batch) if kind == "check" else child_decode(root)))
        return 0

    import keras
    import PIL
    import tensorflow as tf

    counts = sorted(args.counts)
    os.makedirs(args.scratch, exist_ok=True)
    started = time.perf_counter()
    big = write_folder(os.path.join(args.scratch, f"n{counts[-1]}"), counts[-1])
    written = time.perf_counter() - started
    roots = {n: big if n == counts[-1] else link_subset(big, os.path.join(args.scratch, f"n{n}"), n) for n in counts}
    sizes = [os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(big) for f in fs]
    print(f"wrote {counts[-1]} files in {written:.0f} s, mean {np.mean(sizes) / 1024:.0f} KiB", flush=True)
    rows = []
    for n in counts:
        row = {"count": n}
        for cache in ("cold", "warm"):
            row[cache] = {}
            for kind in ("check", "decode"):
                if cache == "cold":
                    evict(roots[n])
                result = run_child(kind, roots[n], args.batch)
                assert result["files"] == n, result
                row[cache].update({k: v for k, v in result.items() if k.endswith("_s")})
                row[cache][f"load_average_after_{kind}"] = os.getloadavg()[0]
            print(n, cache, {k: round(v, 2) for k, v in row[cache].items()}, flush=True)
        rows.append(row)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    disk = subprocess.run(["df", "-h", args.scratch], capture_output=True, text=True).stdout.splitlines()[-1].split()
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"), "batch": args.batch, "counts": counts,
        "content": "crops of scikit-image sample photos" if _photos() else "smooth random fields plus noise",
        "mean_kib": float(np.mean(sizes) / 1024), "write_seconds": written,
        "machine": {"cpu": cpu, "cores": len(os.sched_getaffinity(0)),
                    "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
                    "disk": f"{disk[0]} ({args.scratch})", "python": platform.python_version(),
                    "tensorflow": tf.__version__, "keras": keras.__version__, "pillow": PIL.__version__},
        "cold": "file pages evicted (sync + posix_fadvise DONTNEED); dentries/inodes stay cached",
        "rows": rows,
    }
    report["fits"] = fit_lines(rows)
    with open(args.output + ".json", "w") as f:
        json.dump(report, f, indent=1)
    with open(args.output + ".md", "w") as f:
        f.write(markdown(report))
    plot(report, args.output + ".png")
    print(markdown(report))
    if not args.keep:
        shutil.rmtree(args.scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

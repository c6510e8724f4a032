"""keras_vit.utils.install_check: the unrelated `keras-vit` distribution found by
its installed metadata (fake dist-info folders, read by importlib.metadata)."""

from importlib import metadata

from keras_vit.utils.install_check import conflicting_distribution


def _dist_info(root, name, version, record=None, legacy=None, sources=None):
    """A metadata folder as an installer leaves it, found through importlib.metadata."""
    folder = root / (f"{name.replace('-', '_')}-{version}" + (".egg-info" if record is None else ".dist-info"))
    folder.mkdir()
    (folder / ("PKG-INFO" if record is None else "METADATA")).write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    for filename, lines in (("RECORD", record), ("installed-files.txt", legacy), ("SOURCES.txt", sources)):
        if lines is not None:
            (folder / filename).write_text("\n".join(lines) + "\n")
    return list(metadata.distributions(path=[str(root)]))


def test_the_other_wheel_install_is_named_with_the_fix(tmp_path):
    dists = _dist_info(tmp_path, "keras-vit", "1.0.1", record=[
        "keras_vit/__init__.py,sha256=abc,100", "keras_vit/vit.py,sha256=def,2000",
        "keras_vit-1.0.1.dist-info/RECORD,,"])
    message = conflicting_distribution(dists)
    assert message is not None and "\n" not in message
    assert "keras-vit 1.0.1" in message and "keras-vision-transformer" in message
    assert "pip uninstall -y keras-vit keras-vision-transformer && pip install keras-vision-transformer" in message


def test_a_legacy_egg_install_of_the_other_counts_too(tmp_path):
    dists = _dist_info(tmp_path, "Keras_ViT", "0.9", legacy=["../keras_vit/__init__.py", "PKG-INFO"])
    assert "Keras_ViT" not in conflicting_distribution(dists)  # reported by its normalised name
    assert "keras-vit 0.9" in conflicting_distribution(dists)


def test_ours_an_editable_install_and_a_source_checkout_are_not_conflicts(tmp_path):
    (tmp_path / "ours").mkdir()
    (tmp_path / "editable").mkdir()
    (tmp_path / "checkout").mkdir()
    ours = _dist_info(tmp_path / "ours", "keras-vision-transformer", "0.1.0",
                      record=["keras_vit/__init__.py,sha256=abc,100"])
    # The old name installed editable from this very checkout: only a finder, no package files.
    editable = _dist_info(tmp_path / "editable", "keras-vit", "0.1.0",
                          record=["__editable__.keras_vit-0.1.0.pth,sha256=x,89",
                                  "__editable___keras_vit_0_1_0_finder.py,sha256=y,3375"])
    # An *.egg-info left in a checkout lists sources, not installed files.
    checkout = _dist_info(tmp_path / "checkout", "keras-vit", "0.1.0", sources=["keras_vit/__init__.py"])
    assert conflicting_distribution(ours + editable + checkout) is None
    assert conflicting_distribution([]) is None


def test_the_real_environment_is_read_without_error():
    # Whatever this environment holds, the answer is None or one line.
    message = conflicting_distribution()
    assert message is None or "\n" not in message


def test_the_command_line_says_so_in_one_line(monkeypatch, capsys):
    from keras_vit import cli
    from keras_vit.utils import install_check as _install_check

    monkeypatch.setattr(_install_check, "conflicting_distribution",
                        lambda: "The unrelated package keras-vit 1.0.1 is installed (stand-in).")
    assert cli.main(["variants"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "keras-vit 1.0.1" in line]
    assert warnings == ["keras-vit: warning: The unrelated package keras-vit 1.0.1 is installed (stand-in)."]


def test_no_warning_without_the_other_package(monkeypatch, capsys):
    from keras_vit import cli
    from keras_vit.utils import install_check as _install_check

    monkeypatch.setattr(_install_check, "conflicting_distribution", lambda: None)
    assert cli.main(["variants"]) == 0
    assert "warning" not in capsys.readouterr().err

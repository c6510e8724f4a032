"""--precision auto: the machine's faster precision for a new run, the run's own on resume."""

import json

import numpy as np
import pytest
import tensorflow as tf

from keras_vit import training
from keras_vit.errors import UserError
from keras_vit.training import strategies
from keras_vit.training.checkpointing import IncompatibleCheckpointError
from tests.training_helpers import tiny_config

AMX_CPU = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16\n"


@pytest.fixture
def by_machine(monkeypatch):
    """auto picks by the machine (the suite pins float32 in conftest)."""
    monkeypatch.delenv(strategies.PRECISION_ENV, raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    return monkeypatch


def test_the_bfloat16_instructions_are_read_from_the_cpu_flags_as_onednn_may_use_them(tmp_path, by_machine):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(AMX_CPU)
    assert strategies.cpu_bfloat16_extensions(str(cpuinfo)) == ["AMX-BF16", "AVX512-BF16"]
    # oneDNN capped below AMX (ONEDNN_MAX_CPU_ISA) uses the AVX512 ones alone, capped lower none.
    for cap, left in [("AVX512_CORE_BF16", ["AVX512-BF16"]), ("avx2", []), ("AVX512_CORE_AMX", ["AMX-BF16",
                                                                                                  "AVX512-BF16"])]:
        by_machine.setenv("ONEDNN_MAX_CPU_ISA", cap)
        assert strategies.cpu_bfloat16_extensions(str(cpuinfo)) == left, cap
    by_machine.delenv("ONEDNN_MAX_CPU_ISA")
    by_machine.setenv("TF_ENABLE_ONEDNN_OPTS", "0")  # TensorFlow's own kernels: bfloat16 is slow there
    assert strategies.cpu_bfloat16_extensions(str(cpuinfo)) == []
    by_machine.delenv("TF_ENABLE_ONEDNN_OPTS")
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\n")
    assert strategies.cpu_bfloat16_extensions(str(cpuinfo)) == []
    assert strategies.cpu_bfloat16_extensions(str(tmp_path / "absent")) == []


def test_auto_picks_bfloat16_where_the_machine_computes_in_it(by_machine):
    by_machine.setattr(strategies, "cpu_bfloat16_extensions", lambda: ["AMX-BF16"])
    precision, why = strategies.machine_precision()
    assert precision == "mixed_bfloat16" and why.startswith("this CPU has AMX-BF16, where ViT-S/16 trained 1.7x")
    assert strategies.machine_precision(tpu=True)[0] == "mixed_bfloat16"
    by_machine.setattr(strategies, "cpu_bfloat16_extensions", lambda: [])
    assert strategies.machine_precision() == ("float32", "this CPU has no bfloat16 instructions")
    # GPUs by their compute capability: bfloat16 tensor cores from 8.0 (Ampere) on.
    for capability, expected in [((8, 0), "mixed_bfloat16"), ((7, 5), "float32")]:
        by_machine.setattr(tf.config, "list_physical_devices", lambda kind=None: ["gpu0"] if kind == "GPU" else [])
        by_machine.setattr(tf.config.experimental, "get_device_details",
                           lambda gpu, c=capability: {"compute_capability": c})
        precision, why = strategies.machine_precision()
        assert precision == expected and f"compute capability {capability[0]}.{capability[1]}" in why
    by_machine.undo()
    by_machine.setenv(strategies.PRECISION_ENV, "mixed_float16")
    assert strategies.machine_precision() == ("mixed_float16", "KERAS_VIT_PRECISION says so")
    by_machine.setenv(strategies.PRECISION_ENV, "bf16")
    with pytest.raises(UserError, match="KERAS_VIT_PRECISION='bf16' is not a precision: give one of float32, "):
        strategies.machine_precision()


def test_a_plan_resolves_auto_before_anything_reads_the_precision(tmp_path, by_machine):
    from keras_vit.training import TrainConfig, data as data_lib, plan as plan_lib

    images = np.zeros((20, 8, 8, 1), np.uint8)
    config = TrainConfig.create("scratch", model="Mu/4", patch_size=4, workdir=str(tmp_path), progress=False)
    source = data_lib.open_source(config, dataset=(images, np.arange(20) % 2))
    by_machine.setenv(strategies.PRECISION_ENV, "mixed_bfloat16")
    plan = plan_lib.resolve(config, source)
    assert (plan.precision, plan.config.precision, plan.precision_why) == (
        "mixed_bfloat16", "mixed_bfloat16", "KERAS_VIT_PRECISION says so")
    # The model's own refusals (an int8 base under float16, plan._check_lora) read the resolved precision.
    by_machine.setenv(strategies.PRECISION_ENV, "mixed_float16")
    seen, model_config = [], plan_lib.model_config
    by_machine.setattr(plan_lib, "model_config",
                       lambda config, *args: seen.append(config.precision) or model_config(config, *args))
    assert plan_lib.resolve(config, source).precision == "mixed_float16" and seen == ["mixed_float16"]


@pytest.mark.slow
def test_a_run_begun_in_bfloat16_keeps_it_when_resumed_on_a_machine_without(tmp_path, by_machine, capsys):
    """The run the issue worries about: begun by auto on an AMX machine, killed, resumed in a
    container whose CPU has no bfloat16 instructions, where auto alone would pick float32."""
    by_machine.setattr(strategies, "cpu_bfloat16_extensions", lambda: ["AMX-BF16", "AVX512-BF16"])
    config = tiny_config(tmp_path, steps=2, jit_compile=None)
    assert config.precision == "auto"
    first = training.train(config)
    assert first["plan"]["precision"] == "mixed_bfloat16"
    assert first["plan"]["jit_compile"] is False  # bfloat16 on a CPU: oneDNN without XLA, as measured
    out = capsys.readouterr().out
    assert ("keras-vit train: precision mixed_bfloat16: this CPU has AMX-BF16 and AVX512-BF16, where ViT-S/16 "
            "trained 1.7x faster") in out
    settings = json.loads((tmp_path / "config.json").read_text())
    assert settings["precision"] == "auto" and settings["plan"]["precision"] == "mixed_bfloat16"

    by_machine.setattr(strategies, "cpu_bfloat16_extensions", lambda: [])
    resumed = training.train(config.replace(steps=4))
    assert resumed["plan"]["precision"] == "mixed_bfloat16" and resumed["steps"] == 4
    assert [s["start_step"] for s in resumed["segments"]] == [0, 2]
    assert ("keras-vit train: precision mixed_bfloat16: the run's own, as it began (config.json), so that it resumes "
            "exactly; a new run here would take float32: this CPU has no bfloat16 instructions") in capsys.readouterr().out
    meta = json.loads(str(np.load(tmp_path / "checkpoints" / "ckpt-00000004.npz")["meta"]))
    assert meta["fingerprint"]["precision"] == "mixed_bfloat16"
    # Asked for float32 by name, the same run is refused: its checkpoints are bfloat16's.
    with pytest.raises(IncompatibleCheckpointError, match="precision"):
        training.train(config.replace(steps=6, precision="float32"))
    # A new run on this machine takes float32.
    fresh = training.train(tiny_config(tmp_path / "new", steps=1, jit_compile=None))
    assert fresh["plan"]["precision"] == "float32" and fresh["plan"]["jit_compile"] is True

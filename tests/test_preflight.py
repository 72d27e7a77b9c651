"""speedrun.training.preflight: a GPU run's node shows the GPUs the config asks for (count, model, memory), with
messages that say what was expected and found; on a GPU machine, the check against the GPUs torch sees."""

from __future__ import annotations

import pytest

from speedrun.errors import SpeedrunError
from speedrun.training.preflight import (GpuInfo, GpuRequirement, check_gpus, describe, local_process_count, preflight,
                                visible_gpus)

H100 = GpuInfo("NVIDIA H100 80GB HBM3", 85_520_809_984)        # 79.65 GiB, as torch reports an H100 SXM
A100 = GpuInfo("NVIDIA A100-SXM4-40GB", 42_298_834_944)        # 39.39 GiB


def test_a_node_of_the_asked_gpus_passes():
    check_gpus(GpuRequirement("H100", 79), 8, [H100] * 8)
    check_gpus(GpuRequirement("h100", 0), 8, [H100] * 8)       # the model matches case-insensitively
    check_gpus(GpuRequirement(), 4, [H100] * 8)                # more GPUs than processes is fine
    check_gpus(GpuRequirement("", 0), 2, [A100, H100])         # no model, no memory: any GPU


def test_too_few_gpus():
    with pytest.raises(SpeedrunError, match=r"expected 8 GPUs on this node .*found 4 x NVIDIA H100 80GB HBM3 "
                                            r"\(79.6 GiB\)"):
        check_gpus(GpuRequirement("H100"), 8, [H100] * 4)
    with pytest.raises(SpeedrunError, match=r"expected 1 GPU on this node .*found none"):
        check_gpus(GpuRequirement(), 1, [])


def test_another_model():
    with pytest.raises(SpeedrunError, match=r"contains 'H100' \(config.yaml cluster.gpu_model\), found "
                                            r"7 x NVIDIA H100 80GB HBM3 \(79.6 GiB\), 1 x NVIDIA A100-SXM4-40GB"):
        check_gpus(GpuRequirement("H100"), 8, [H100] * 7 + [A100])


def test_too_little_memory():
    # 80 GiB = 85,899,345,920 bytes: an "80GB" H100 has less
    with pytest.raises(SpeedrunError, match=r"at least 80 GiB per GPU \(config.yaml cluster.gpu_memory_gib\)"):
        check_gpus(GpuRequirement("H100", 80), 8, [H100] * 8)
    check_gpus(GpuRequirement("H100", 79.5), 8, [H100] * 8)


def test_describe_and_the_local_process_count():
    assert describe([A100, H100, H100]) == "1 x NVIDIA A100-SXM4-40GB (39.4 GiB), 2 x NVIDIA H100 80GB HBM3 (79.6 GiB)"
    assert local_process_count({"LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "16"}, 16) == 8
    assert local_process_count({}, 4) == 4
    with pytest.raises(SpeedrunError, match="LOCAL_WORLD_SIZE"):
        local_process_count({"LOCAL_WORLD_SIZE": "eight"}, 8)
    with pytest.raises(SpeedrunError, match="cluster.gpu_memory_gib"):
        GpuRequirement("H100", -1)


def test_preflight_by_device(monkeypatch):
    import speedrun.training.preflight as module

    monkeypatch.setattr(module, "visible_gpus", lambda: [H100] * 4)
    preflight("cuda", GpuRequirement("H100"), {"LOCAL_WORLD_SIZE": "4"}, 8)
    preflight("auto", GpuRequirement("H100"), {}, 4)
    with pytest.raises(SpeedrunError, match="expected 8 GPUs on this node"):
        preflight("cuda", GpuRequirement("H100"), {}, 8)               # one node: world_size processes
    with pytest.raises(SpeedrunError, match="contains 'A100'"):
        preflight("auto", GpuRequirement("A100"), {}, 1)
    monkeypatch.setattr(module, "visible_gpus", lambda: [])
    preflight("cpu", GpuRequirement("H100", 80), {}, 8)                  # a CPU run asks for no GPU
    preflight("auto", GpuRequirement("H100", 80), {}, 8)                 # auto without GPUs runs on the CPU
    with pytest.raises(SpeedrunError, match="expected 2 GPUs on this node .*found none"):
        preflight("cuda", GpuRequirement(), {"LOCAL_WORLD_SIZE": "2"}, 4)


def test_a_gpu_run_without_its_gpus_stops_before_writing_anything(tmp_path, monkeypatch):
    import speedrun.training.preflight as module
    from speedrun.training.config import TrainConfig
    from speedrun.training.loop import run_training
    from cluster_support import write_dataset

    shards, bos = write_dataset(tmp_path / "data", documents=200)
    monkeypatch.setattr(module, "visible_gpus", lambda: [A100] * 2)
    config = TrainConfig.from_dict({"device": "cuda", "world_size": 2, "micro_batches": 2, "tokens_per_step": 512,
                                    "max_seq_len": 128, "val_tokens": 512, "val_batch_tokens": 256, "steps": 1})
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    with pytest.raises(SpeedrunError, match=r"contains 'H100' .*found 2 x NVIDIA A100-SXM4-40GB \(39.4 GiB\)"):
        run_training(config, variant="v", seed=0, shards_dir=shards, bos_dir=bos, log_path=tmp_path / "run.txt",
                     env=env, gpus=GpuRequirement("H100"))
    assert list(tmp_path.glob("*run.txt*")) == []


@pytest.mark.gpu
def test_the_gpus_torch_sees_pass_their_own_description():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    gpus = visible_gpus()
    assert len(gpus) == torch.cuda.device_count()
    name = gpus[0].name
    check_gpus(GpuRequirement(name.split()[1], gpus[0].memory_bytes / 2**30 - 0.01), len(gpus), gpus)
    with pytest.raises(SpeedrunError, match="found"):
        check_gpus(GpuRequirement(), len(gpus) + 1, gpus)

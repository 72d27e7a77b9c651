"""Script variants (issue 21, item 2): `variants.<name>.script` resolved and refused at planning
(speedrun.workflow.planning.resolve_experiment), and the whole workflow run with a small CPU script of our own
(tests/data/replicate_script.py) beside a model variant of the micro config, in both forms (`path` and `log`):
its runs are made by the run_script rule, parsed, counted, compared and reported like ours."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from speedrun import cli
from speedrun.analysis.provenance import sha256
from speedrun.analysis.record_code import record_code
from speedrun.errors import SpeedrunError
from speedrun.training.record_script import script_from_log
from speedrun.workflow.planning import resolve_experiment, shards_path

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"
SCRIPT = DATA / "replicate_script.py"
TRAIN = {"preset": "tiny", "steps": 60, "tokens_per_step": 4096, "micro_batches": 4, "world_size": 1,
         "device": "cpu"}


def record_log(script: str, companions: dict[str, str] = {}) -> str:
    """A log in the records' layout: the code (companions appended under `# <name>.py` between lines of 40
    `-`), a line of 100 `=`, then log lines."""
    code = script + "".join(f"\n\n{'-' * 40}\n# {name}\n{'-' * 40}\n\n{body}" for name, body in companions.items())
    return code + "\n" + "=" * 100 + "\nstep:0/1 val_loss:4.1589 train_time:0ms step_avg:0.00ms\n"


def config(tmp_path: Path, script: dict, train: dict | None = None, **extra) -> dict:
    """The micro experiment with a model baseline and a script variant `record`."""
    record = {"seeds": [0, 1, 2], "script": script, **({"train": train} if train is not None else {})}
    return {"data": {"source": "embedded", "name": "shakespeare", "shards": {}}, "train": dict(TRAIN),
            "variants": {"baseline": {"seeds": [0, 1], "train": {}}, "record": record},
            "stats": {"baseline": "baseline"}, **extra}


@pytest.fixture()
def in_tmp(tmp_path, monkeypatch):
    """Snakemake's working folder: tmp_path with the script, a companion and a record log."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "code").mkdir()
    shutil.copy(SCRIPT, tmp_path / "code/train_gpt.py")
    (tmp_path / "code/helper.py").write_text("X = 1\n")
    (tmp_path / "record.txt").write_text(record_log(SCRIPT.read_text(), {"helper.py": "X = 1\n"}))
    return tmp_path


def test_a_script_variant_resolves_with_its_placement_and_no_model(in_tmp):
    experiment = resolve_experiment(config(in_tmp, {"path": "code/train_gpt.py", "files": ["code/helper.py"],
                                                    "env": {"NUM_ITERATIONS": 6, "MODE": "fast"}},
                                           train={"world_size": 2}))
    assert experiment.script_variants == ("record",) and experiment.model_variants == ("baseline",)
    record = experiment.variant("record")
    assert record.train is None and record.placement.world_size == 2 and record.placement.device == "cpu"
    assert record.script.inputs == ["code/train_gpt.py", "code/helper.py"]
    assert record.script.source_args == ["--script", "code/train_gpt.py", "--files", "code/helper.py"]
    assert record.script.env_args == ["NUM_ITERATIONS=6", "MODE=fast"]
    assert record.script.sha256 == sha256(SCRIPT.read_bytes())
    assert experiment.describe("record") == (f"script code/train_gpt.py (sha256 {sha256(SCRIPT.read_bytes())[:12]}); "
                                             "companion files code/helper.py; env NUM_ITERATIONS=6 MODE=fast")
    assert experiment.describe("baseline") == "our model, preset tiny"
    experiment.check_data("record", "no-shards", "no-bos")            # a script reads its shards itself


def test_the_log_form_takes_the_script_out_of_the_log(in_tmp):
    experiment = resolve_experiment(config(in_tmp, {"log": "record.txt"}))
    spec = experiment.variant("record").script
    assert spec.inputs == ["record.txt"] and spec.source_args == ["--log", "record.txt"]
    assert spec.sha256 == sha256(SCRIPT.read_text())
    assert record_code((in_tmp / "record.txt").read_text())["helper.py"] == "X = 1\n"
    assert spec.describe() == f"script train_gpt.py of the log record.txt (sha256 {spec.sha256[:12]})"


def test_relative_paths_are_read_from_the_clone(in_tmp):
    (in_tmp / "clone/records").mkdir(parents=True)
    shutil.move(in_tmp / "record.txt", in_tmp / "clone/records/run.txt")
    cfg = config(in_tmp, {"log": "records/run.txt"}, clone="clone")
    cfg["data"]["shards"] = {"path": "data/fineweb10B"}
    assert resolve_experiment(cfg).variant("record").script.log == "clone/records/run.txt"
    assert shards_path(cfg) == "clone/data/fineweb10B"
    cfg["data"]["shards"]["path"] = "/abs/shards"
    assert shards_path(cfg) == "/abs/shards"


@pytest.mark.parametrize("script, train, message", [
    ({"path": "code/missing.py"}, None, r"variants\.record\.script\.path: code/missing\.py: no such file"),
    ({"path": "code"}, None, r"variants\.record\.script\.path: code: a folder"),
    ({"log": "missing.txt"}, None, r"variants\.record\.script\.log: missing\.txt: no such file"),
    ({"path": "code/train_gpt.py", "log": "record.txt"}, None, r"variants\.record\.script: expected either .*got both"),
    ({"env": {"A": "1"}}, None, r"variants\.record\.script: expected either .*got neither"),
    ({"log": "record.txt", "files": ["code/helper.py"]}, None, r"variants\.record\.script\.files: not with `log`"),
    ({"path": "code/train_gpt.py", "files": ["record.txt", "record.txt"]}, None,
     r"variants\.record\.script: record\.txt named twice"),
    ({"path": "code/train_gpt.py", "env": {"FLAG": True}}, None,
     r"variants\.record\.script\.env\.FLAG: True; expected a string"),
    ({"path": "code/train_gpt.py"}, {"model": {"n_layer": 2}},
     r"variants\.record\.train\.model: does not apply to a script variant .* takes only train\.world_size"),
    ({"path": "code/train_gpt.py"}, {"muon_lr": 0.04}, r"variants\.record\.train\.muon_lr: does not apply"),
    ({"path": "code/train_gpt.py"}, {"world_size": 2, "nodes": 2}, r"variant 'record': train\.nodes is 2, but "
                                                                   r"script variant 'record' runs on one node"),
    ({"path": "code/train_gpt.py"}, {"world_size": 0}, r"variant 'record': train\.world_size must be an integer"),
    ({"path": "code/train_gpt.py"}, {"device": "tpu"}, r"variant 'record': train\.device must be one of"),
])
def test_a_bad_script_variant_is_refused_naming_the_variant_and_key(in_tmp, script, train, message):
    with pytest.raises(SpeedrunError, match=r"^c\.yaml: " + message):
        resolve_experiment(config(in_tmp, script, train), "c.yaml")


def test_a_log_without_a_script_is_refused(in_tmp):
    (in_tmp / "llmc.txt").write_text("s:0 tel:10.9\n")
    with pytest.raises(SpeedrunError, match=r"script\.log: llmc\.txt: no line of 100 '=' after the code"):
        resolve_experiment(config(in_tmp, {"log": "llmc.txt"}))


def test_a_model_candidate_names_the_settings_that_differ_from_the_baseline(in_tmp):
    cfg = config(in_tmp, {"path": "code/train_gpt.py"})
    cfg["variants"]["wide"] = {"seeds": [0], "train": {"muon_lr": 0.04, "model": {"n_layer": 2}}}
    experiment = resolve_experiment(cfg)
    assert experiment.describe("wide") == "our model, preset tiny; differs from the baseline in muon_lr=0.04, " \
                                          "model.n_layer=2"


def test_two_variants_of_one_script_are_refused(in_tmp):
    cfg = config(in_tmp, {"path": "code/train_gpt.py"})
    cfg["variants"]["again"] = {"seeds": [0], "script": {"path": "code/train_gpt.py"}}
    with pytest.raises(SpeedrunError, match="variants again and record run the same script with the same env"):
        resolve_experiment(cfg)


def test_run_script_takes_the_script_and_companions_out_of_the_log(in_tmp):
    script = script_from_log(in_tmp / "record.txt", in_tmp / "run")
    assert script == in_tmp / "run/train_gpt.py" and script.read_text() == SCRIPT.read_text()
    assert (in_tmp / "run/helper.py").read_text() == "X = 1\n"
    assert cli.main(["run-script", "--log", "record.txt", "--files", "code/helper.py", "--shards-dir", "s",
                     "--run-dir", "run", "--cache-dir", "c", "--out", "o.txt"]) == 2
    with pytest.raises(SystemExit):                                  # argparse: --script and --log exclude each other
        cli.main(["run-script", "--log", "record.txt", "--script", "code/train_gpt.py", "--shards-dir", "s",
                  "--run-dir", "run", "--cache-dir", "c", "--out", "o.txt"])


# ---- the workflow end to end ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def workflow(tmp_path_factory):
    """A copied workflow run once to its report: the micro config's model `baseline` (2 seeds), the script
    variant `script` (path form, 3 seeds) and `fromlog` (the same script taken out of a record log, 2 seeds)."""
    from test_workflow import MICRO, _snakemake, _write_config

    workdir = tmp_path_factory.mktemp("script-workflow")
    shutil.copy(ROOT / "Snakefile", workdir / "Snakefile")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "workflow", workdir / "workflow", ignore=ignore)
    shutil.copytree(ROOT / "src", workdir / "src", ignore=ignore)
    (workdir / "code").mkdir()
    shutil.copy(SCRIPT, workdir / "code/train_gpt.py")
    (workdir / "records").mkdir()
    (workdir / "records/run.txt").write_text(record_log(SCRIPT.read_text()))
    cfg = yaml.safe_load(MICRO.read_text())
    cfg["variants"] = {"baseline": {"seeds": [0, 1]},
                       "script": {"seeds": [0, 1, 2], "script": {"path": "code/train_gpt.py",
                                                                 "env": {"NUM_ITERATIONS": 6}}},
                       "fromlog": {"seeds": [0, 1], "script": {"log": "records/run.txt"}}}
    _write_config(workdir, cfg)
    _snakemake(workdir, "report")
    return workdir, _snakemake


def test_script_runs_are_parsed_counted_and_compared(workflow):
    workdir, _ = workflow
    for variant, seeds in (("script", 3), ("fromlog", 2)):
        runs = [json.loads((workdir / f"results/parse/{variant}/seed{s}.json").read_text()) for s in range(seeds)]
        assert [r["status"] for r in runs] == ["complete"] * seeds
        assert [r["steps"] for r in runs] == [6] * seeds
        assert len({r["val_loss"] for r in runs}) == seeds              # replicates: each draws its own init
        log = (workdir / f"results/train/{variant}/seed0.txt").read_text()
        assert record_code(log)["train_gpt.py"] == SCRIPT.read_text()   # the record's own log, its code first
    summary = {g["group"]: g for g in json.loads((workdir / "results/stats/summary.json").read_text())}
    assert (summary["script"]["n"], summary["fromlog"]["n"], summary["baseline"]["n"]) == (3, 2, 2)
    compare = json.loads((workdir / "results/stats/compare/script.json").read_text())
    assert (compare["n_baseline"], compare["n_candidate"]) == (2, 3)
    markdown = (workdir / "results/stats/compare/script.md").read_text()
    digest = sha256(SCRIPT.read_bytes())[:12]
    assert ("What each side runs:\n\n- baseline: our model, preset tiny\n"
            f"- candidate: script code/train_gpt.py (sha256 {digest}); env NUM_ITERATIONS=6\n") in markdown
    report = (workdir / "results/report/summary.md").read_text()
    assert f"- script: script code/train_gpt.py (sha256 {digest}); env NUM_ITERATIONS=6\n" in report
    assert "- fromlog: script train_gpt.py of the log records/run.txt (sha256 " in report
    assert "script, fromlog: each seed is a replicate." in report
    runs = (workdir / "results/report/runs.csv").read_text()
    assert runs.count("\nscript,") == 3 and runs.count("\nfromlog,") == 2


def test_the_run_folder_and_the_shared_compile_cache(workflow):
    workdir, _ = workflow
    run = workdir / "results/run_script/script/seed1"
    link = run / "data/fineweb10B/fineweb_val_000000.bin"
    assert link.is_symlink() and os.path.realpath(link) == str(
        (workdir / "results/shards/shakespeare/shakespeare_val_000000.bin").resolve())
    assert (run / "train_gpt.py").read_text() == SCRIPT.read_text()
    assert (workdir / "results/run_script/fromlog/seed0/train_gpt.py").read_text() == SCRIPT.read_text()
    assert (workdir / "results/compile-cache/scripts/script/inductor").is_dir()


def test_editing_the_script_reruns_its_variant_only(workflow):
    workdir, snakemake = workflow
    assert "Nothing to be done" in snakemake(workdir, "-n", "report").stdout
    script = workdir / "code/train_gpt.py"
    original = script.read_text()
    script.write_text(original + "# edited\n")
    try:
        out = snakemake(workdir, "-n", "report").stdout
    finally:
        script.write_text(original)
    assert "run_script" in out and "results/train/script/seed2.txt" in out
    assert "results/train/fromlog" not in out and "results/train/baseline" not in out
    assert "rule train:" not in out


def test_the_bundle_takes_the_script_runs(workflow):
    workdir, snakemake = workflow
    snakemake(workdir, "results/bundle/script")
    bundle = workdir / "results/bundle/script"
    assert sorted(p.name for p in (bundle / "candidate").glob("*.txt")) == [f"seed{s}.txt" for s in range(3)]
    assert (bundle / "candidate/seed0.txt").read_bytes() == (workdir / "results/train/script/seed0.txt").read_bytes()
    readme = (bundle / "README.md").read_text()
    assert "What each side runs:\n\n- baseline: our model, preset tiny\n- candidate: script code/train_gpt.py" in readme


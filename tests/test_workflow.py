"""The whole pipeline on a micro config, through the Snakemake API, and the rerun rules through `snakemake -n`.

The workflow (Snakefile, workflow/, src/) is copied into a temporary folder so that the tests can edit the
package's code and the config there; the copied package is the one every stage imports (PYTHONPATH).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
MICRO = Path(__file__).parent / "data" / "micro-config.yaml"

pytestmark = pytest.mark.slow


def _env(workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(workdir / "src")
    env.pop("PYTHONSAFEPATH", None)
    return env


def _snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """The snakemake command line in `workdir` (the copied workflow)."""
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", *args]
    proc = subprocess.run(cmd, cwd=workdir, env=_env(workdir), capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def _planned_jobs(proc: subprocess.CompletedProcess) -> dict[str, int]:
    """Rule -> job count from the `Job stats` table of a dry run ({} when nothing is to be done)."""
    out = proc.stdout + proc.stderr
    if "Nothing to be done" in out:
        return {}
    table = out.split("Job stats:", 1)[1]
    counts = {}
    for line in table.splitlines()[3:]:
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if not m:
            break
        counts[m.group(1)] = int(m.group(2))
    counts.pop("total", None)
    return counts


def _write_config(workdir: Path, cfg: dict) -> None:
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))


def _run_api(workdir: Path, targets: set[str]) -> None:
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import DAGSettings, OutputSettings, ResourceSettings

    with SnakemakeApi(OutputSettings(quiet=None)) as api:
        wf = api.workflow(
            resource_settings=ResourceSettings(cores=2),
            snakefile=workdir / "Snakefile",
            workdir=workdir,
        )
        wf.dag(DAGSettings(targets=frozenset(targets))).execute_workflow(executor="local")


@pytest.fixture(scope="module")
def micro_config() -> dict:
    return yaml.safe_load(MICRO.read_text())


@pytest.fixture(scope="module")
def workflow(tmp_path_factory, micro_config):
    """A copied workflow that has run end to end once on the micro config."""
    workdir = tmp_path_factory.mktemp("workflow")
    shutil.copy(ROOT / "Snakefile", workdir / "Snakefile")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "workflow", workdir / "workflow", ignore=ignore)
    shutil.copytree(ROOT / "src", workdir / "src", ignore=ignore)
    _write_config(workdir, micro_config)

    saved_env, saved_path = dict(os.environ), list(sys.path)
    saved_modules = {k: v for k, v in sys.modules.items() if k == "speedrun" or k.startswith("speedrun.")}
    os.environ.update({k: v for k, v in _env(workdir).items() if k in ("PATH", "PYTHONPATH")})
    sys.path.insert(0, str(workdir / "src"))
    for name in saved_modules:
        del sys.modules[name]
    try:
        _run_api(workdir, {"report"})
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.path[:] = saved_path
        for name in [k for k in sys.modules if k == "speedrun" or k.startswith("speedrun.")]:
            del sys.modules[name]
        sys.modules.update(saved_modules)
    return workdir


def _plan_with(workflow, micro_config, edit, *args, check=True):
    """``snakemake -n *args`` with the config changed by ``edit(cfg)`` (on a deep copy), then the config put back."""
    cfg = json.loads(json.dumps(micro_config))
    edit(cfg)
    _write_config(workflow, cfg)
    try:
        return _snakemake(workflow, "-n", *args, check=check)
    finally:
        _write_config(workflow, micro_config)


def test_every_stage_wrote_its_outputs(workflow, micro_config):
    manifest = json.loads((workflow / "results/shards/shakespeare/manifest.json").read_text())
    assert manifest["shards"][0]["file"] == "shakespeare_val_000000.bin"
    assert [s["split"] for s in manifest["shards"]][1:] == ["train"] * (len(manifest["shards"]) - 1)
    bos = sorted(p.name for p in (workflow / "results/bos_index/shakespeare").glob("*.npy"))
    assert bos == sorted(s["file"].replace(".bin", ".npy") for s in manifest["shards"])
    steps = micro_config["train"]["steps"]
    log = (workflow / "results/train/baseline/seed0.txt").read_text()
    assert re.search(rf"^step:{steps}/{steps} val_loss:\d+\.\d+ train_time:\d+ms", log, re.M)
    for name in ("summary.md", "runs.csv", "val_loss.png", "final_val_loss.png"):
        assert (workflow / "results/report" / name).stat().st_size > 0
    assert (workflow / "results/report/val_loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_statistics_count_complete_runs_and_list_the_diverged_one(workflow):
    summary = {g["group"]: g for g in json.loads((workflow / "results/stats/summary.json").read_text())}
    assert summary["baseline"]["n"] == 2 and summary["candidate"]["n"] == 2
    assert summary["unstable"]["n"] == 0
    assert [r["status"] for r in summary["unstable"]["runs"]] == ["diverged"]
    record = json.loads((workflow / "results/parse/unstable/seed0.json").read_text())
    assert record["status"] == "diverged" and record["val_loss"] is None
    report = (workflow / "results/report/summary.md").read_text()
    assert "unstable seed 0 (diverged)" in report
    # The tiny model learns in 4 steps: every complete run ends below ln(50304) = 10.83 and the target 11.
    losses = [r["val_loss"] for g in ("baseline", "candidate") for r in summary[g]["runs"]]
    assert all(loss < 10.8 for loss in losses)
    assert summary["baseline"]["p_value"] < 0.01


def test_second_run_does_nothing(workflow):
    assert _planned_jobs(_snakemake(workflow, "-n", "report")) == {}


def test_new_data_retrains_every_run(workflow, micro_config):
    """A new data.name (here with other shards) builds its own shards and BOS index and retrains every run:
    the old runs were trained on other data. Snakemake said "Nothing to be done" while the new BOS index (a
    checkpoint) did not exist yet and the runs' logs did."""
    def edit(cfg):
        cfg["data"].update(name="shakespeare2", shard_tokens=cfg["data"]["shard_tokens"] // 2)
    proc = _plan_with(workflow, micro_config, edit, "-p", "report")
    jobs = _planned_jobs(proc)
    runs = sum(len(v["seeds"]) for v in micro_config["variants"].values())
    assert (jobs["corpus"], jobs["tokenize"], jobs["bos_index"], jobs["train"], jobs["parse"]) == (1, 1, 1, runs, runs)
    new_data = "--shards-dir results/shards/shakespeare2 --bos-dir results/bos_index/shakespeare2"
    assert proc.stdout.count(new_data) == runs


def test_missing_shards_are_rebuilt_not_a_planning_error(workflow, micro_config, tmp_path):
    """Shards moved aside (as speedrun train does with a damaged one) or deleted while their BOS index stays:
    planning went on to read the missing manifest.json and stopped. Now a call whose runs are all done has
    nothing to do, and one that adds a run plans the rebuild (tokenize, bos_index) before it."""
    work = tmp_path / "copy"
    shutil.copytree(workflow, work, symlinks=True)                          # copy2: the mtimes
    shards = work / "results/shards/shakespeare"
    shards.rename(shards.with_name("shakespeare.damaged-20261207T045458Z"))
    assert _planned_jobs(_snakemake(work, "-n", "report")) == {}
    cfg = json.loads(json.dumps(micro_config))
    cfg["variants"]["baseline"]["seeds"].append(7)
    _write_config(work, cfg)
    proc = _snakemake(work, "-n", "report")
    jobs = _planned_jobs(proc)
    assert (jobs["tokenize"], jobs["bos_index"]) == (1, 1) and jobs["train"] >= 1
    assert "results/train/baseline/seed7.txt" in proc.stdout


def test_changing_one_variant_reruns_that_variant_only(workflow, micro_config):
    proc = _plan_with(workflow, micro_config,
                      lambda cfg: cfg["variants"]["candidate"]["train"].update(muon_lr=0.03), "report")
    jobs = _planned_jobs(proc)
    assert jobs["train"] == 2 and jobs["parse"] == 2
    assert "results/train/baseline" not in proc.stdout
    assert not {"corpus", "tokenize", "bos_index"} & jobs.keys()


def test_adding_a_seed_adds_one_run(workflow, micro_config):
    proc = _plan_with(workflow, micro_config, lambda cfg: cfg["variants"]["baseline"]["seeds"].append(7), "report")
    jobs = _planned_jobs(proc)
    assert jobs["train"] == 1 and "results/train/baseline/seed7.txt" in proc.stdout
    assert not {"corpus", "tokenize", "bos_index"} & jobs.keys()


def test_removed_seed_is_counted_nowhere(workflow, micro_config, tmp_path):
    """A seed removed from the config leaves its parsed run in results/parse/<variant>/; stats, compare and the
    report (run for real in a copy of the finished workflow) count the configured runs only, all with one n."""
    work = tmp_path / "copy"
    shutil.copytree(workflow, work, symlinks=True)  # copy2: the mtimes, so only what the edit touches reruns
    cfg = json.loads(json.dumps(micro_config))
    cfg["variants"]["baseline"]["seeds"] = [0]
    _write_config(work, cfg)
    assert _planned_jobs(_snakemake(work, "-n", "report")) == {"stats": 1, "compare": 2, "report": 1}
    _snakemake(work, "report")
    assert (work / "results/parse/baseline/seed1.json").is_file()  # stale, still there
    summary = {g["group"]: g for g in json.loads((work / "results/stats/summary.json").read_text())}
    assert summary["baseline"]["n"] == 1 and [r["seed"] for r in summary["baseline"]["runs"]] == [0]
    assert summary["baseline"]["slug"] == "baseline" and summary["candidate"]["n"] == 2
    assert "1 complete run, step 4/4." in (work / "results/stats/baseline/statistics.md").read_text()
    for candidate in ("candidate", "unstable"):
        c = json.loads((work / f"results/stats/compare/{candidate}.json").read_text())
        assert (c["baseline"], c["candidate"], c["n_baseline"]) == ("baseline", candidate, 1)
    runs = (work / "results/report/runs.csv").read_text().splitlines()
    assert sum(line.startswith("baseline,") for line in runs) == 1
    assert re.search(r"^\| baseline \| 1 \|", (work / "results/report/summary.md").read_text(), re.M)


def test_changing_report_options_reruns_only_the_report(workflow, micro_config):
    jobs = _planned_jobs(_plan_with(workflow, micro_config,
                                    lambda cfg: cfg["report"].update(zoom_last_fraction=0.25), "report"))
    assert set(jobs) == {"report"}


@pytest.mark.parametrize(
    ("edited", "reruns", "never"),
    [
        ("src/speedrun/model/gpt.py", {"train", "parse", "stats", "compare", "report"}, {"corpus", "tokenize", "bos_index"}),
        ("src/speedrun/analysis/logs.py", {"parse", "stats", "compare", "report"}, {"corpus", "tokenize", "bos_index", "train"}),
        ("src/speedrun/data/tokenizer.py", {"tokenize", "bos_index", "train"}, {"corpus"}),
        # a stage module runs in its own stage only (the report read speedrun.stats, compare read it too)
        ("src/speedrun/stats.py", {"stats", "report"}, {"compare", "train", "parse"}),
        ("src/speedrun/compare.py", {"compare", "report"}, {"stats", "train", "parse"}),
    ],
)
def test_code_edit_reruns_the_stages_that_import_it(workflow, edited, reruns, never):
    path = workflow / edited
    original = path.read_text()
    path.write_text(original + "\n# an edit\n")
    try:
        proc = _snakemake(workflow, "-n", "report")
    finally:
        path.write_text(original)
    jobs = _planned_jobs(proc)
    assert reruns <= jobs.keys(), jobs
    assert not never & jobs.keys(), jobs
    assert f"Updated input files: {edited}" in proc.stdout or edited in proc.stdout


def test_impossible_batch_is_refused_before_training(workflow, micro_config):
    """One line naming the config file, where the steps are set (the shared `train` section, not the first
    variant) and the keys to lower; no traceback, and no shard count the embedded corpus could never reach."""
    proc = _plan_with(workflow, micro_config, lambda cfg: cfg["train"].update(steps=1000000), "report", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "config.yaml: the shared `train` section (every variant): 1000000 steps" in out and "train shards of" in out
    assert "Lower train.steps or train.tokens_per_step, or use a larger dataset (data.source: fineweb)" in out
    assert "Traceback" not in out and "InputFunctionException" not in out and "Use about" not in out


def test_a_default_written_out_reruns_nothing(workflow, micro_config):
    """`dtype: auto` (the documented default), `muon_lr: 0.05` (TrainConfig's) and `model: {n_layer: 4}` (the
    tiny preset's) are the settings the runs already had: the train rule's params are the resolved settings,
    so nothing is to be done."""
    def edit(cfg):
        cfg["train"]["dtype"] = "auto"
        cfg["variants"]["baseline"]["train"] = {"muon_lr": 0.05, "model": {"n_layer": 4}}   # the tiny preset's
    assert _planned_jobs(_plan_with(workflow, micro_config, edit, "report")) == {}


def test_a_multi_node_run_on_the_local_executor_is_refused_before_its_output_is_removed(workflow, micro_config):
    """A real (not dry) run: the refusal comes before the job that would redo seed 0 removes its log."""
    cfg = json.loads(json.dumps(micro_config))
    cfg["variants"]["baseline"]["train"] = {"world_size": 2, "nodes": 2}
    log = workflow / "results/train/baseline/seed0.txt"
    before = log.read_text()
    _write_config(workflow, cfg)
    try:
        proc = _snakemake(workflow, str(log.relative_to(workflow)), check=False)
    finally:
        _write_config(workflow, micro_config)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "variant 'baseline': train.nodes is 2, but the executor is 'local'" in out, out[-2000:]
    assert "Traceback" not in out
    assert log.read_text() == before
    assert _planned_jobs(_snakemake(workflow, "-n", "report")) == {}     # no lock left behind


def test_unknown_baseline_and_duplicate_seed_are_refused(workflow, micro_config):
    proc = _plan_with(workflow, micro_config, lambda cfg: cfg["stats"].update(baseline="nope"), check=False)
    assert proc.returncode != 0 and "stats.baseline is 'nope'" in proc.stdout + proc.stderr

    proc = _plan_with(workflow, micro_config, lambda cfg: cfg["variants"]["baseline"].update(seeds=[0, 0]),
                      check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "seeds" in out and "non-unique" in out


def test_planning_refuses_misspelt_training_settings_and_unmatched_files(tmp_path):
    """`snakemake -n` stops, naming the variant and the config files, before anything runs: a misspelt
    training key of one variant or of the shared section (named where it is written), a CUDA-only backend on
    a CPU, document paths that match no file, a folder or a file of no documents format, a number YAML reads
    as text (one line from the schema check, with the way to write it)."""
    cases = {
        "typo.yaml": ("variants:\n  v: {seeds: [0], train: {muon_learning_rate: 0.04}}\nstats: {baseline: v}\n",
                      "typo.yaml: variants.v.train.muon_learning_rate: unknown training setting; expected one of "
                      ".*muon_lr"),
        "shared.yaml": ("train: {stepz: 10}\n", r"shared.yaml: train.stepz: unknown training setting"),
        "flex.yaml": ("variants:\n  v: {seeds: [0], train: {preset: record28}}\nstats: {baseline: v}\n",
                      "variant 'v': train.model.attention_backend 'flex' trains on CUDA only"),
        "files.yaml": ("data: {source: files, name: mine, files: {paths: [nonexistent/*.txt]}}\n",
                       "files.yaml: data.files.paths: 'nonexistent/\\*.txt' matches no file \\(read from "),
        "folder.yaml": ("data: {source: files, name: mine, files: {paths: [in/*.txt]}}\n",
                        r"folder.yaml: data.files.paths: in/sub.txt is not a file \(a folder\?\)"),
        "suffix.yaml": ("data: {source: files, name: mine, files: {paths: [in/*.csv]}}\n",
                        r"suffix.yaml: data.files.paths: in/d.csv: unknown documents format '.csv'"),
        "nodes.yaml": ("train: {nodes: 2}\n",
                       r"nodes.yaml: the shared `train` section \(every variant\): train.world_size 1 is not a "
                       r"multiple of train.nodes 2; "
                       r"expected world_size = nodes x processes per node"),
        "empty.yaml": ("variants:\n  smear: {seeds: [0], train: {}}\n",
                       r"variants smear and baseline resolve to the same train settings: variants.smear.train \{\} "
                       r"changes nothing .*; a candidate must differ from the baseline"),
        "default.yaml": ("variants:\n  smear: {seeds: [0], train: {muon_lr: 0.05, dtype: auto}}\n"
                         "  other: {seeds: [0], train: {muon_lr: 0.04}}\n",
                         r"variants smear and baseline resolve to the same train settings"),
        "presetvalue.yaml": ("variants:\n  deep: {seeds: [0], train: {model: {n_layer: 4}}}\n",
                             r"variants deep and baseline resolve to the same train settings"),
        "twins.yaml": ("variants:\n  a: {seeds: [0], train: {muon_lr: 0.03}}\n"
                       "  b: {seeds: [0], train: {muon_lr: 0.03, nodes: 1}}\n",
                       r"variants b and a resolve to the same train settings: .*each variant must differ"),
        "nodes0.yaml": ("variants:\n  v: {seeds: [0], train: {nodes: 0}}\nstats: {baseline: v}\n",
                        r"nodes0.yaml: variant 'v': train.nodes must be an integer >= 1, got 0\n"),
        "nodestext.yaml": ("variants:\n  v: {seeds: [0], train: {nodes: '2'}}\nstats: {baseline: v}\n",
                           r"variant 'v': train.nodes must be an integer >= 1, got '2' \(text, not a number: "
                           r"write 2 without quotes\)"),
        "seedfloat.yaml": ("variants:\n  v: {seeds: [1.0]}\nstats: {baseline: v}\n",
                           r"seedfloat.yaml: variants.v.seeds: 1.0 is not an integer; write 1\n"),
        "seedbig.yaml": ("variants:\n  v: {seeds: [18446744073709551616]}\nstats: {baseline: v}\n",
                         r"variants.v.seeds.0: 18446744073709551616 is greater than the maximum of "
                         r"18446744073709551615"),
        "reserved.yaml": ("variants:\n  compare: {seeds: [0], train: {muon_lr: 0.04}}\n",
                          r"reserved.yaml: variants.compare: 'compare' is reserved \(results/stats/compare/ holds "
                          r"the comparisons\)"),
        "sharedsteps.yaml": ("train: {steps: 10.0}\n",
                             r"sharedsteps.yaml: the shared `train` section \(every variant\): train.steps must "
                             r"be an integer >= 1, got 10.0"),
        "text.yaml": ("stats: {target: 4.6e0}\n",
                      r"config.yaml \+ text.yaml: stats.target: '4.6e0' is not of type 'number' \(text, not a "
                      r"number: YAML reads 4.6e0 as a string; write it as 4.6\)"),
    }
    done = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-s", str(ROOT / "Snakefile"), "-d",
                           str(tmp_path), "--config", "stats={target: abc}"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300, env=_env(ROOT))
    assert done.returncode != 0                              # a value from --config is not blamed on config.yaml
    assert "config.yaml + --config: stats.target: 'abc' is not of type 'number'" in done.stdout + done.stderr
    (tmp_path / "in" / "sub.txt").mkdir(parents=True)      # a folder a documents glob matches
    (tmp_path / "in" / "d.csv").write_text("text\nhello\n")
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        done = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-s", str(ROOT / "Snakefile"),
                               "-d", str(tmp_path), "--configfile", str(ROOT / "config.yaml"), name],
                              capture_output=True, text=True, cwd=tmp_path, timeout=300, env=_env(ROOT))
        assert done.returncode != 0
        assert re.search(message, done.stdout + done.stderr), (name, (done.stdout + done.stderr)[-2000:])
        assert "Failed validating" not in done.stdout + done.stderr          # no jsonschema dump


def test_a_run_folder_with_a_configfile_keeps_the_projects_config(tmp_path):
    """`snakemake -s .../Snakefile -d run --configfile my.yaml`: the project's config.yaml (beside the Snakefile,
    not in `run/`) is still read under my.yaml, so its candidate variant and shared training settings are in the
    planned command (Snakemake skipped a configfile missing from `-d` silently when --configfile was given)."""
    from cluster_support import copy_workflow, job_blocks, micro_config, snakemake

    cfg = micro_config({"baseline": {"seeds": [0]}, "candidate": {"seeds": [0], "train": {"muon_lr": 0.0375}}})
    workdir = copy_workflow(tmp_path / "project", cfg)
    (tmp_path / "my.yaml").write_text("stats: {alpha: 0.05}\ntrain: {steps: 6}\n")
    done = snakemake(tmp_path, "results/train/candidate/seed0.txt", "-n", "-p", "--cores", "2",
                     "-s", str(workdir / "Snakefile"), "-d", "run", "--configfile", "my.yaml",
                     PYTHONPATH=str(workdir / "src"))      # the copied package, not the one installed
    assert done.returncode == 0, done.stdout[-3000:]
    [job] = job_blocks(done.stdout, "train")
    settings = json.loads(job["shell"].split("--config '", 1)[1].split("'", 1)[0])
    assert (settings["muon_lr"], settings["val_tokens"], settings["steps"]) == (0.0375, 2048, 6)
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_a_yaml_error_in_config_yaml_is_named_with_its_line(tmp_path):
    """Snakemake's own message ("Config file is not valid JSON or YAML") names neither the file nor the line;
    the Snakefile checks its config.yaml first, and prints the one line without Snakemake's frames of the
    Snakefile (it was `SpeedrunError in file .../Snakefile, line 16:` and two `File ...` lines)."""
    from cluster_support import copy_workflow, micro_config, snakemake

    workdir = copy_workflow(tmp_path, micro_config({"baseline": {"seeds": [0]}}))
    with open(workdir / "config.yaml", "a") as f:
        f.write("report: {plots: [loss\n")
    done = snakemake(workdir, "-n", "--cores", "1", "report")
    out = done.stdout                                                    # stderr joined into stdout
    assert done.returncode != 0
    lines = (workdir / "config.yaml").read_text().count("\n")
    assert re.search(rf"config.yaml: not valid YAML: line {lines + 1}, column 1: while parsing a flow sequence "
                     rf"\(line {lines}, column 17\); expected ',' or ']'", out), out[-2000:]
    assert "SpeedrunError in file" not in out and 'File "' not in out, out[-2000:]


def test_a_key_given_twice_in_a_configfile_is_named_with_its_line(tmp_path):
    """Snakemake reads a --configfile with PyYAML, which keeps the second of two equal keys silently (a new-user
    run lost a variant so); the workflow names it as it names one in config.yaml."""
    from cluster_support import copy_workflow, micro_config, snakemake

    workdir = copy_workflow(tmp_path, micro_config({"baseline": {"seeds": [0]}}))
    (workdir / "dup.yaml").write_text("variants:\n  baseline: {seeds: [0]}\n  fast: {seeds: [0]}\n"
                                      "  baseline: {seeds: [1]}\n")
    done = snakemake(workdir, "-n", "--cores", "1", "report", "--configfile", "dup.yaml")
    assert done.returncode != 0
    assert ("dup.yaml: not valid YAML: line 4, column 3: key 'baseline' given twice in one mapping (first at line "
            "2); the second would replace the first") in done.stdout, done.stdout[-2000:]
    assert 'File "' not in done.stdout, done.stdout[-2000:]


def test_a_comparison_or_bundle_of_the_baseline_is_one_line_naming_the_candidates(tmp_path):
    """`snakemake results/bundle/baseline` (the baseline as its own candidate): one line naming the config
    file, stats.baseline and the candidates to name instead."""
    from cluster_support import copy_workflow, micro_config, snakemake

    cfg = micro_config({"baseline": {"seeds": [0]}, "fast": {"seeds": [0], "train": {"muon_lr": 0.04}}})
    workdir = copy_workflow(tmp_path, cfg)
    for target in ("results/bundle/baseline", "results/stats/compare/baseline.json"):
        done = snakemake(workdir, "-n", "--cores", "1", target)
        assert done.returncode != 0
        assert ("config.yaml: variant 'baseline' is stats.baseline: it is not compared with itself; expected a "
                "candidate, one of fast") in done.stdout, done.stdout[-2000:]
        assert "Traceback" not in done.stdout


def test_a_target_of_an_unknown_seed_is_one_line(workflow, micro_config):
    """`snakemake results/train/baseline/seed5.txt` for a seed the config does not list: one line naming the
    config file and the variant's seeds (it was an InputFunctionException with a traceback)."""
    seeds = micro_config["variants"]["baseline"]["seeds"]
    proc = _snakemake(workflow, "-n", "results/train/baseline/seed99.txt", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"seed 99 is not a seed of variant 'baseline' in config.yaml (its seeds: {seeds})" in out
    assert "Traceback" not in out and "InputFunctionException" not in out

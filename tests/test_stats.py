"""Grouping of runs, the record-rule t-test, and `speedrun stats` (incl. PUBLISHED.md reproduced)."""

import codecs
import gzip
import json
import math
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, stats as sps

from speedrun import cli
from speedrun import stats as stats_stage
from speedrun.analysis.group_stats import compute_stats, group_stats
from speedrun.analysis.groups import Group, collect_runs, run_label
from speedrun.analysis.logs import RunRecord
from speedrun.analysis.tables import statistics_markdown
from speedrun.analysis.tests import one_sample_less, summarize
from speedrun.errors import SpeedrunError
from test_logs import REFERENCE, SEP, needs_reference, our_log, write


def student_t_cdf(t: float, dof: int) -> float:
    """P(T <= t) by integrating the Student t density (written out, not scipy's t distribution)."""
    def density(x):
        return math.exp(math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2)) / math.sqrt(dof * math.pi) * \
            (1 + x * x / dof) ** (-(dof + 1) / 2)
    return integrate.quad(density, -math.inf, t, epsabs=1e-13)[0]


def test_one_sample_test_against_hand_formula():
    x = [3.2783, 3.2792, 3.2791, 3.2819, 3.2798, 3.2812]
    n, mean = len(x), sum(x) / len(x)
    sd = math.sqrt(sum((v - mean) ** 2 for v in x) / (n - 1))
    t = (mean - 3.28) / (sd / math.sqrt(n))
    res = one_sample_less(x, 3.28)
    assert res.mean == pytest.approx(mean, rel=1e-12) and res.std == pytest.approx(sd, rel=1e-9)
    assert res.t_statistic == pytest.approx(t, rel=1e-9) and res.dof == n - 1
    assert res.p_value == pytest.approx(student_t_cdf(t, n - 1), rel=1e-6)  # H1 mean < target: lower tail
    assert res.alternative == "less" and res.hypothesis == "mean < 3.28"


def test_untestable_samples_give_reasons():
    assert one_sample_less([3.27], 3.28).p_value is None
    assert "at least 2" in one_sample_less([3.27], 3.28).reason
    assert "at least 2" in one_sample_less([], 3.28).reason and summarize([]).mean is None
    assert "zero variance" in one_sample_less([3.27, 3.27], 3.28).reason
    assert summarize([2.0]).std is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(3.0, 3.5, allow_nan=False), min_size=2, max_size=30).filter(lambda x: np.ptp(x) > 1e-6),
       st.floats(3.0, 3.5))
def test_one_sample_agrees_with_scipy(x, target):
    res = one_sample_less(x, target)
    ref = sps.ttest_1samp(x, target, alternative="less")
    assert res.p_value == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-300)
    assert res.std == pytest.approx(np.std(x, ddof=1), rel=1e-9)


def record(file, val_loss, time_ms, *, status="complete", steps=100, seed=None, gpu_count=8, h=None):
    return RunRecord(file=file, format="modded", status=status, steps=steps, last_step=steps, val_loss=val_loss,
                     train_time_ms=time_ms, step_avg_ms=None, seed=seed, gpu_count=gpu_count,
                     content_hash=h or file, curve_hash=file)


def stats_in_two_orders(runs: list[tuple[float, float]], rnd) -> tuple[dict, dict]:
    """The ``group_stats`` JSON (target 3.28) of one group of ``runs`` (val_loss, time_ms), first in the given
    order, then shuffled by ``rnd``."""
    records = [record(f"r{i}.txt", v, t) for i, (v, t) in enumerate(runs)]
    shuffled = records[:]
    rnd.shuffle(shuffled)
    return tuple(group_stats(Group("g", "g", "g", tuple(rs)), 3.28).to_json() for rs in (records, shuffled))


runs_strategy = st.lists(st.tuples(st.floats(3.2, 3.4), st.floats(1e4, 2e5)), min_size=2, max_size=20).filter(
    lambda rs: np.ptp([r[0] for r in rs]) > 1e-6)


@settings(max_examples=40, deadline=None)
@given(runs_strategy, st.randoms())
def test_group_statistics_ignore_run_order_and_convert_ms_to_s(runs, rnd):
    a, b = stats_in_two_orders(runs, rnd)
    for key in ("n", "val_loss_mean", "val_loss_std", "p_value", "train_time_mean_s", "train_time_std_s"):
        assert a[key] == pytest.approx(b[key], rel=1e-9)
    times_ms = np.array([t for _, t in runs])
    assert a["train_time_mean_s"] * 1000 == pytest.approx(times_ms.mean(), rel=1e-12)
    assert a["train_time_std_s"] * 1000 == pytest.approx(times_ms.std(ddof=1), rel=1e-9)
    assert a["p_value"] == pytest.approx(sps.ttest_1samp([v for v, _ in runs], 3.28, alternative="less").pvalue,
                                         rel=1e-9, abs=1e-300)


def test_incomplete_and_duplicate_runs_are_listed_not_counted():
    runs = (record("a.txt", 3.27, 1000.0), record("b.txt", 3.28, 1100.0, h="a.txt"),
            record("c.txt", None, None, status="diverged"), record("d.txt", 3.29, 1200.0),
            record("e.txt", None, None, status="truncated"))
    s = group_stats(Group("g", "g", "g", runs, duplicate_of=(None, "a.txt", None, None, None)), 3.28).to_json()
    assert s["n"] == 2 and s["val_loss_mean"] == pytest.approx(3.28)
    assert s["incomplete"] == {"diverged": 1, "truncated": 1}
    assert [r["status"] for r in s["runs"]] == ["complete", "complete", "diverged", "complete", "truncated"]
    assert s["runs"][1]["duplicate_of"] == "a.txt"


# ---------------------------------------------------------------------------------------------------------
# Groups from files: our format written in temporary directories.

def make_runs(folder, specs):
    """specs: (seed, end, device, final val_loss, step_ms) -> our-format logs seed<seed>.txt in ``folder``."""
    paths = []
    for seed, end, device, final, step_ms in specs:
        losses = [10.8, 9.0, 8.0, 7.5, final]
        text, _ = our_log(steps=4, seed=seed, end=end, device=device, losses=losses, step_ms=step_ms)
        paths.append(write(folder / f"seed{seed}.txt", text))
    return paths


def test_directory_groups_skip_non_logs_and_flag_duplicates(tmp_path):
    base = tmp_path / "baseline"
    make_runs(base, [(0, "complete", "cpu", 6.90, 100.0), (1, "complete", "cpu", 6.95, 101.0),
                     (2, "complete", "cpu", 6.85, 99.0), (3, "diverged", "cpu", 6.9, 100.0),
                     (4, "failed", "cpu", 6.9, 100.0)])
    write(base / "README.md", "# notes\n")
    (base / "sub").mkdir()
    shutil.copy(base / "seed0.txt", base / "sub" / "seed0.txt")  # subdirectories are not read
    shutil.copy(base / "seed0.txt", base / "zz_copy.txt")
    [g] = collect_runs([str(base)])
    assert g.name == str(base) and g.slug == "baseline" and g.split_reason is None
    assert len(g.runs) == 6 and len(g.counted) == 3
    assert g.duplicates == {str(base / "zz_copy.txt"): str(base / "seed0.txt")}
    assert g.skipped == (str(base / "README.md"),)
    s = group_stats(g, 7.0).to_json()
    assert s["n"] == 3 and s["incomplete"] == {"diverged": 1, "failed": 1}
    assert s["val_loss_mean"] == pytest.approx(6.9) and s["val_loss_std"] == pytest.approx(0.05)
    assert s["train_time_mean_s"] == pytest.approx(0.4)  # 4 steps x 100 ms on average
    assert s["p_value"] == pytest.approx(sps.ttest_1samp([6.90, 6.95, 6.85], 7.0, alternative="less").pvalue)


def test_a_variant_matching_another_loss_for_loss_keeps_its_runs(tmp_path):
    """A candidate that changes speed only (a bit-exact kernel) has the baseline's loss curves, seed for seed:
    both groups of one ``stats`` call (the workflow's) count every run; duplicates are looked for within a
    group, where an identical curve means a run that was not independent."""
    finals = [6.90, 6.95, 6.85]
    make_runs(tmp_path / "baseline", [(i, "complete", "cpu", f, 100.0) for i, f in enumerate(finals)])
    make_runs(tmp_path / "candidate", [(i, "complete", "cpu", f, 90.0) for i, f in enumerate(finals)])
    shutil.copy(tmp_path / "candidate" / "seed0.txt", tmp_path / "candidate" / "zz_copy.txt")
    base, cand = collect_runs([str(tmp_path / "baseline"), str(tmp_path / "candidate")])
    assert len(base.counted) == len(cand.counted) == 3 and base.duplicates == {}
    assert cand.duplicates == {str(tmp_path / "candidate" / "zz_copy.txt"): str(tmp_path / "candidate" /
                                                                                     "seed0.txt")}
    times = [group_stats(g, 7.0).to_json()["train_time_mean_s"] for g in (base, cand)]
    assert times == pytest.approx([0.4, 0.36])


def test_split_by_gpu_count_and_file_arguments_group_by_parent(tmp_path):
    d = tmp_path / "mixed"
    make_runs(d, [(0, "complete", "cpu", 6.9, 100.0), (1, "complete", "cpu", 6.8, 100.0),
                  (2, "complete", "NVIDIA H200 x 1", 6.7, 10.0)])
    groups = collect_runs([str(d)])
    assert [g.name for g in groups] == [f"{d} [CPU]", f"{d} [1 GPU]"]
    assert [len(g.runs) for g in groups] == [2, 1]
    assert "GPU counts differ (2 runs on 0, 1 run on 1)" in groups[0].split_reason
    assert groups[0].slug == "mixed_CPU"
    files = collect_runs([str(d / "seed0.txt"), str(d / "seed1.txt")])
    assert [g.name for g in files] == [str(d)] and len(files[0].runs) == 2


def test_unknown_step_counts_join_the_only_known_one(tmp_path):
    make_runs(tmp_path / "d", [(0, "complete", "cpu", 6.9, 100.0)])
    write(tmp_path / "d" / "cut.log", "s:0 tel:11.0\ns:0 trl:10.9\n")  # llm.c, unfinished: steps unknown
    [g] = collect_runs([str(tmp_path / "d")])
    assert g.split_reason is None and len(g.runs) == 2 and g.steps == 4
    text, _ = our_log(steps=6, seed=5)
    write(tmp_path / "d" / "seed5.txt", text)
    groups = collect_runs([str(tmp_path / "d")])
    assert [g.name.rsplit(" ", 2)[-2:] for g in groups] == [["[4", "steps]"], ["[6", "steps]"], ["[steps", "unknown]"]]
    assert "1 run of 4, 1 run of 6, 1 run of unknown" in groups[0].split_reason
    text, _ = our_log(steps=10, seed=6)         # 10 sorts after 6 as a number ("10" < "6" as text)
    write(tmp_path / "d" / "seed6.txt", text)
    groups = collect_runs([str(tmp_path / "d")])
    assert "1 run of 4, 1 run of 6, 1 run of 10, 1 run of unknown" in groups[0].split_reason


def test_same_directory_twice_and_slug_collisions(tmp_path):
    make_runs(tmp_path / "x" / "baseline", [(0, "complete", "cpu", 6.9, 100.0)])
    make_runs(tmp_path / "y" / "baseline", [(0, "complete", "cpu", 6.8, 100.0)])
    spelled = [str(tmp_path / "x" / "baseline"), str(tmp_path / "x" / "." / "baseline" / ""), str(tmp_path / "y" / "baseline")]
    groups = collect_runs(spelled)
    assert [len(g.runs) for g in groups] == [1, 1]
    assert [g.slug for g in groups] == ["x__baseline", "y__baseline"]


def test_parsed_run_json_is_read_instead_of_the_log(tmp_path):
    from speedrun.analysis.parsed_files import parse_to_files

    logs = make_runs(tmp_path / "train" / "v", [(0, "complete", "cpu", 6.9, 100.0), (1, "diverged", "cpu", 6.9, 1.0)])
    for log in logs:
        parse_to_files(str(log), str(tmp_path / "parse" / "v" / f"{log.stem}.csv"),
                       str(tmp_path / "parse" / "v" / f"{log.stem}.json"))
        log.write_text("overwritten: the JSON must be used, not the log\n")
    [g] = collect_runs([str(tmp_path / "parse" / "v")])
    assert [(r.status, r.val_loss, r.seed) for r in g.runs] == [("complete", 6.9, 0), ("diverged", None, 1)]
    assert len(g.skipped) == 2  # the two CSV files
    saved = tmp_path / "parse" / "v" / "seed0.json"                 # saved again by a Windows editor
    saved.write_bytes(codecs.BOM_UTF8 + saved.read_bytes())
    [g] = collect_runs([str(tmp_path / "parse" / "v")])
    assert [(r.status, r.val_loss, r.seed) for r in g.runs] == [("complete", 6.9, 0), ("diverged", None, 1)]


def test_one_log_parsed_twice_counts_once(tmp_path):
    from speedrun.analysis.parsed_files import parse_to_files

    [log] = make_runs(tmp_path / "train", [(0, "complete", "cpu", 6.9, 100.0)])
    for name in ("a", "b"):
        parse_to_files(str(log), None, str(tmp_path / "parse" / f"{name}.json"))
    [g] = collect_runs([str(tmp_path / "parse")])
    assert len(g.runs) == 2 and len(g.counted) == 1 and g.duplicate_of == (None, str(log))


def test_warnings_for_repeated_seeds(tmp_path):
    make_runs(tmp_path / "a", [(0, "complete", "cpu", 6.9, 100.0)])
    make_runs(tmp_path / "b", [(0, "complete", "cpu", 6.8, 100.0)])
    shutil.copy(tmp_path / "b" / "seed0.txt", tmp_path / "a" / "seed0-rerun.txt")
    [g] = collect_runs([str(tmp_path / "a")])
    assert g.warnings() == ["seed 0 appears in 2 runs"]


def test_bad_paths_are_errors(tmp_path):
    write(tmp_path / "notes.md", "hello\n")
    with pytest.raises(SpeedrunError, match="not a training log"):
        collect_runs([str(tmp_path / "notes.md")])
    with pytest.raises(SpeedrunError, match="holds no training logs"):
        collect_runs([str(tmp_path)])
    (tmp_path / "outer" / "baseline").mkdir(parents=True)
    (tmp_path / "outer" / "this_pr").mkdir()
    with pytest.raises(SpeedrunError) as refused:
        collect_runs([str(tmp_path / "outer")])
    assert str(refused.value).endswith(f"its subfolders may hold them: pass {tmp_path / 'outer' / '*'} (one group "
                                       "per subfolder: baseline, this_pr)")
    with pytest.raises(SpeedrunError, match="no such file"):
        collect_runs([str(tmp_path / "nope")])


def test_stats_cli_json_markdown_and_table(tmp_path, capsys):
    base = tmp_path / "baseline"
    make_runs(base, [(0, "complete", "cpu", 6.90, 100.0), (1, "complete", "cpu", 6.96, 102.0),
                     (2, "complete", "cpu", 6.87, 98.0), (3, "diverged", "cpu", 6.9, 100.0)])
    one = tmp_path / "single"
    make_runs(one, [(0, "complete", "cpu", 6.5, 100.0)])
    out_json, md = tmp_path / "stats" / "summary.json", tmp_path / "stats"
    argv = ["stats", str(base), str(one), "--target", "7", "--alpha", "0.05", "--json", "--json-out", str(out_json),
            "--markdown-dir", str(md)]
    assert cli.main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out_json.read_text())
    g = printed[0]
    for key in ("group", "n", "steps", "val_loss_mean", "val_loss_std", "p_value", "target", "train_time_mean_s",
                "train_time_std_s", "runs"):
        assert key in g
    assert (g["group"], g["n"], g["steps"], g["target"]) == (str(base), 3, 4, 7.0)
    assert [set(r) >= {"file", "val_loss", "train_time_ms", "steps", "status"} for r in g["runs"]] == [True] * 4
    assert printed[1]["p_value"] is None and "at least 2" in printed[1]["p_value_reason"]
    losses, times = np.array([6.90, 6.96, 6.87]), np.array([400.0, 408.0, 392.0]) / 1000
    ref = sps.ttest_1samp(losses, 7.0, alternative="less")
    line = (f"n=3 val_loss={losses.mean():.4f}±{losses.std(ddof=1):.4f} t={ref.statistic:.3f} "
            f"p(mean<7)={ref.pvalue:.4g} time={times.mean():.2f}±{times.std(ddof=1):.2f}s")
    text = (md / "baseline" / "statistics.md").read_text()
    assert line in text
    assert "| seed0 | 6.9000 | 400ms |" in text and "| seed3 | diverged | 4 |" not in text
    assert re.search(r"^\| seed3 \| diverged \| 2 \| run diverged: non-finite train_loss at step 2 \|$", text, re.M)
    assert (md / "single" / "statistics.md").is_file()
    assert cli.main(["stats", str(base), "--target", "7"]) == 0
    table = capsys.readouterr().out
    assert re.search(rf"^{re.escape(str(base))}\s+3\s+4\s+6\.9100 ± 0\.0458\s+{ref.pvalue:.4g}\s+\d+ / \d+\s+"
                     r"0\.40 ± 0\.01\s+1 diverged$", table, re.M)
    assert "diverged: " in table


def test_stats_table_names_skipped_log_files_with_their_reason(tmp_path, capsys):
    base = tmp_path / "runs"
    make_runs(base, [(0, "complete", "cpu", 6.90, 100.0), (1, "complete", "cpu", 6.95, 101.0)])
    (base / "killed.txt").write_bytes(b"")                                   # killed before writing anything
    write(base / "header_only.log", "torchrun output\n" + SEP + "\nsome header, no metrics\n")
    (base / "old.txt.gz").write_bytes(gzip.compress((base / "seed0.txt").read_bytes()))
    write(base / "README.md", "# notes\n")
    write(base / "notes.csv", "a,b\n1,2\n")
    assert cli.main(["stats", str(base), "--target", "7"]) == 0
    out = capsys.readouterr().out
    skipped = [line for line in out.splitlines() if line.startswith("skipped: ")]
    assert skipped == [f"skipped: {base / 'header_only.log'}: not a training log (no 'speedrun:' header, no step:/s: "
                       "lines, no line of 100 '=' followed by step: or 'Running Python' lines)",
                       f"skipped: {base / 'killed.txt'}: empty file (a run killed before it wrote anything?)",
                       f"skipped: {base / 'old.txt.gz'}: gzip-compressed: decompress it to read it as a log"]
    assert out.index("skipped: ") > out.index(str(base))                      # after the table's row
    [g] = collect_runs([str(base)])                                           # every skipped file has a reason
    assert dict(zip(g.skipped, g.skip_reasons))[str(base / "README.md")].startswith("not a training log")
    assert len(g.skipped) == len(g.skip_reasons) == 5 and len(g.runs) == 2


def test_summary_json_gives_each_skipped_file_its_reason(tmp_path, capsys):
    """summary.json keeps `skipped_files` (a list of paths) and adds `skip_reasons` (path -> reason), the reasons
    the console prints as `skipped: <path>: <reason>`."""
    base = tmp_path / "runs"
    make_runs(base, [(0, "complete", "cpu", 6.90, 100.0), (1, "complete", "cpu", 6.95, 101.0)])
    (base / "killed.txt").write_bytes(b"")
    (base / "old.txt.gz").write_bytes(gzip.compress((base / "seed0.txt").read_bytes()))
    write(base / "README.md", "# notes\n")
    out = tmp_path / "summary.json"
    assert cli.main(["stats", str(base), "--target", "7", "--json-out", str(out)]) == 0
    printed = capsys.readouterr().out
    [s] = json.loads(out.read_text())
    assert s["skipped_files"] == [str(base / "README.md"), str(base / "killed.txt"), str(base / "old.txt.gz")]
    assert s["skip_reasons"] == {str(base / "README.md"): "not a training log or parsed-run .json: a .md file",
                                 str(base / "killed.txt"): "empty file (a run killed before it wrote anything?)",
                                 str(base / "old.txt.gz"): "gzip-compressed: decompress it to read it as a log"}
    for file in ("killed.txt", "old.txt.gz"):
        assert f"skipped: {base / file}: {s['skip_reasons'][str(base / file)]}" in printed.splitlines()


def test_stats_cli_error_is_one_line(tmp_path, capsys):
    assert cli.main(["stats", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.startswith("speedrun stats: error: ")


def test_run_label():
    assert run_label("x/02ed0a75-0663-4f02-b24b-8909571aaf21.txt") == "02ed0a75"
    assert run_label("x/seed3.txt") == "seed3" and run_label("x/NorMuon") == "NorMuon"


# ---------------------------------------------------------------------------------------------------------
# The published figures (PUBLISHED.md and the records' statistics.md), recomputed from the reference logs.

def published_rows():
    path = REFERENCE / "PUBLISHED.md"
    if not path.is_file():
        return []
    rows = re.findall(r"^\| (\d{4}-\S+?)(?:, runs of (\d+) steps)? \| (.+?) \|$", path.read_text(), re.M)
    return [(name, [c.strip() for c in rest.split("|")]) for name, _, rest in rows]


def close_to_printed(value: float, printed: str) -> bool:
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return abs(value - float(printed)) <= 0.5 * 10 ** -decimals + 1e-12


@needs_reference
@pytest.mark.parametrize("directory, cells", published_rows(), ids=lambda x: x if isinstance(x, str) else "")
def test_published_statistics_are_reproduced(directory, cells):
    n, steps, mean, std, p, time_mean, time_std = cells
    results = compute_stats([str(REFERENCE / directory)], target=3.28)
    [s] = [s for s in results if s.group.steps == int(steps)]
    out = s.to_json()
    assert out["n"] == int(n)
    assert close_to_printed(out["val_loss_mean"], mean) and close_to_printed(out["val_loss_std"], std)
    assert close_to_printed(out["p_value"], p)
    assert close_to_printed(out["train_time_mean_s"], time_mean) and close_to_printed(out["train_time_std_s"], time_std)
    if len(results) > 1:
        assert s.group.name == f"{REFERENCE / directory} [{steps} steps]" and "step counts differ" in s.group.split_reason


@needs_reference
def test_published_rows_were_found():
    assert len(published_rows()) == 7


@needs_reference
@pytest.mark.parametrize("group", ["baseline", "pr299"])
def test_statistics_md_tables_match_the_published_ones(group):
    folder = REFERENCE / "2026-05-20_BigramsSignTrick" / group
    published = (folder / "statistics.md").read_text()
    [s] = compute_stats([str(folder)])
    ours = statistics_markdown(s)
    table_rows = [line for line in published.splitlines() if re.match(r"^\| (val_loss|train_time \(ms\)|[0-9a-f]{8}) \|", line)]
    assert len(table_rows) == len(list(folder.glob("*.txt"))) + 2
    for line in table_rows:
        assert line in ours.splitlines()


@needs_reference
def test_truncated_run_is_listed_not_counted():
    [s] = compute_stats([str(REFERENCE / "2026-01-30_MimeticValueOutput" / "runs")])
    out = s.to_json()
    assert out["n"] == 7 and out["incomplete"] == {"truncated": 1}
    assert [r["file"].split("/")[-1][:8] for r in out["runs"] if r["status"] == "truncated"] == ["6037e443"]


# ---------------------------------------------------------------------------------------------------------
# Code versions, loss-curve duplicates, too few runs, runs needed.

def test_code_versions_are_pooled_and_shown_or_split_on_request(tmp_path, capsys):
    d = tmp_path / "mixed"
    for seed, commit in ((0, "a" * 40), (1, "a" * 40), (2, "b" * 40)):
        text, _ = our_log(seed=seed, losses=[10.8, 9.0, 8.0, 7.5, 6.9 + seed / 100],
                          header={"git_commit": commit, "git_dirty": "false"})
        write(d / f"seed{seed}.txt", text)
    [pooled] = collect_runs([str(d)])
    assert pooled.split_reason is None and len(pooled.counted) == 3 and len(pooled.code_versions) == 2
    assert any(w.startswith("2 code versions pooled") and "x2" in w and "x1" in w for w in pooled.warnings())
    split = collect_runs([str(d)], code_split="split")
    assert [len(g.runs) for g in split] == [2, 1]
    reason = split[0].split_reason
    assert "code versions differ (" in reason and "2 runs of code" in reason and "1 run of code" in reason
    hashes = [g.runs[0].code_hash[:8] for g in split]
    assert [g.name for g in split] == [f"{d} [code {h}]" for h in hashes]
    assert cli.main(["stats", str(d), "--target", "7", "--split-code"]) == 0
    out = capsys.readouterr().out
    assert "split: " in out and "code versions differ" in out


def test_identical_loss_curves_count_once(tmp_path):
    d = tmp_path / "d"
    make_runs(d, [(0, "complete", "cpu", 6.9, 100.0), (1, "complete", "cpu", 6.8, 100.0)])
    text, _ = our_log(seed=2, losses=[10.8, 9.0, 8.0, 7.5, 6.9], step_ms=120.0)  # seed0's curve, other timings
    write(d / "seed2.txt", text)
    [g] = collect_runs([str(d)])
    assert len(g.counted) == 2
    assert g.duplicates == {str(d / "seed2.txt"): str(d / "seed0.txt")}
    assert g.duplicate_kinds == {str(d / "seed2.txt"): "identical loss curve"}
    s = group_stats(g, 7.0).to_json()
    assert s["duplicate_kinds"] == {str(d / "seed2.txt"): "identical loss curve"}
    assert [r["duplicate_kind"] for r in s["runs"]] == [None, None, "identical loss curve"]
    assert "duplicate (identical loss curve), counted once" in console_table(g)


def test_a_copy_of_a_diverged_log_is_listed_once_with_both_reasons(tmp_path):
    """statistics.md lists the copy of a diverged log among the runs not counted, with its status and reason and
    the run it repeats, and not among the duplicates counted once (it counts zero times); runs in file order."""
    d = tmp_path / "d"
    make_runs(d, [(0, "complete", "cpu", 6.9, 100.0), (1, "complete", "cpu", 6.8, 100.0),
                  (3, "diverged", "cpu", 6.9, 100.0)])
    (d / "seed0_copy.txt").write_bytes((d / "seed0.txt").read_bytes())
    (d / "seed3_copy.txt").write_bytes((d / "seed3.txt").read_bytes())
    [g] = collect_runs([str(d)])
    md = statistics_markdown(group_stats(g, 7.0)).splitlines()
    diverged = "run diverged: non-finite train_loss at step 2"
    start = md.index("## Runs not counted")
    assert md[start + 4:start + 6] == [f"| seed3 | diverged | 2 | {diverged} |",
                                       f"| seed3_copy | diverged, duplicate | 2 | {diverged}; identical file, same "
                                       f"as seed3 |"]
    dups = md.index("## Duplicates (counted once)")
    assert md[dups + 4] == f"| {d / 'seed0_copy.txt'} | {d / 'seed0.txt'} | identical file |"
    assert not md[dups + 5:dups + 6] or not md[dups + 5].startswith("|")      # the only duplicate counted once
    assert sum(f"{d / 'seed3_copy.txt'}" in line or "| seed3_copy |" in line for line in md[start:]) == 1


def console_table(g):
    from speedrun.analysis.tables import stats_table

    return stats_table([group_stats(g, 7.0)])


def test_too_few_runs_are_said_not_bare(tmp_path, capsys):
    make_runs(tmp_path / "two", [(0, "complete", "cpu", 6.5, 100.0), (1, "complete", "cpu", 6.6, 100.0)])
    [s] = compute_stats([str(tmp_path / "two")], target=7.0)
    out = s.to_json()
    ref = sps.ttest_1samp([6.5, 6.6], 7.0, alternative="less").pvalue
    assert out["p_value"] == pytest.approx(ref) and ref < 0.05
    assert out["too_few_runs"] is True and out["p_value_note"] == "too few runs: n=2 < 3"
    assert out["reaches_target"] is None
    md = statistics_markdown(s)
    assert "No verdict: too few runs: n=2 < 3." in md and f"**{ref:.4g}**" not in md
    assert cli.main(["stats", str(tmp_path / "two"), "--target", "7", "--alpha", "0.05"]) == 0
    assert f"{ref:.4g} (too few runs: n=2 < 3)" in capsys.readouterr().out



@pytest.mark.parametrize("spec, verdict", [
    ([(0, "diverged", "cpu", 6.9, 100.0), (1, "diverged", "cpu", 6.9, 100.0)],
     "No verdict: no complete runs (2 diverged)."),
    ([(0, "failed", "cpu", 6.9, 100.0), (1, "failed", "cpu", 6.9, 100.0)], "No verdict: no complete runs (2 failed)."),
    ([(0, "failed", "cpu", 6.9, 100.0), (1, "truncated", "cpu", 6.9, 100.0)],
     "No verdict: no complete runs (1 failed, 1 truncated)."),
    ([(0, "complete", "cpu", 6.5, 100.0), (1, "diverged", "cpu", 6.9, 100.0)],
     "No p-value: n=1: a t-test needs at least 2 complete runs per sample."),
    ([(0, "complete", "cpu", 6.50, 100.0), (1, "complete", "cpu", 6.60, 100.0), (2, "complete", "cpu", 6.55, 100.0)],
     "Mean val_loss is below 7 at p < 0.01."),
])
def test_statistics_md_verdict_says_why_there_is_no_test(tmp_path, spec, verdict):
    make_runs(tmp_path / "v", spec)
    [s] = compute_stats([str(tmp_path / "v")], target=7.0)
    complete = [final for _, end, _, final, _ in spec if end == "complete"]
    if len(complete) == 3:   # the normal case: scipy agrees that it passes
        assert sps.ttest_1samp(complete, 7.0, alternative="less").pvalue < 0.01
    lines = statistics_markdown(s).splitlines()
    assert [line for line in lines if line.startswith(("No ", "Mean val_loss"))] == [verdict]

def exact_sample_p(n, mean, std, target):
    z = np.arange(n) - (n - 1) / 2
    return sps.ttest_1samp(mean + std * z / np.std(z, ddof=1), target, alternative="less").pvalue


def test_runs_needed_in_summary(tmp_path):
    make_runs(tmp_path / "g", [(i, "complete", "cpu", v, 100.0) for i, v in enumerate([6.90, 6.95, 6.85, 6.97])])
    [s] = compute_stats([str(tmp_path / "g")], target=7.0, alpha=0.01)
    out = s.to_json()
    mean, std = out["val_loss_mean"], out["val_loss_std"]
    expected = next(k for k in range(2, 1000) if exact_sample_p(k, mean, std, 7.0) < 0.01)
    assert out["runs_needed"] == expected
    curve = dict(zip(out["p_value_by_n"]["n"], out["p_value_by_n"]["p"]))
    assert curve[4] == pytest.approx(out["p_value"], rel=1e-9)  # at the observed n, the observed p
    assert curve[expected] < 0.01 <= curve[expected - 1]
    assert out["runs_for_power"] >= expected and out["power"] == 0.8
    line = f"Runs needed for p < 0.01: **{expected}**"
    assert line in statistics_markdown(s)


@settings(max_examples=30, deadline=None)
@given(runs_strategy, st.randoms())
def test_runs_needed_ignores_run_order(runs, rnd):
    a, b = stats_in_two_orders(runs, rnd)
    assert (a["runs_needed"], a["runs_for_power"]) == (b["runs_needed"], b["runs_for_power"])


@needs_reference
def test_yarn_code_versions_split_on_request():
    """PUBLISHED.md pools 2025-09-10_Yarn's two code versions (7 runs); --split-code separates 5 and 2."""
    [pooled] = collect_runs([str(REFERENCE / "2025-09-10_Yarn")])
    assert len(pooled.counted) == 7 and any("2 code versions pooled" in w for w in pooled.warnings())
    split = collect_runs([str(REFERENCE / "2025-09-10_Yarn")], code_split="split")
    assert sorted(len(g.counted) for g in split) == [2, 5]
    assert all(g.split_reason and "code versions differ" in g.split_reason for g in split)


@needs_reference
@pytest.mark.parametrize("directory, cells", published_rows(), ids=lambda x: x if isinstance(x, str) else "")
def test_statistics_md_snippet_prints_the_test_line(directory, cells, capsys):
    [s] = [s for s in compute_stats([str(REFERENCE / directory)]) if s.group.steps == int(cells[1])]
    md = statistics_markdown(s)
    code = md.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "statistics.md", "exec"), {})
    printed = capsys.readouterr().out.strip()
    assert printed == re.search(r"^    (n=\d+ val_loss=.*)$", md, re.M)[1]
    assert close_to_printed(float(re.search(r"p\(mean<3\.28\)=(\S+)", printed)[1]), cells[4])


@pytest.mark.parametrize("target", ["-1", "0", "inf", "nan"])
def test_stats_refuses_a_target_that_is_no_val_loss(tmp_path, capsys, target):
    make_runs(tmp_path / "g", [(i, "complete", "cpu", v, 100.0) for i, v in enumerate([6.9, 6.95, 6.85])])
    assert cli.main(["stats", str(tmp_path / "g"), "--target", target]) == 2
    err = capsys.readouterr().err
    assert f"--target {float(target)}: expected a val_loss above 0" in err
    finite = f"; it must be finite, and {float(target)} is not"     # inf and nan are above 0 or not comparable
    assert err.rstrip("\n").endswith(finite) == (target in ("inf", "nan"))


def test_only_counts_the_files_given_and_keeps_the_group_names(tmp_path, capsys, monkeypatch):
    """`speedrun stats baseline candidate --only ...` in the parse folder (as the workflow runs it): the groups
    keep the folders' names and slugs, and a stale run (seed 9, no longer configured) is not read, not even
    listed as skipped."""
    make_runs(tmp_path / "baseline", [(0, "complete", "cpu", 6.90, 100.0), (1, "complete", "cpu", 6.96, 102.0),
                                      (2, "complete", "cpu", 6.87, 98.0), (9, "complete", "cpu", 1.00, 10.0)])
    make_runs(tmp_path / "candidate", [(0, "complete", "cpu", 6.80, 90.0), (9, "diverged", "cpu", 6.9, 90.0)])
    monkeypatch.chdir(tmp_path)
    only = ["baseline/seed0.txt", "baseline/seed1.txt", "baseline/seed2.txt", "candidate/seed0.txt"]
    assert cli.main(["stats", "baseline", "candidate", "--only", *only, "--target", "7", "--json",
                     "--markdown-dir", "stats"]) == 0
    base, cand = json.loads(capsys.readouterr().out)
    assert (base["group"], base["slug"], cand["group"], cand["slug"]) == ("baseline", "baseline", "candidate",
                                                                          "candidate")
    assert [r["file"] for r in base["runs"]] == only[:3] and [r["file"] for r in cand["runs"]] == only[3:]
    assert base["n"] == 3 and base["val_loss_mean"] == pytest.approx(np.mean([6.90, 6.96, 6.87]), abs=1e-12)
    assert base["p_value"] == pytest.approx(sps.ttest_1samp([6.90, 6.96, 6.87], 7.0, alternative="less").pvalue)
    assert cand["n"] == 1 and cand["incomplete"] == {} and base["skipped_files"] == []
    assert sorted(p.parent.name for p in (tmp_path / "stats").glob("*/statistics.md")) == ["baseline", "candidate"]
    [g] = collect_runs(["baseline"], only=only)        # the files of other paths are left alone
    assert len(g.runs) == 3
    with pytest.raises(SpeedrunError, match="--only candidate/seed0.txt: not a file of the paths given"):
        compute_stats(["baseline"], only=only)
    with pytest.raises(SpeedrunError, match="--only baseline/seed5.txt: no such file"):
        compute_stats(["baseline"], only=["baseline/seed5.txt"])


# ---------------------------------------------------------------------------------------------------------
# Skipped files, file names, grouping of files named one by one.

def test_a_corrupt_parsed_run_json_is_named_on_the_console(tmp_path, capsys):
    """A parsed-run .json cut short lowers n: the console says which file and why (not only summary.json); the
    metrics CSVs beside the JSONs are skipped quietly, with a reason that says what they are."""
    from speedrun.analysis.parsed_files import parse_to_files

    logs = make_runs(tmp_path / "train", [(i, "complete", "cpu", v, 100.0) for i, v in enumerate([6.9, 6.95, 6.85])])
    parse = tmp_path / "parse"
    for log in logs:
        parse_to_files(str(log), str(parse / f"{log.stem}.csv"), str(parse / f"{log.stem}.json"))
    corrupt = parse / "seed1.json"
    corrupt.write_bytes(corrupt.read_bytes()[:100])
    with pytest.raises(json.JSONDecodeError) as info:
        json.loads(corrupt.read_bytes())
    assert cli.main(["stats", str(parse), "--target", "7"]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"^{re.escape(str(parse))}\s+2\s", out, re.M)       # n = 2 of 3
    skipped = [line for line in out.splitlines() if line.startswith("skipped: ")]
    assert skipped == [f"skipped: {corrupt}: not valid JSON ({info.value})"]
    [g] = collect_runs([str(parse)])
    csv_reason = "not a training log or parsed-run .json: a .csv file; stats reads the parsed run's .json beside it"
    assert dict(zip(g.skipped, g.skip_reasons)) == {str(parse / f"seed{i}.csv"): csv_reason for i in range(3)} | {
        str(corrupt): f"not valid JSON ({info.value})"}


def test_a_file_named_explicitly_that_is_no_run_is_said_once(tmp_path):
    """The error names the file and says what it is, once (not "not a training log or parsed-run .json (not a
    training log (...))")."""
    notes, text = write(tmp_path / "notes.md", "hello\n"), write(tmp_path / "notes.txt", "hello\n")
    with pytest.raises(SpeedrunError) as info:
        collect_runs([str(notes)])
    assert str(info.value) == f"{notes}: not a training log or parsed-run .json: a .md file"
    with pytest.raises(SpeedrunError) as info:
        collect_runs([str(text)])
    assert str(info.value) == (f"{text}: not a training log (no 'speedrun:' header, no step:/s: lines, no line of "
                               "100 '=' followed by step: or 'Running Python' lines)")
    ps = tmp_path / "ps.txt"
    ps.write_bytes(b"\xff\xfe" + our_log()[0].encode("utf-16-le"))     # what PowerShell's `>` writes
    with pytest.raises(SpeedrunError, match=re.escape(f"{ps}: UTF-16 text (byte-order mark FF FE")):
        collect_runs([str(ps)])


def test_a_file_name_that_is_not_utf8_is_written_escaped(tmp_path, capsys):
    """`caf\\xe9.txt` (a Latin-1 name, held by Python as the lone surrogate \\udce9): statistics.md and the
    console name it with a backslash escape, instead of failing halfway with an empty folder left behind."""
    base = tmp_path / "runs"
    make_runs(base, [(i, "complete", "cpu", v, 100.0) for i, v in enumerate([6.9, 6.95, 6.85])])
    name = os.fsdecode(b"caf\xe9.txt")
    assert name == "caf\udce9.txt"
    try:
        os.rename(base / "seed0.txt", base / name)
    except (OSError, UnicodeEncodeError) as e:
        pytest.skip(f"this file system refuses a non-UTF-8 name: {e}")
    shutil.copy(base / name, base / os.fsdecode(b"z\xe9.txt"))          # a duplicate: named in a note
    out = tmp_path / "md"
    assert cli.main(["stats", str(base), "--target", "7", "--markdown-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"counted once: {base}/z\\xe9.txt = {base}/caf\\xe9.txt" in printed
    md = (out / "runs" / "statistics.md").read_bytes().decode("utf-8")
    assert "| caf\\xe9 | 6.9000 | 400ms |" in md.splitlines()
    assert "\udce9" not in md


def test_files_named_one_by_one_are_grouped_by_their_folder_as_the_help_says(tmp_path, capsys):
    """`speedrun stats DIR/*.txt` is the group DIR, as `speedrun stats DIR`: files of one folder form one group,
    files of two folders two groups; the help text and docs/formats.md say so."""
    make_runs(tmp_path / "a", [(i, "complete", "cpu", v, 100.0) for i, v in enumerate([6.9, 6.95, 6.85])])
    make_runs(tmp_path / "b", [(0, "complete", "cpu", 6.8, 100.0)])
    files = sorted(map(str, (tmp_path / "a").glob("*.txt"))) + [str(tmp_path / "b" / "seed0.txt")]
    groups = collect_runs(files)
    assert [(g.name, len(g.runs)) for g in groups] == [(str(tmp_path / "a"), 3), (str(tmp_path / "b"), 1)]
    a, b = compute_stats(files, 7.0)
    assert (a.val_loss.n, b.val_loss.n) == (3, 1)
    assert "3 complete runs, step 4/4." in statistics_markdown(a).splitlines()
    assert "1 complete run, step 4/4." in statistics_markdown(b).splitlines()      # not "1 complete runs"
    parser, subparsers = cli.build_parser()
    stats_stage.add_arguments(subparsers["stats"])
    help_text = " ".join(subparsers["stats"].format_help().split())
    assert "each directory is one group, and files named one by one are grouped by their folder" in help_text
    assert "(one group each)" not in help_text
    doc = " ".join((Path(__file__).resolve().parents[1] / "docs" / "formats.md").read_text().split())
    assert "are grouped by their folder: `speedrun stats DIR/*.txt` is the group `DIR`" in doc
    assert "each path given to `speedrun stats` (a log, a parsed-run `.json`, or a directory of them) is a group" \
        not in doc


@needs_reference
def test_a_crlf_copy_of_a_public_log_keeps_its_code_version(tmp_path):
    """2025-12-14_PartialKeyOffset with one log saved with Windows line endings: still the published 2 code
    versions (10 + 1), not 3, and the same figures."""
    source = REFERENCE / "2025-12-14_PartialKeyOffset"
    shutil.copytree(source, tmp_path / "pko")
    first = sorted((tmp_path / "pko").glob("*.txt"))[0]
    first.write_bytes(first.read_bytes().replace(b"\n", b"\r\n"))
    [original] = compute_stats([str(source)])
    [crlf] = compute_stats([str(tmp_path / "pko")])
    assert crlf.group.code_versions == original.group.code_versions and len(original.group.code_versions) == 2
    assert sorted(original.group.code_versions.values()) == [1, 10]
    assert (crlf.val_loss.n, crlf.val_loss.mean, crlf.test.p_value) == \
           (original.val_loss.n, original.val_loss.mean, original.test.p_value)


def _reference_logs() -> Path:
    """The public logs: ../shared/reference-logs, or the folder SPEEDRUN_REFERENCE_LOGS names."""
    return Path(os.environ.get("SPEEDRUN_REFERENCE_LOGS", REFERENCE))


def test_many_paths_skip_what_holds_no_logs_with_a_note(tmp_path, capsys):
    (tmp_path / "outer" / "baseline").mkdir(parents=True)          # subfolders only
    readme = write(tmp_path / "README.md", "# runs\n")
    runs = tmp_path / "runs"
    for seed in range(3):
        write(runs / f"seed{seed}.txt", our_log(seed=seed, losses=[10.8, 9.0, 8.0, 7.5, 7.0 + seed / 100])[0])
    rc = cli.main(["stats", str(tmp_path / "outer"), str(readme), str(runs), "--target", "7.5", "--json"])
    assert rc == 0
    out, err = capsys.readouterr()
    assert [g["group"] for g in json.loads(out)] == [str(runs)]
    assert err.splitlines() == [
        f"speedrun stats: note: skipped {tmp_path / 'outer'}: holds no training logs or parsed-run .json files; "
        f"its subfolders may hold them: pass {tmp_path / 'outer' / '*'} (one group per subfolder: baseline)",
        f"speedrun stats: note: skipped {readme}: not a training log or parsed-run .json: a .md file"]
    assert cli.main(["stats", str(tmp_path / "outer"), str(readme)]) == 2      # nothing left: the first error
    assert capsys.readouterr().err == (f"speedrun stats: error: {tmp_path / 'outer'}: holds no training logs or "
                                       "parsed-run .json files; its subfolders may hold them: pass "
                                       f"{tmp_path / 'outer' / '*'} (one group per subfolder: baseline)\n")


@pytest.mark.skipif(not _reference_logs().is_dir(), reason="the public reference logs are absent")
def test_stats_over_every_reference_folder_skips_the_md_files_and_the_folders_of_folders(capsys):
    paths = sorted(str(p) for p in _reference_logs().iterdir())
    assert cli.main(["stats", *paths, "--json"]) == 0
    out, err = capsys.readouterr()
    groups = {g["path"] for g in json.loads(out)}
    notes = err.splitlines()
    assert all(line.startswith("speedrun stats: note: skipped ") for line in notes)
    skipped = {line.split("skipped ", 1)[1].split(": ", 1)[0] for line in notes}
    assert str(_reference_logs() / "PUBLISHED.md") in skipped
    assert str(_reference_logs() / "2026-05-20_BigramsSignTrick") in skipped      # baseline/ and pr299/ only
    assert groups and not groups & skipped and groups | skipped == set(paths)


def test_equal_train_times_have_a_std_of_exactly_zero_in_any_order():
    """Hypothesis once drew three runs of 178811.625 ms: numpy's std of the seconds was not 0."""
    runs = [(3.25, 178811.625), (3.25, 178811.625), (3.375, 178811.625)]
    for rnd in (random.Random(0), random.Random(1)):
        a, b = stats_in_two_orders(runs, rnd)
        assert a["train_time_std_s"] == 0.0 and b["train_time_std_s"] == 0.0
        assert a["train_time_mean_s"] == pytest.approx(178.811625, rel=1e-15)

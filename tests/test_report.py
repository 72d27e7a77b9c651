"""The report stage: tables from the earlier stages' files, and the plots."""

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from speedrun import report
from speedrun.analysis import report_plots
from speedrun.analysis.report_inputs import (check_baseline, counted, load_runs, read_comparison, read_records,
                                             report_settings)
from speedrun.analysis.report_plots import (plot_distributions, plot_final_val_loss, plot_p_value_by_n, plot_val_loss,
                                           plot_val_loss_band, val_loss_bands)
from speedrun.analysis.report_tables import render_summary
from speedrun.errors import SpeedrunError


def _write_run(folder, seed, status, losses, final=None, time_ms=None, steps=None, **provenance):
    """A parsed run of validations every 10 steps (``losses``) that stopped at the last; ``steps``: scheduled
    (default: the last validation's step, a complete run)."""
    folder.mkdir(parents=True, exist_ok=True)
    last = 10 * (len(losses) - 1)
    rows = [{"step": 10 * i, "total_steps": steps or last, "kind": "val", "train_loss": None,
             "val_loss": loss, "train_time_ms": 100.0 * i, "step_avg_ms": 10.0} for i, loss in enumerate(losses)]
    pd.DataFrame(rows).to_csv(folder / f"seed{seed}.csv", index=False)
    record = {"file": f"{folder.name}/seed{seed}.txt", "status": status, "seed": seed,
              "steps": steps or last, "last_step": last, "val_loss": final, "train_time_ms": time_ms, **provenance}
    path = folder / f"seed{seed}.json"
    path.write_text(json.dumps(record))
    return path


@pytest.fixture
def paths(tmp_path):
    prov = {"git_commit": "0123456789abcdef", "git_dirty": True, "train_data_sha256": "ab" * 32,
            "versions": {"python": "3.11.7", "torch": "2.5.0"}}
    return [
        _write_run(tmp_path / "baseline", 0, "complete", [10.8, 7.0, 6.1], 6.1, 61000.0, **prov),
        _write_run(tmp_path / "baseline", 1, "complete", [10.8, 7.1, 6.3], 6.3, 63000.0, **prov),
        _write_run(tmp_path / "baseline", 2, "complete", [10.8, 7.0, 6.1], 6.1, 61500.0, **prov),
        _write_run(tmp_path / "candidate", 0, "complete", [10.8, 6.8, 5.9], 5.9, 60000.0),
        _write_run(tmp_path / "candidate", 1, "diverged", [10.8, float("nan")], None, None, steps=20),
    ]


@pytest.fixture
def runs(paths):
    return load_runs(paths)


def test_load_runs_takes_variant_from_folder_and_seconds_from_ms(runs):
    table, curves = runs
    assert list(table["variant"]) == ["baseline"] * 3 + ["candidate"] * 2
    assert table.loc[0, "train_time_s"] == pytest.approx(61.0)
    assert list(table["status"]) == ["complete"] * 4 + ["diverged"]
    assert len(curves) == 3 * 4 + 2
    assert set(curves.columns) >= {"variant", "seed", "step", "val_loss", "run"}
    assert list(curves.loc[curves["run"] == 4, "seed"]) == [1, 1]


def test_missing_or_bad_metrics_file_is_named(tmp_path):
    path = _write_run(tmp_path / "v", 0, "complete", [1.0, 0.5], 0.5, 1.0)
    (tmp_path / "v" / "seed0.csv").write_text("a,b\n1,2\n")
    with pytest.raises(SpeedrunError, match="seed0.csv: lacks column"):
        load_runs([path])
    (tmp_path / "v" / "seed0.csv").unlink()
    with pytest.raises(SpeedrunError, match="seed0.csv"):
        load_runs([path])


SUMMARY = [
    {"group": "baseline", "path": "baseline", "n": 3, "steps": 20, "val_loss_mean": 6.2, "val_loss_std": 0.1414,
     "p_value": 0.0032, "p_value_note": None, "reaches_target": True, "runs_needed": 3, "runs_for_power": 4,
     "power": 0.8, "train_time_mean_s": 62.0, "train_time_std_s": 1.41, "warnings": ["seed 0 appears in 2 runs"],
     "duplicates": {"baseline/seed2.txt": "baseline/seed0.txt"},
     "p_value_by_n": {"n": [2, 3, 4, 5], "p": [0.2, 0.0032, 0.001, 0.0004]}},
    {"group": "candidate", "path": "candidate", "n": 1, "steps": 20, "val_loss_mean": 5.9, "val_loss_std": None,
     "p_value": None, "p_value_note": "n=1: a t-test needs at least 2 complete runs per sample",
     "reaches_target": None, "runs_needed": None, "train_time_mean_s": 60.0, "train_time_std_s": None},
]
COMPARISON = {"candidate": "candidate", "baseline": "baseline", "n_baseline": 3, "n_candidate": 3,
              "val_loss": {"difference": -0.3, "ci_low": -0.5, "ci_high": -0.1, "p_value": 0.02},
              "train_time": {"difference": -2.0, "ci_low": -4.0, "ci_high": 0.0, "p_value": 0.04},
              "speedup": {"seconds": 2.0, "percent": 3.2},
              "rules": [{"rule": "train data", "status": "unknown", "detail": "not recorded"},
                        {"rule": "GPUs", "status": "violation", "detail": "GPU model and count differs"}],
              "warnings": ["rule violated: GPUs: GPU model and count differs"]}


def test_summary_lists_warnings_verdicts_rules_runs_and_provenance(runs, paths):
    table, _ = runs
    text = render_summary(SUMMARY, [COMPARISON], table, "baseline", 6.5, 0.01, read_records(paths))
    warnings = text.split("## Warnings", 1)[1].split("## Variants", 1)[0]
    assert "- candidate vs baseline: rule violated: GPUs: GPU model and count differs" in warnings
    assert "- baseline: seed 0 appears in 2 runs" in warnings
    assert "| baseline | 3 | 20 | 6.2000 | 0.1414 | 0.0032 | yes | 3 / 4 | 62.00 | 1.41 |" in text
    note = "n=1: a t-test needs at least 2 complete runs per sample"
    assert f"| candidate | 1 | 20 | 5.9000 | – | – ({note}) | – | – |" in text
    assert "-0.3000 [-0.5000, -0.1000]" in text
    assert "| **1 violated** | no: target not decided, not faster (p=0.04), rules violated |" in text
    assert "| GPUs | **VIOLATION** | GPU model and count differs |" in text
    assert "candidate seed 1 (diverged)" in text and "**1 incomplete run(s)**" in text
    provenance = text.split("## Provenance", 1)[1]
    assert "| baseline seed0 | 0 | 0123456789+dirty | abababababab | 3.11.7 | 2.5.0 |" in provenance
    assert "| candidate seed0 | 0 | – | – | – | – |" in provenance


def test_summary_from_older_files_without_new_keys(runs):
    table, _ = runs
    old = [{k: v for k, v in g.items() if k in ("group", "n", "steps", "val_loss_mean", "val_loss_std", "p_value",
                                                "train_time_mean_s", "train_time_std_s")} for g in SUMMARY]
    text = render_summary(old, [], table, "baseline", 6.5, 0.01)
    assert "| baseline | 3 | 20 | 6.2000 | 0.1414 | 0.0032 | yes | – |" in text
    assert "## Provenance" not in text
    assert ("No comparison was given (`--comparisons`: the .json files of `speedrun compare`): candidate is not "
            "tested against the baseline.") in text


def test_counted_drops_incomplete_runs_and_duplicates(runs):
    table, _ = runs
    assert list(counted(table, SUMMARY)) == [True, True, False, True, False]


def test_val_loss_bands_against_numpy(runs):
    table, curves = runs
    bands = val_loss_bands(curves[curves["run"].map(counted(table, SUMMARY))])
    base = bands[bands["variant"] == "baseline"].set_index("step")
    assert list(base["n"]) == [2, 2, 2]
    assert base.loc[20, "mean"] == pytest.approx(np.mean([6.1, 6.3]))
    assert base.loc[20, "std"] == pytest.approx(np.std([6.1, 6.3], ddof=1))
    assert (base.loc[10, "min"], base.loc[10, "max"]) == (7.0, 7.1)
    cand = bands[bands["variant"] == "candidate"]
    assert list(cand["n"]) == [1, 1, 1] and math.isnan(cand["std"].iloc[0])
    assert list(bands["variant"]) == ["baseline"] * 3 + ["candidate"] * 3


def png_ok(path):
    data = path.read_bytes()
    return data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_plots_are_png_files(runs, tmp_path):
    table, curves = runs
    mask = counted(table, SUMMARY)
    plot_val_loss(curves, tmp_path / "a.png", target=6.5, zoom_last_fraction=0.5)
    plot_final_val_loss(table, tmp_path / "b.png", target=6.5)
    plot_val_loss_band(val_loss_bands(curves[curves["run"].map(mask)]), tmp_path / "c.png", 6.5, 0.5)
    plot_distributions(table[mask], tmp_path / "d.png", target=6.5)
    plot_p_value_by_n(SUMMARY, tmp_path / "e.png", alpha=0.01)
    plot_p_value_by_n(SUMMARY[1:], tmp_path / "f.png", alpha=0.01)  # no group with a curve: a labelled empty plot
    for name in "abcdef":
        assert png_ok(tmp_path / f"{name}.png"), name
    assert not list(tmp_path.glob(".tmp-*"))


def test_a_run_that_diverged_early_stays_out_of_the_zoomed_panel(tmp_path, monkeypatch):
    """Two complete runs of 60 scheduled steps and one that diverged after step 2 (its step-0 loss 10.83): the
    zoomed panel shows the last half of the scheduled steps, where the diverged run logged nothing, so its
    axes span the complete runs' losses only; a run without scheduled steps is zoomed on what it logged."""
    saved = []
    monkeypatch.setattr(report_plots, "_save", lambda fig, out: saved.append(fig))
    rows = [("baseline", run, step, 10.83 - step * 0.1 - run * 0.01) for run in (0, 1) for step in range(0, 61, 10)]
    rows += [("wild", 2, 0, 10.83), ("wild", 2, 2, 10.9)]
    curves = pd.DataFrame(rows, columns=["variant", "run", "step", "val_loss"])
    plot_val_loss(curves, tmp_path / "v.png", target=4.5, zoom_last_fraction=0.5,
                  scheduled=pd.Series([60, 60, 60]))
    zoomed = saved[0].axes[1]
    assert [len(line.get_xdata()) for line in zoomed.get_lines() if line.get_marker() == "."] == [4, 4]
    assert zoomed.get_ylim()[1] < 8.0 and zoomed.get_xlim()[0] > 20
    plot_val_loss(curves, tmp_path / "v.png", target=4.5, zoom_last_fraction=0.5)    # own logged steps
    assert [len(line.get_xdata()) for line in saved[1].axes[1].get_lines() if line.get_marker() == "."] == [4, 4, 1]


def test_main_writes_every_output(paths, tmp_path, capsys):
    (tmp_path / "summary.json").write_text(json.dumps(SUMMARY))
    (tmp_path / "cmp.json").write_text(json.dumps(COMPARISON))
    out = tmp_path / "report"
    args = argparse.Namespace(runs=[str(p) for p in paths], summary=str(tmp_path / "summary.json"),
                              comparisons=[str(tmp_path / "cmp.json")], baseline="baseline", target=6.5,
                              alpha=0.01, zoom_last_fraction=0.5, out_dir=str(out),
                              describe=["baseline=our model, preset tiny", "candidate=script t.py (sha256 0123)"],
                              replicates=["candidate"])
    assert report.main(args) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith(f"report written to {out.resolve()}/")
    assert printed[1:] == ["baseline: 3 counted runs, val_loss 6.2000 ± 0.1414, p=0.0032: reaches the target 6.5",
                           printed[2], "candidate against baseline: no: target not decided, not faster (p=0.04), "
                           "rules violated"] and printed[2].startswith("candidate: 1 counted runs")
    assert ("What each variant runs:\n\n- baseline: our model, preset tiny\n- candidate: script t.py (sha256 0123)"
            "\n\ncandidate: each seed is a replicate.") in (out / "summary.md").read_text()
    for name in ("val_loss.png", "val_loss_band.png", "final_val_loss.png", "distributions.png", "p_value_by_n.png"):
        assert png_ok(out / name), name
    written = pd.read_csv(out / "runs.csv")
    assert list(written["counted"]) == [True, True, False, True, False]
    assert list(written["duplicate_of"].fillna("")) == ["", "", "baseline/seed0.txt", "", ""]
    text = (out / "summary.md").read_text()
    assert "## Provenance" in text
    # the duplicate is marked in its row and listed as not counted, as statistics.md and compare do
    assert "| baseline | 2 | complete, duplicate of seed0 | 6.1000 | 61.50 | 20 |" in text
    assert "**1 duplicate run(s)**, not counted: baseline seed 2 (of seed0)" in text
    assert "| baseline | 0 | complete | 6.1000 | 61.00 | 20 |" in text
    # a diverged run shows where it stopped, not only the steps it was scheduled for
    assert "| candidate | 1 | diverged | – | – | 10 of 20 |" in text
    assert list(written["steps"]) == [20] * 5 and list(written["last_step"]) == [20, 20, 20, 20, 10]


def test_console_lines_give_each_variants_verdict_and_each_candidates_in_plain_text():
    """The lines `speedrun report` prints for the terminal (the last lines of a workflow): the variants
    table's verdict with its numbers, the runs not counted by status, and the comparison's verdict without the
    report's markdown."""
    from speedrun.analysis.report_tables import console_lines

    short = {**SUMMARY[0], "group": "short", "reaches_target": False, "p_value": 0.03, "runs_needed": 5,
             "incomplete": {"diverged": 1, "failed": 0}}
    assert console_lines([SUMMARY[0], short, SUMMARY[1]], [COMPARISON], 6.5, 0.01) == [
        "baseline: 3 counted runs, val_loss 6.2000 ± 0.1414, p=0.0032: reaches the target 6.5",
        "short: 3 counted runs, val_loss 6.2000 ± 0.1414, p=0.03: does not reach the target 6.5 (5 runs would, "
        "at this mean and std); not counted: 1 diverged",
        "candidate: 1 counted runs, val_loss 5.9000 ± –, p=– (n=1: a t-test needs at least 2 complete runs per "
        "sample): target not decided",
        "candidate against baseline: no: target not decided, not faster (p=0.04), rules violated"]
    clean = {**COMPARISON, "rules": []}
    assert console_lines([{**SUMMARY[1], "reaches_target": True}], [clean], 6.5, 0.05)[-1] == \
        "candidate against baseline: yes"


def test_a_candidate_beats_the_baseline_only_when_it_reaches_the_target_faster_within_the_rules():
    from speedrun.analysis.report_tables import comparison_verdict

    clean = {**COMPARISON, "rules": [{"rule": "GPUs", "status": "ok", "detail": ""}]}
    assert comparison_verdict(clean, True, 0.05) == "**yes**"
    assert comparison_verdict(clean, True, 0.01) == "no: not faster (p=0.04)"
    assert comparison_verdict(clean, False, 0.05) == "no: does not reach the target"
    assert comparison_verdict({**clean, "train_time": {}}, True, 0.05) == ("no: speed not compared: the comparison "
                                                                         "has no train_time test")
    assert comparison_verdict(COMPARISON, True, 0.05) == "no: rules violated"
    # a file without "incomplete" (older compare) still says why; a violated rule is still named
    assert comparison_verdict({**clean, "n_candidate": 0}, None, 0.05) == "no: no complete runs"
    one = "no: only 1 complete run, too few for a t-test"
    assert comparison_verdict({**clean, "n_candidate": 1}, None, 0.05) == one
    assert comparison_verdict({**COMPARISON, "n_candidate": 0}, None, 0.05) == "no: no complete runs, rules violated"



def test_verdict_says_why_a_candidate_has_no_test(tmp_path):
    """Real logs through stats and compare: a candidate with no complete run, or one, gets no 'not faster (p=–)'
    but the runs it lacks; a baseline without runs is named; the normal case keeps its verdict."""
    from scipy import stats as sps

    from speedrun.analysis.comparison import compare_groups, one_group
    from speedrun.analysis.group_stats import compute_stats
    from speedrun.analysis.report_tables import render_comparisons
    from test_stats import make_runs

    specs = {"baseline": [(0, "complete", "cpu", 6.90, 100.0), (1, "complete", "cpu", 6.95, 102.0),
                          (2, "complete", "cpu", 6.92, 101.0)],
             "good": [(0, "complete", "cpu", 6.80, 90.0), (1, "complete", "cpu", 6.83, 91.0),
                      (2, "complete", "cpu", 6.79, 92.0)],
             "unstable": [(0, "diverged", "cpu", 6.9, 90.0)],
             "failing": [(0, "failed", "cpu", 6.9, 90.0), (1, "failed", "cpu", 6.9, 90.0)],
             "cut": [(0, "failed", "cpu", 6.9, 90.0), (1, "truncated", "cpu", 6.9, 90.0)],
             "single": [(0, "complete", "cpu", 6.77, 93.0), (1, "diverged", "cpu", 6.9, 90.0)]}
    for name, spec in specs.items():
        make_runs(tmp_path / name, spec)
    path = {name: str(tmp_path / name) for name in specs}
    summary = [s.to_json() for s in compute_stats(list(path.values()), target=7.0, alpha=0.05)]
    pairs = [("baseline", name) for name in specs if name != "baseline"] + [("unstable", "good")]
    comparisons = [compare_groups(one_group(path[b], "B"), one_group(path[c], "C"), 0.05, 7.0).to_json()
                   for b, c in pairs]
    rows = [line.split(" | ") for line in render_comparisons(comparisons, summary, 0.05) if line.startswith("| /")]
    verdicts = [(row[1], row[-1].rstrip(" |")) for row in rows]
    assert verdicts == [
        ("3 / 3", "**yes**"),
        ("3 / 0", "no: no complete runs (1 diverged)"),
        ("3 / 0", "no: no complete runs (2 failed)"),
        ("3 / 0", "no: no complete runs (1 failed, 1 truncated)"),
        ("3 / 1", "no: only 1 complete run (1 diverged), too few for a t-test"),
        ("0 / 3", "no: baseline has no complete runs (1 diverged)")]
    # a side without counted runs cannot be checked against the rules: unknown, never "ok"
    # a side without counted runs cannot be checked against the rules: unknown, never "ok" (these logs record no
    # data hashes and no world size: 3 rules unknown even where both sides have runs)
    assert [c["rules_ok"] for c in comparisons] == [None] * 6
    assert [row[-2] for row in rows] == ["ok, 3 unknown", "unknown", "unknown", "unknown", "ok, 3 unknown", "unknown"]
    # the normal case is a yes by scipy too: the candidate's mean is below 7 and its time (4 steps) is lower
    assert sps.ttest_1samp([6.80, 6.83, 6.79], 7.0, alternative="less").pvalue < 0.05
    assert sps.ttest_ind([0.36, 0.364, 0.368], [0.4, 0.408, 0.404], equal_var=False,
                         alternative="less").pvalue < 0.05

def test_the_n_column_says_it_counts_baseline_then_candidate_runs():
    from speedrun.analysis.report_tables import render_comparisons

    header, _, row = render_comparisons([{**COMPARISON, "n_baseline": 2, "n_candidate": 0}])[:3]
    assert header.startswith("| candidate | n counted (baseline / candidate) | ")
    assert row.startswith("| candidate | 2 / 0 | ")


def test_a_verdict_without_a_train_time_p_value_says_why_not_not_faster():
    """Counted runs without a train_time (llm.c logs) or with equal times give no Welch p on train_time: the
    verdict names the runs that lack a time, or the test's reason, instead of 'not faster (p=–)'."""
    from speedrun.analysis.comparison import compare_groups
    from speedrun.analysis.groups import Group
    from speedrun.analysis.report_tables import comparison_verdict
    from test_stats import record

    def group(name, losses, times):
        return Group(name, name, name, tuple(record(f"{name}{i}.txt", v, t) for i, (v, t) in
                                             enumerate(zip(losses, times))))

    base = group("b", [6.90, 6.95, 6.92], [100.0, 102.0, 101.0])
    untimed = group("c", [6.80, 6.83, 6.79], [None, None, None])
    c = compare_groups(base, untimed, 0.05, 7.0).to_json()
    assert (c["n_candidate"], c["train_time"]["n_candidate"], c["train_time"]["p_value"]) == (3, 0, None)
    assert c["train_time"]["reason"] == ("no train_time in 3 of 3 candidate runs: a t-test needs at least 2 timed "
                                         "runs per sample")
    assert comparison_verdict(c, True, 0.05) == "no: speed not compared: no train_time in 3 of 3 candidate runs"
    one_timed = group("c", [6.80, 6.83, 6.79], [None, 90.0, None])
    both = compare_groups(group("b", [6.90, 6.95, 6.92], [None, None, None]), one_timed, 0.05, 7.0).to_json()
    assert comparison_verdict(both, True, 0.05) == ("no: speed not compared: no train_time in 3 of 3 baseline runs "
                                                    "and 2 of 3 candidate runs")
    equal = compare_groups(group("b", [6.90, 6.95, 6.92], [100.0] * 3),
                           group("c", [6.80, 6.83, 6.79], [100.0] * 3), 0.05, 7.0).to_json()
    assert comparison_verdict(equal, True, 0.05) == ("no: speed not compared: zero variance (all values equal): the "
                                                     "t statistic is undefined")
    two_of_three = group("c", [6.80, 6.83, 6.79], [90.0, None, 91.0])      # 2 times suffice: a test, a p-value
    timed = compare_groups(base, two_of_three, 0.05, 7.0).to_json()
    assert timed["train_time"]["p_value"] is not None and comparison_verdict(timed, True, 0.05) == "**yes**"


def _public_runs(tmp_path):
    """Three runs of one variant without seeds (public logs), one diverged, with distinct curves."""
    folder = tmp_path / "cand"
    specs = [("a", "complete", [10.8, 7.0, 6.1]), ("b", "complete", [10.9, 7.2, 6.3]), ("c", "diverged", [10.7, 9.0])]
    paths = []
    for name, status, losses in specs:
        path = _write_run(folder, name, status, losses, losses[-1] if status == "complete" else None, 1000.0)
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, "seed": None, "file": f"records/cand/{name}.txt"}))
        paths.append(path)
    return paths


def test_step_and_run_count_axes_tick_whole_numbers_only(runs, tmp_path, monkeypatch):
    """A short run's zoomed steps and a few runs' n got ticks such as 42.5 and 2.5 (a new user's report)."""
    import speedrun.analysis.report_plots as report_plots

    figures = []
    monkeypatch.setattr(report_plots, "_save", lambda fig, out: figures.append(fig))
    _, curves = runs
    plot_val_loss(curves, tmp_path / "v.png", target=6.5, zoom_last_fraction=0.25)
    plot_p_value_by_n(SUMMARY, tmp_path / "p.png", 0.01)
    axes = [ax for fig in figures for ax in fig.axes]
    assert len(axes) == 3                                          # the val_loss panels (whole, zoomed) and p by n
    for ax in axes:
        low, high = ax.get_xlim()
        ticks = [t for t in ax.get_xticks() if low <= t <= high]
        assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks


def test_val_loss_plot_draws_one_line_per_run_when_seeds_are_unknown(tmp_path, monkeypatch):
    import speedrun.analysis.report_plots as report_plots

    figures = []
    monkeypatch.setattr(report_plots, "_save", lambda fig, out: figures.append(fig))
    _, curves = load_runs(_public_runs(tmp_path))
    plot_val_loss(curves, tmp_path / "v.png", target=6.5, zoom_last_fraction=1.0)
    [fig] = figures
    for ax in fig.axes:
        drawn = [(list(line.get_xdata()), list(line.get_ydata()))
                 for line in ax.get_lines() if line.get_marker() == "."]
        assert drawn == [([0, 10, 20], [10.8, 7.0, 6.1]), ([0, 10, 20], [10.9, 7.2, 6.3]), ([0, 10], [10.7, 9.0])]
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert labels == ["cand", "target 6.5"]                           # the variant named once, not per run


def test_incomplete_runs_without_seed_are_named_by_file(tmp_path):
    table, _ = load_runs(_public_runs(tmp_path))
    text = render_summary([], [], table, "base", 6.5, 0.01)
    assert "**1 incomplete run(s)**, not counted: cand records/cand/c.txt (diverged)" in text
    assert "seed None" not in text


def test_a_run_without_seed_has_a_dash_in_the_run_table(tmp_path):
    table, _ = load_runs(_public_runs(tmp_path))
    text = render_summary([], [], table, "base", 6.5, 0.01)
    rows = [line for line in text.split("## Runs", 1)[1].splitlines() if line.startswith("| cand |")]
    assert [row.split(" | ")[1] for row in rows] == ["–", "–", "–"] and "None" not in text


def test_seeds_stay_exact_integers_beside_a_run_without_one(tmp_path):
    """pandas makes a column with a missing value float: seeds printed 0.0 in runs.csv and a seed past 2^53
    rounded (a new user's report: a script variant's log beside our runs). Seeds go up to 2^64 - 1."""
    big = 2 ** 64 - 3
    paths = [*_public_runs(tmp_path)[:1], _write_run(tmp_path / "cand", big, "complete", [10.8, 6.9], 6.9, 900.0),
             _write_run(tmp_path / "cand", 0, "complete", [10.8, 7.1], 7.1, 950.0)]
    table, curves = load_runs(paths)
    assert list(table["seed"]) == [None, big, 0] and list(curves["seed"]) == [None] * 3 + [big] * 2 + [0] * 2
    rows = [line for line in render_summary([], [], table, "base", 6.5, 0.01).splitlines()
            if line.startswith("| cand |")]
    assert [row.split(" | ")[1] for row in rows] == ["–", str(big), "0"]
    lines = table.to_csv(index=False).splitlines()
    assert [line.split(",")[1] for line in lines[1:]] == ["", str(big), "0"]


def test_incomplete_runs_with_seed_are_named_by_seed(runs):
    text = render_summary(SUMMARY, [], runs[0], "baseline", 6.5, 0.01)
    assert "not counted: candidate seed 1 (diverged)" in text


def _report_argv(paths, summary, out):
    return ["report", "--runs", *map(str, paths), "--summary", str(summary), "--baseline", "baseline",
            "--target", "6.5", "--out-dir", str(out)]


def test_report_refuses_a_parsed_run_as_summary_before_writing(paths, tmp_path, capsys):
    from speedrun import cli

    out = tmp_path / "R4"
    assert cli.main(_report_argv(paths, paths[0], out)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"speedrun report: error: {paths[0]}: --summary expects the "
                                                   "summary.json of speedrun stats")
    assert "this is a parsed-run record" in err
    assert not out.exists()


def test_report_refuses_a_summary_among_the_runs_before_writing(paths, tmp_path, capsys):
    from speedrun import cli

    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps(SUMMARY))
    out = tmp_path / "R4"
    assert cli.main(_report_argv([*paths, summary], summary, out)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"speedrun report: error: {summary}: --runs expects parsed-run "
                                                   "records")
    assert "this is a summary.json" in err
    assert not out.exists()
    with pytest.raises(SpeedrunError, match="this is a JSON list"):
        read_records([_write_json(tmp_path / "x" / "list.json", [1, 2])])


def _write_json(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return path


def test_report_out_dir_that_is_a_file_is_one_line(paths, tmp_path, capsys):
    from speedrun import cli

    summary = _write_json(tmp_path / "summary.json", SUMMARY)
    afile = tmp_path / "afile"
    afile.write_text("keep\n")
    assert cli.main(_report_argv(paths, summary, afile)) == 2
    err = capsys.readouterr().err
    assert err == f"speedrun report: error: {afile}: exists and is not a folder (File exists)\n"
    assert afile.read_text() == "keep\n"


def test_unknown_baseline_is_refused_naming_the_summary_groups(paths, tmp_path, capsys):
    from speedrun import cli

    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps(SUMMARY))
    out = tmp_path / "report"
    argv = ["report", "--runs", *map(str, paths), "--summary", str(summary), "--baseline", "nosuch",
            "--target", "6.5", "--out-dir", str(out)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err == (f"speedrun report: error: --baseline nosuch: names no group of --summary {summary}; expected one "
                   "of its groups: baseline, candidate\n")
    assert not out.exists()
    with pytest.raises(SpeedrunError, match=r"--baseline candidat: .* baseline, candidate$"):
        check_baseline("candidat", SUMMARY)
    assert check_baseline("candidate", SUMMARY) == "candidate"
    # speedrun stats run at the project root names its groups by path: the group name or its folder's name
    rooted = [{**g, "group": f"results/parse/{g['group']}", "path": f"results/parse/{g['path']}"} for g in SUMMARY]
    assert check_baseline("baseline", rooted) == check_baseline("results/parse/baseline", rooted)
    assert check_baseline("baseline", rooted) == "results/parse/baseline"
    with pytest.raises(SpeedrunError, match=r"expected one of its groups: results/parse/baseline, "
                                            r"results/parse/candidate$"):
        check_baseline("parse/baseline2", rooted)


@pytest.mark.parametrize("case, what", [
    ("missing", "no such file"),
    ("folder", "this is a folder"),
    ("summary", "this is a summary.json (of speedrun stats)"),
    ("record", "this is a parsed-run record (of speedrun parse)"),
    ("incomplete", "this one lacks 'n_baseline', 'n_candidate', 'train_time', 'val_loss'"),
    ("binary", "not valid JSON ('utf-8' codec can't decode byte 0xff"),
])
def test_report_refuses_comparisons_that_are_not_compare_outputs_before_writing(paths, tmp_path, capsys, case, what):
    """--comparisons: each file is checked up front, as --summary and --runs are: one line naming it and what
    was expected, status 2, nothing written."""
    from speedrun import cli

    summary = _write_json(tmp_path / "summary.json", SUMMARY)
    given = {"missing": tmp_path / "nosuch.json", "folder": tmp_path / "baseline", "summary": summary,
             "record": paths[0], "incomplete": _write_json(tmp_path / "old.json", {"baseline": "b", "candidate": "c"}),
             "binary": tmp_path / "cmp.json"}[case]
    (tmp_path / "cmp.json").write_bytes(b"\xff\xfe{}")
    good = _write_json(tmp_path / "good.json", COMPARISON)
    out = tmp_path / "R4"
    assert cli.main([*_report_argv(paths, summary, out), "--comparisons", str(good), str(given)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    prefix = f"speedrun report: error: {given}: "
    assert err.startswith(prefix + ("" if case == "binary" else "--comparisons expects the .json files of speedrun "
                                                                  "compare --json-out, ")) and what in err
    assert not out.exists()
    assert read_comparison(good) == COMPARISON


def _experiment(root, finals, alpha="0.05", target="7", name="exp"):
    """A workflow-like experiment under root/<name>: our logs in train/<variant>/, parsed at <name>/ into
    parse/<variant>/seed<N>.{csv,json}, then `speedrun stats` and `speedrun compare` run in parse/ (as the
    stats and compare rules do): summary.json and compare/candidate.json under stats/. Returns the folder."""
    import os

    from speedrun import cli
    from test_logs import our_log, write

    exp = root / name
    for variant, values in finals.items():
        for seed, final in enumerate(values):
            text, _ = our_log(seed=seed, variant=variant, losses=[10.8, 9.0, 8.0, 7.5, final],
                              step_ms=100.0 + seed + (variant == "candidate"))
            write(exp / "train" / variant / f"seed{seed}.txt", text)
    cwd = os.getcwd()
    try:
        os.chdir(exp)
        for log in sorted((exp / "train").glob("*/*.txt")):
            out = f"parse/{log.parent.name}/{log.stem}"
            assert cli.main(["parse", f"train/{log.parent.name}/{log.name}", "--csv", f"{out}.csv",
                             "--json", f"{out}.json"]) == 0
        os.chdir(exp / "parse")
        variants = list(finals)
        assert cli.main(["stats", *variants, "--target", target, "--alpha", alpha,
                         "--json-out", "../stats/summary.json"]) == 0
        if "candidate" in finals:
            assert cli.main(["compare", "baseline", "candidate", "--target", target, "--alpha", alpha,
                             "--json-out", "../stats/compare/candidate.json"]) == 0
    finally:
        os.chdir(cwd)
    return exp


FINALS = {"baseline": [6.90, 6.95, 6.88], "candidate": [6.80, 6.84, 6.79, 6.83]}


def _records(exp):
    return sorted(str(p) for p in (exp / "parse").glob("*/*.json"))


def _argv(exp, *extra, runs=None, summary=None, comparisons=None, out=None):
    return ["report", "--runs", *(runs or _records(exp)), "--summary", str(summary or exp / "stats/summary.json"),
            "--comparisons", *(comparisons or [str(exp / "stats/compare/candidate.json")]), "--baseline", "baseline",
            "--out-dir", str(out or exp / "report"), *extra]


def _refused(argv, capsys, out):
    from speedrun import cli

    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and not out.exists()
    return err.removeprefix("speedrun report: error: ").rstrip("\n")


def test_report_takes_target_and_alpha_from_the_summary(tmp_path, capsys):
    """Without --target and --alpha the report states the summary's (7, 0.05): the header, the runs-needed column
    and the verdicts agree (the baseline's p = 0.02478, by scipy, reaches the target at 0.05, not at 0.01); given
    as the workflow gives them (the config's, which stats had too), the same report."""
    from scipy import stats as sps

    from speedrun import cli

    exp = _experiment(tmp_path, FINALS)
    assert cli.main(_argv(exp)) == 0
    text = (exp / "report" / "summary.md").read_text()
    p = sps.ttest_1samp(FINALS["baseline"], 7.0, alternative="less").pvalue
    assert 0.01 < p < 0.05 and f"{p:.4g}" == "0.02478"
    assert "Target val_loss 7.0; a variant reaches it when the one-sided one-sample t-test of mean val_loss < 7.0 " \
           "gives p < 0.05 with at least 3 counted runs" in text
    [row] = [line for line in text.splitlines() if line.startswith("| baseline | 3 |")]
    assert row.split(" | ")[5:7] == ["0.02478", "yes"]
    assert "| runs for p<0.05 / 80% power |" in text
    assert cli.main(_argv(exp, "--target", "7", "--alpha", "0.05", out=tmp_path / "again")) == 0
    assert (tmp_path / "again" / "summary.md").read_text() == text


@pytest.mark.parametrize("option, given, recorded", [("--alpha", "0.001", "0.05"), ("--target", "3.5", "7")])
def test_report_refuses_a_target_or_alpha_that_is_not_the_summarys(tmp_path, capsys, option, given, recorded):
    exp = _experiment(tmp_path, FINALS)
    err = _refused(_argv(exp, option, given), capsys, exp / "report")
    summary = exp / "stats" / "summary.json"
    key = option.removeprefix("--")
    assert err == (f"{option} {given}: the statistics of --summary {summary} were computed with {key} {recorded}, "
                   f"and their p-values and verdicts hold for that value only; expected {option} {recorded} (or leave "
                   f"{option} out), or run speedrun stats {option} {given} again")


def test_report_refuses_a_comparison_at_another_alpha_or_baseline(tmp_path, capsys):
    exp = _experiment(tmp_path, FINALS)
    other = _experiment(tmp_path, FINALS, alpha="0.01", name="other")
    cmp_path = other / "stats/compare/candidate.json"
    err = _refused(_argv(exp, comparisons=[str(cmp_path)]), capsys, exp / "report")
    assert err == (f"--comparisons {cmp_path}: alpha 0.01, but the statistics of --summary {exp / 'stats/summary.json'}"
                   " are at alpha 0.05; expected a comparison of speedrun compare --alpha 0.05")
    swapped = tmp_path / "swapped.json"
    swapped.write_text(json.dumps({**json.loads((exp / "stats/compare/candidate.json").read_text()),
                                   "baseline": "candidate", "candidate": "baseline"}))
    err = _refused(_argv(exp, comparisons=[str(swapped)]), capsys, exp / "report")
    assert err == (f"--comparisons {swapped}: compares baseline with candidate, not with the baseline baseline "
                   "(--baseline); expected comparisons against baseline")


def test_report_refuses_runs_that_are_not_the_summarys(tmp_path, capsys):
    """Runs of another experiment, the same record twice (as the same file or a copy), and a run of the summary
    left out: each refused, naming the files, before anything is written."""
    exp = _experiment(tmp_path, FINALS)
    summary = exp / "stats" / "summary.json"
    expected = "expected the parsed runs that speedrun stats read to write this summary.json"
    # another experiment's summary: other groups
    other = _experiment(tmp_path, {"baseline": [6.9, 6.95, 6.88], "wider": [6.7, 6.75]}, name="other")
    err = _refused(_argv(exp, summary=other / "stats/summary.json", comparisons=[]), capsys, exp / "report")
    first_candidate = exp / "parse" / "candidate" / "seed0.json"
    assert err == (f"--runs {first_candidate}: its variant 'candidate' (the record's folder) is no group of --summary "
                   f"{other / 'stats/summary.json'} (its groups: baseline, wider); {expected}")
    # another experiment with the same variant names and log paths (relative to its own folder): other runs
    same_names = _experiment(tmp_path, {"baseline": [6.91, 6.96, 6.87], "candidate": [6.8, 6.84, 6.79, 6.83]},
                             name="same_names")
    err = _refused(_argv(same_names, summary=summary, comparisons=[]), capsys, same_names / "report")
    assert err == (f"--runs {same_names / 'parse/baseline/seed0.json'}: the run of train/baseline/seed0.txt differs "
                   f"from that run in group baseline of --summary {summary} (val_loss 6.91 in the record, 6.9 in the "
                   f"summary); {expected} (a log of the same path in another experiment?)")
    # the same experiment with a seed fewer: the summary's third run is given by no record
    fewer = _experiment(tmp_path, {"baseline": [6.90, 6.95], "candidate": FINALS["candidate"]}, name="fewer")
    err = _refused(_argv(fewer, summary=summary, comparisons=[]), capsys, fewer / "report")
    assert err == (f"--summary {summary}: group baseline counts its run train/baseline/seed2.txt, which no record of "
                   f"--runs gives; {expected}, all of them")
    # the same records twice
    records = _records(exp)
    err = _refused(_argv(exp, runs=[*records, records[1]]), capsys, exp / "report")
    assert err == f"--runs {records[1]}: given twice; expected each run record once"
    alias = exp / "parse" / "baseline" / ".." / "baseline" / "seed1.json"
    err = _refused(_argv(exp, runs=[*records, str(alias)]), capsys, exp / "report")
    assert err == f"--runs {alias}: given twice (also as {records[1]}); expected each run record once"
    copy = exp / "parse" / "baseline" / "seed0-copy.json"
    copy.write_text((exp / "parse" / "baseline" / "seed0.json").read_text())
    err = _refused(_argv(exp, runs=[*records, str(copy)]), capsys, exp / "report")
    assert err == (f"--runs {copy}: the same run as {exp / 'parse/baseline/seed0.json'} (the log "
                   "train/baseline/seed0.txt, same content); expected each run record once")
    # a run of the summary left out
    err = _refused(_argv(exp, runs=records[:-1]), capsys, exp / "report")
    assert err == (f"--summary {summary}: group candidate counts its run train/candidate/seed3.txt, which no record "
                   f"of --runs gives; {expected}, all of them")


def test_report_refuses_a_run_of_another_experiment_with_the_same_group(tmp_path, capsys):
    exp = _experiment(tmp_path, FINALS)
    summary = exp / "stats" / "summary.json"
    moved = json.loads(summary.read_text())
    for g in moved:                          # the same group names, other logs (parsed from another folder)
        g["runs"] = [{**r, "file": "elsewhere/" + r["file"]} for r in g["runs"]]
    other = tmp_path / "other-summary.json"
    other.write_text(json.dumps(moved))
    err = _refused(_argv(exp, summary=other, comparisons=[]), capsys, exp / "report")
    assert err == (f"--runs {exp / 'parse/baseline/seed0.json'}: the run of train/baseline/seed0.txt is not among the "
                   f"runs of group baseline of --summary {other}; expected the parsed runs that speedrun stats read "
                   "to write this summary.json (this summary.json may be of another experiment or other seeds)")


def test_report_without_comparisons_says_none_was_given(tmp_path, capsys):
    from speedrun import cli

    exp = _experiment(tmp_path, FINALS)
    argv = _argv(exp)
    argv.remove(str(exp / "stats/compare/candidate.json"))
    assert cli.main(argv) == 0
    text = (exp / "report" / "summary.md").read_text()
    section = text.split("## Candidates against the baseline (baseline)", 1)[1].split("## Runs", 1)[0]
    assert section.strip() == ("No comparison was given (`--comparisons`: the .json files of `speedrun compare`): "
                               "candidate is not tested against the baseline.")


def test_report_settings_of_older_or_mixed_summaries(tmp_path):
    """A summary without target/alpha (an older version) takes the given ones (alpha 0.01 when not given); without
    a target anywhere, or with groups of two targets, the report is refused, naming the file."""
    path = tmp_path / "summary.json"
    old = [{"group": "a"}, {"group": "b"}]
    assert report_settings(old, path, 4.6, None) == (4.6, 0.01)
    assert report_settings(old, path, 4.6, 0.05) == (4.6, 0.05)
    assert report_settings([{"group": "a", "target": 4.6, "alpha": 0.05}], path, None, None) == (4.6, 0.05)
    with pytest.raises(SpeedrunError, match=rf"^--target: not given, and --summary {path} records none"):
        report_settings(old, path, None, None)
    mixed = [{"group": "a", "target": 3.28}, {"group": "b", "target": 3.5}]
    with pytest.raises(SpeedrunError, match=rf"^--summary {path}: its groups disagree on target \(a: 3.28, b: 3.5\)"):
        report_settings(mixed, path, None, None)
    with pytest.raises(SpeedrunError, match=rf"^--summary {path}: group a: alpha: 'x' is not a number$"):
        report_settings([{"group": "a", "target": 3.28, "alpha": "x"}], path, None, None)


@pytest.mark.parametrize("zoom", [0.0, 2.0, float("nan")])
def test_a_zoom_fraction_outside_0_1_is_refused_before_anything_is_written(paths, tmp_path, zoom):
    """config.yaml's schema takes report.zoom_last_fraction in (0, 1]; the CLI took 2 and drew an empty panel."""
    (tmp_path / "summary.json").write_text(json.dumps(SUMMARY))
    args = argparse.Namespace(runs=[str(p) for p in paths], summary=str(tmp_path / "summary.json"), comparisons=[],
                              baseline="baseline", target=None, alpha=None, zoom_last_fraction=zoom,
                              out_dir=str(tmp_path / "report"), describe=[], replicates=[])
    with pytest.raises(SpeedrunError, match=r"--zoom-last-fraction must be in \(0, 1\]"):
        report.main(args)
    assert not (tmp_path / "report").exists()


def test_an_experiment_of_one_variant_is_told_it_has_no_candidate(runs):
    """Not the CLI's `--comparisons` (which the workflow passes itself): a new user's single-variant report."""
    table, _ = runs
    text = render_summary(SUMMARY[:1], [], table, "baseline", 6.5, 0.01)
    section = text.split("## Candidates against the baseline (baseline)", 1)[1].split("## Runs", 1)[0]
    assert section.strip() == ("The experiment has one variant, `baseline` (the baseline): no candidate to test "
                               "against it; a second variant under `variants` in the config would be one.")

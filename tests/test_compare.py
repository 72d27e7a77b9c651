"""Welch t-tests, confidence intervals, speedup, and `speedrun compare`."""

import json
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from speedrun import cli
from speedrun.analysis.comparison import compare_groups, one_group
from speedrun.analysis.comparison_tables import comparison_markdown, comparison_rows, comparison_text
from speedrun.analysis.groups import Group
from speedrun.analysis.tests import speedup, welch_ci, welch_dof, welch_test
from speedrun.errors import SpeedrunError
from test_logs import REFERENCE, needs_reference
from test_logs import our_log, write
from test_stats import make_runs, record


def test_welch_by_hand():
    # x: mean 2, var 1; y: mean 4, var 10/3. se^2 = 1/3 + 5/6 = 7/6; dof = (7/6)^2 / ((1/3)^2/2 + (5/6)^2/3) = 147/31
    x, y = [1.0, 2.0, 3.0], [2.0, 3.0, 5.0, 6.0]
    assert welch_dof(x, y) == pytest.approx(147 / 31, rel=1e-12)
    res = welch_test(x, y, "less", "x lower")
    assert res.t_statistic == pytest.approx(-2 / math.sqrt(7 / 6), rel=1e-12)
    assert res.difference == pytest.approx(-2.0) and res.dof == pytest.approx(147 / 31)
    half = sps.t.ppf(0.975, 147 / 31) * math.sqrt(7 / 6)
    assert (res.ci_low, res.ci_high) == pytest.approx((-2 - half, -2 + half), rel=1e-12)
    assert res.p_value == pytest.approx(sps.t.cdf(-2 / math.sqrt(7 / 6), 147 / 31), rel=1e-10)


sample = st.lists(st.floats(-10, 10, allow_nan=False), min_size=2, max_size=25).filter(lambda v: np.ptp(v) > 1e-3)


@settings(max_examples=80, deadline=None)
@given(sample, sample, st.sampled_from(["less", "greater", "two-sided"]), st.sampled_from([0.9, 0.95, 0.99]))
def test_welch_agrees_with_scipy(c, b, alternative, confidence):
    ours = welch_test(c, b, alternative, "h", confidence)
    ref = sps.ttest_ind(c, b, equal_var=False, alternative=alternative)
    assert ours.p_value == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-300)
    assert ours.dof == pytest.approx(ref.df, rel=1e-9)
    ci = sps.ttest_ind(c, b, equal_var=False).confidence_interval(confidence)  # two-sided interval
    diff, low, high = welch_ci(c, b, confidence)
    assert (low, high) == pytest.approx((ci.low, ci.high), rel=1e-9, abs=1e-12)
    assert diff == pytest.approx(np.mean(c) - np.mean(b), abs=1e-12)


def test_speedup_and_untestable_sides():
    sp = speedup([10.0, 12.0], [9.0, 9.0])
    assert (sp.difference, sp.percent) == pytest.approx((2.0, 200 / 11))
    assert speedup([], [1.0]) is None
    res = welch_test([1.0], [1.0, 2.0], "less", "h")
    assert res.p_value is None and "at least 2" in res.reason and res.difference == pytest.approx(-0.5)


def test_compare_groups_directions_and_units():
    base = Group("base", "base", "base", tuple(record(f"b{i}", v, t) for i, (v, t) in
                                               enumerate([(3.280, 90000.0), (3.281, 90500.0), (3.279, 89500.0)])))
    cand = Group("cand", "cand", "cand", tuple(record(f"c{i}", v, t) for i, (v, t) in
                                               enumerate([(3.276, 85000.0), (3.277, 85400.0), (3.275, 84600.0)])))
    c = compare_groups(base, cand, alpha=0.01).to_json()
    assert (c["baseline"], c["candidate"], c["n_baseline"], c["n_candidate"]) == ("base", "cand", 3, 3)
    assert c["val_loss"]["difference"] == pytest.approx(-0.004)
    assert c["val_loss"]["p_value"] == pytest.approx(sps.ttest_ind([3.276, 3.277, 3.275], [3.280, 3.281, 3.279],
                                                                   equal_var=False, alternative="less").pvalue)
    assert c["train_time"]["difference"] == pytest.approx(-5.0) and c["train_time"]["unit"] == "s"
    assert c["train_time"]["significant"] is True
    assert c["speedup"]["seconds"] == pytest.approx(5.0) and c["speedup"]["percent"] == pytest.approx(500 / 90)
    assert c["warnings"] == []


def test_compare_cli_on_our_logs(tmp_path, capsys):
    make_runs(tmp_path / "baseline", [(0, "complete", "cpu", 6.90, 100.0), (1, "complete", "cpu", 6.95, 102.0),
                                      (2, "complete", "cpu", 6.92, 101.0)])
    make_runs(tmp_path / "candidate", [(0, "complete", "cpu", 6.80, 90.0), (1, "complete", "cpu", 6.83, 91.0),
                                       (2, "diverged", "cpu", 6.9, 90.0), (3, "complete", "cpu", 6.79, 92.0)])
    out_json, out_md = tmp_path / "cmp" / "candidate.json", tmp_path / "cmp" / "candidate.md"
    argv = ["compare", str(tmp_path / "baseline"), str(tmp_path / "candidate"), "--json-out", str(out_json),
            "--markdown-out", str(out_md)]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    c = json.loads(out_json.read_text())
    assert (c["n_baseline"], c["n_candidate"]) == (3, 3)
    times_b, times_c = np.array([400, 408, 404]) / 1000, np.array([360, 364, 368]) / 1000
    ref = sps.ttest_ind(times_c, times_b, equal_var=False, alternative="less")
    assert c["train_time"]["p_value"] == pytest.approx(ref.pvalue)
    ci = sps.ttest_ind(times_c, times_b, equal_var=False).confidence_interval(0.95)
    assert (c["train_time"]["ci_low"], c["train_time"]["ci_high"]) == pytest.approx((ci.low, ci.high))
    assert c["speedup"]["seconds"] == pytest.approx(times_b.mean() - times_c.mean())
    assert "speedup: 0.040 s (9.90%" in printed and "H1: candidate mean train_time < baseline" in printed
    md = out_md.read_text()
    assert md.startswith(f"# {tmp_path / 'candidate'} vs {tmp_path / 'baseline'}")
    assert "H1: candidate mean val_loss < baseline" in md


def test_compare_warns_about_shared_runs_and_gpu_counts(tmp_path):
    make_runs(tmp_path / "a", [(0, "complete", "cpu", 6.9, 100.0), (1, "complete", "cpu", 6.8, 100.0)])
    make_runs(tmp_path / "b", [(0, "complete", "NVIDIA H200 x 1", 6.9, 100.0), (1, "complete", "cpu", 6.8, 100.0)])
    with pytest.raises(SpeedrunError, match="resolves to 2 groups"):
        one_group(str(tmp_path / "b"), "CANDIDATE")
    c = compare_groups(one_group(str(tmp_path / "a"), "BASELINE"), one_group(str(tmp_path / "a" / "seed1.txt"), "C"))
    assert "1 identical run(s) on both sides (same file or loss curve): the samples are not independent" in c.warnings


@needs_reference
def test_bigrams_pr299_against_its_baseline(capsys):
    folder = REFERENCE / "2026-05-20_BigramsSignTrick"
    c = compare_groups(one_group(str(folder / "baseline"), "B"), one_group(str(folder / "pr299"), "C")).to_json()
    published = (folder / "pr299" / "statistics.md").read_text()
    loss_delta = float(re.search(r"^\| val_loss mean \| [\d.]+ \| [\d.]+ \| (-?[\d.]+) \|$", published, re.M)[1])
    time_delta = float(re.search(r"^\| train_time mean \(ms\) \| [\d.]+ \| [\d.]+ \| \*\*(-?[\d.]+)\*\* \|$",
                                 published, re.M)[1])
    assert round(c["val_loss"]["difference"], 5) == loss_delta
    assert round(c["train_time"]["difference"] * 1000, 1) == time_delta
    assert c["train_time"]["p_value"] < 1e-10 and c["val_loss"]["p_value"] > 0.1


@needs_reference
def test_compare_refuses_a_split_directory(capsys):
    assert cli.main(["compare", str(REFERENCE / "2026-01-26-UntieValueEmbeddings"),
                     str(REFERENCE / "2025-09-10_Yarn")]) == 2
    err = capsys.readouterr().err
    assert "BASELINE" in err and "resolves to 2 groups" in err and "step counts differ" in err


def test_z_rule_by_hand():
    from speedrun.analysis.tests import z_rule

    three = z_rule([3.278, 3.279, 3.277], 3.28)  # (3.28 - 3.278) * sqrt(3) = 0.003464 < 0.004
    assert three.value == pytest.approx(0.002 * math.sqrt(3)) and three.passes is False
    six = z_rule([3.278, 3.279, 3.277] * 2, 3.28)  # 0.002 * sqrt(6) = 0.004899 >= 0.004
    assert six.value == pytest.approx(0.002 * math.sqrt(6)) and six.passes is True
    assert z_rule([], 3.28).passes is None


def test_target_decides_val_tokens_rule_and_z_rule(tmp_path):
    header = {"val_tokens": 65536}
    for side, shift in (("b", 0.0), ("c", -0.0005)):
        for seed in range(3):
            text, _ = our_log(seed=seed, losses=[10.8, 9.0, 8.0, 7.5, 3.279 + shift + seed / 1000], header=header)
            write(tmp_path / side / f"seed{seed}.txt", text)
    base, cand = one_group(str(tmp_path / "b"), "B"), one_group(str(tmp_path / "c"), "C")
    plain = compare_groups(base, cand).to_json()
    public = compare_groups(base, cand, target=3.28).to_json()
    status = lambda c: {r["rule"]: r["status"] for r in c["rules"]}["validation tokens"]  # noqa: E731
    assert (status(plain), status(public)) == ("note", "violation")
    assert plain["z_rule"] is None and plain["warnings"] == []
    assert public["z_rule"]["candidate"]["value"] == pytest.approx((3.28 - 3.2795) * math.sqrt(3))
    assert public["z_rule"]["baseline"]["value"] == pytest.approx(0.0)
    [warning] = public["warnings"]
    assert warning.startswith("rule violated: validation tokens: val_tokens is 65,536 on both sides")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(5e4, 2e5), min_size=2, max_size=15).filter(lambda v: np.ptp(v) > 1.0),
       st.lists(st.floats(5e4, 2e5), min_size=2, max_size=15).filter(lambda v: np.ptp(v) > 1.0))
def test_times_in_ms_or_s_give_the_same_test(base_ms, cand_ms):
    """The unit of train_time changes the difference and CI by the factor 1000, never t, dof or p."""
    ms = welch_test(cand_ms, base_ms, "less", "h")
    s = welch_test(np.array(cand_ms) / 1000, np.array(base_ms) / 1000, "less", "h")
    assert s.p_value == pytest.approx(ms.p_value, rel=1e-9, abs=1e-300)
    assert (s.t_statistic, s.dof) == pytest.approx((ms.t_statistic, ms.dof), rel=1e-9)
    assert (s.difference * 1000, s.ci_low * 1000, s.ci_high * 1000) == pytest.approx(
        (ms.difference, ms.ci_low, ms.ci_high), rel=1e-9, abs=1e-6)
    b = Group("b", "b", "b", tuple(record(f"b{i}", 3.28, t) for i, t in enumerate(base_ms)))
    c = Group("c", "c", "c", tuple(record(f"c{i}", 3.27, t) for i, t in enumerate(cand_ms)))
    out = compare_groups(b, c).to_json()
    assert out["train_time"]["difference"] == pytest.approx((np.mean(cand_ms) - np.mean(base_ms)) / 1000, abs=1e-9)
    assert out["train_time"]["p_value"] == pytest.approx(ms.p_value, rel=1e-9, abs=1e-300)


def test_runs_not_counted_are_listed_in_every_output(tmp_path, capsys):
    """A side's diverged and truncated runs are named with their reason in the table, the JSON and the
    Markdown; a side with diverged runs only says why it has n=0."""
    base, cand = tmp_path / "baseline", tmp_path / "candidate"
    make_runs(base, [(0, "diverged", "cpu", 6.9, 100.0), (1, "diverged", "cpu", 6.9, 100.0)])
    make_runs(cand, [(0, "complete", "cpu", 6.80, 90.0), (1, "complete", "cpu", 6.83, 91.0),
                     (2, "complete", "cpu", 6.79, 92.0), (3, "diverged", "cpu", 6.9, 90.0),
                     (4, "truncated", "cpu", 6.9, 90.0)])
    out_json, out_md = tmp_path / "cmp.json", tmp_path / "cmp.md"
    assert cli.main(["compare", str(base), str(cand), "--json-out", str(out_json), "--markdown-out", str(out_md)]) == 0
    printed = capsys.readouterr().out
    diverged, truncated = "run diverged: non-finite train_loss at step 2", "log ends at step 3 of 4 without the " \
                                                                           "final val_loss line"
    expected = {"baseline": [{"file": str(base / f"seed{s}.txt"), "status": "diverged", "last_step": 2,
                              "reason": diverged} for s in (0, 1)],
                "candidate": [{"file": str(cand / "seed3.txt"), "status": "diverged", "last_step": 2,
                               "reason": diverged},
                              {"file": str(cand / "seed4.txt"), "status": "truncated", "last_step": 3,
                               "reason": truncated}]}
    c = json.loads(out_json.read_text())
    assert (c["n_baseline"], c["n_candidate"]) == (0, 3) and c["incomplete"] == expected
    assert re.search(r"^n\s+0 \(2 diverged not counted\)\s+3 \(1 diverged, 1 truncated not counted\)\s", printed, re.M)
    for side, runs in expected.items():
        for r in runs:
            assert f"not counted: {side}: {r['status']}: {r['file']} ({r['reason']})" in printed.splitlines()
    md = out_md.read_text().splitlines()
    assert "## Runs not counted" in md
    assert f"| baseline | seed1 | diverged | 2 | {diverged} |" in md
    assert f"| candidate | seed4 | truncated | 3 | {truncated} |" in md


def test_complete_sides_list_nothing_not_counted(tmp_path):
    make_runs(tmp_path / "b", [(0, "complete", "cpu", 6.9, 100.0), (1, "complete", "cpu", 6.8, 100.0)])
    make_runs(tmp_path / "c", [(0, "complete", "cpu", 6.7, 90.0), (1, "complete", "cpu", 6.6, 90.0)])
    c = compare_groups(one_group(str(tmp_path / "b"), "B"), one_group(str(tmp_path / "c"), "C"))
    assert c.to_json()["incomplete"] == c.to_json()["duplicates"] == {"baseline": [], "candidate": []}
    assert "not counted" not in comparison_text(c) and "Runs not counted" not in comparison_markdown(c)
    assert comparison_rows(c)[0][:3] == ["n", "2", "2"]


def test_duplicate_runs_are_named_in_every_output_as_stats_names_them(tmp_path, capsys):
    """Two logs of one run on a side (a byte copy; a second log of the same seed with other timings) count once,
    and compare names the second in its n row, its notes, the JSON and the Markdown, with the duplicates that
    `speedrun stats` reports for that side."""
    base, cand = tmp_path / "baseline", tmp_path / "candidate"
    make_runs(base, [(0, "complete", "cpu", 6.90, 100.0), (1, "complete", "cpu", 6.95, 102.0),
                     (2, "complete", "cpu", 6.85, 101.0)])
    write(base / "seed1_rerun.txt", our_log(seed=1, losses=[10.8, 9.0, 8.0, 7.5, 6.95], step_ms=130.0)[0])
    make_runs(cand, [(0, "complete", "cpu", 6.80, 90.0), (1, "complete", "cpu", 6.83, 91.0),
                     (2, "complete", "cpu", 6.79, 92.0)])
    (cand / "seed0_copy.txt").write_bytes((cand / "seed0.txt").read_bytes())
    out_json, out_md = tmp_path / "cmp.json", tmp_path / "cmp.md"
    assert cli.main(["compare", str(base), str(cand), "--json-out", str(out_json), "--markdown-out", str(out_md)]) == 0
    printed = capsys.readouterr().out
    expected = {"baseline": [{"file": str(base / "seed1_rerun.txt"), "duplicate_of": str(base / "seed1.txt"),
                              "duplicate_kind": "identical loss curve"}],
                "candidate": [{"file": str(cand / "seed0_copy.txt"), "duplicate_of": str(cand / "seed0.txt"),
                               "duplicate_kind": "identical file"}]}
    c = json.loads(out_json.read_text())
    assert c["duplicates"] == expected and c["incomplete"] == {"baseline": [], "candidate": []}
    assert (c["n_baseline"], c["n_candidate"]) == (3, 3)
    assert c["val_loss"]["mean_baseline"] == pytest.approx(np.mean([6.90, 6.95, 6.85]), abs=1e-12)
    assert c["val_loss"]["mean_candidate"] == pytest.approx(np.mean([6.80, 6.83, 6.79]), abs=1e-12)
    for side, folder in (("baseline", base), ("candidate", cand)):
        assert cli.main(["stats", str(folder), "--target", "7", "--json"]) == 0
        [s] = json.loads(capsys.readouterr().out)
        assert {d["file"]: d["duplicate_of"] for d in c["duplicates"][side]} == s["duplicates"]
        assert {d["file"]: d["duplicate_kind"] for d in c["duplicates"][side]} == s["duplicate_kinds"]
    assert re.search(r"^n\s+3 \(1 duplicate not counted\)\s+3 \(1 duplicate not counted\)\s", printed, re.M)
    lines = printed.splitlines()
    assert (f"not counted: baseline: duplicate: {base / 'seed1_rerun.txt'} (identical loss curve, same as "
            f"{base / 'seed1.txt'})") in lines
    assert (f"not counted: candidate: duplicate: {cand / 'seed0_copy.txt'} (identical file, same as "
            f"{cand / 'seed0.txt'})") in lines
    md = out_md.read_text().splitlines()
    assert "## Runs not counted" in md
    assert "| baseline | seed1_rerun | duplicate | 4 | identical loss curve, same as seed1 |" in md
    assert "| candidate | seed0_copy | duplicate | 4 | identical file, same as seed0 |" in md


def test_each_run_not_counted_is_listed_once_with_all_its_reasons_in_log_order(tmp_path, capsys):
    """A byte copy of a diverged log is both incomplete and a duplicate: one line (one Markdown row) with both
    reasons, and the runs not counted follow the files' order (a duplicate before a later diverged run), as
    `speedrun stats` notes them for that side."""
    base, cand = tmp_path / "baseline", tmp_path / "candidate"
    make_runs(base, [(0, "complete", "cpu", 6.90, 100.0), (1, "complete", "cpu", 6.95, 102.0)])
    make_runs(cand, [(0, "complete", "cpu", 6.80, 90.0), (1, "complete", "cpu", 6.83, 91.0),
                     (3, "diverged", "cpu", 6.9, 90.0)])
    (cand / "seed0_copy.txt").write_bytes((cand / "seed0.txt").read_bytes())
    (cand / "seed3_copy.txt").write_bytes((cand / "seed3.txt").read_bytes())
    out_md = tmp_path / "cmp.md"
    assert cli.main(["compare", str(base), str(cand), "--markdown-out", str(out_md)]) == 0
    printed = capsys.readouterr().out
    diverged = "run diverged: non-finite train_loss at step 2"
    assert [line for line in printed.splitlines() if line.startswith("not counted:")] == [
        f"not counted: candidate: duplicate: {cand / 'seed0_copy.txt'} (identical file, same as {cand / 'seed0.txt'})",
        f"not counted: candidate: diverged: {cand / 'seed3.txt'} ({diverged})",
        f"not counted: candidate: diverged, duplicate: {cand / 'seed3_copy.txt'} ({diverged}; identical file, "
        f"same as {cand / 'seed3.txt'})"]
    assert re.search(r"^n\s+2\s+2 \(2 diverged, 1 duplicate not counted\)\s", printed, re.M)
    md = out_md.read_text().splitlines()
    assert [line for line in md if line.startswith("| candidate |")] == [
        "| candidate | seed0_copy | duplicate | 4 | identical file, same as seed0 |",
        f"| candidate | seed3 | diverged | 2 | {diverged} |",
        f"| candidate | seed3_copy | diverged, duplicate | 2 | {diverged}; identical file, same as seed3 |"]
    assert cli.main(["stats", str(cand), "--target", "7"]) == 0
    notes = [line.split(": ", 1)[1] for line in capsys.readouterr().out.splitlines() if line.startswith(f"{cand}: ")]
    assert notes == [f"duplicate (identical file), counted once: {cand / 'seed0_copy.txt'} = {cand / 'seed0.txt'}",
                     f"diverged: {cand / 'seed3.txt'} ({diverged})",
                     f"diverged, duplicate: {cand / 'seed3_copy.txt'} ({diverged}; identical file, same as "
                     f"{cand / 'seed3.txt'})"]


@pytest.mark.parametrize("target", ["-1", "0", "inf", "nan"])
def test_compare_refuses_a_target_that_is_no_val_loss(tmp_path, capsys, target):
    """The check `speedrun stats` makes (speedrun.analysis.group_stats.check_target), with its message."""
    make_runs(tmp_path / "b", [(i, "complete", "cpu", v, 100.0) for i, v in enumerate([6.9, 6.95, 6.85])])
    make_runs(tmp_path / "c", [(i, "complete", "cpu", v, 90.0) for i, v in enumerate([6.8, 6.85, 6.75])])
    assert cli.main(["compare", str(tmp_path / "b"), str(tmp_path / "c"), "--target", target]) == 2
    err = capsys.readouterr().err
    assert f"--target {float(target)}: expected a val_loss above 0 (cross-entropy in nats per token" in err
    assert cli.main(["stats", str(tmp_path / "b"), "--target", target]) == 2
    assert capsys.readouterr().err.split("error: ", 1)[1] == err.split("error: ", 1)[1]


def test_compare_only_reads_the_files_given(tmp_path, capsys):
    """--only: each side keeps its folder's name but counts only the files listed (the workflow's configured
    seeds); a stale run in the folder (seed 9, far lower val_loss) is not read."""
    base, cand = tmp_path / "baseline", tmp_path / "candidate"
    make_runs(base, [(0, "complete", "cpu", 6.90, 100.0), (1, "complete", "cpu", 6.95, 102.0),
                     (9, "complete", "cpu", 1.00, 50.0)])
    make_runs(cand, [(0, "complete", "cpu", 6.80, 90.0), (1, "complete", "cpu", 6.83, 91.0),
                     (9, "diverged", "cpu", 6.9, 90.0)])
    only = [str(base / "seed0.txt"), str(base / "seed1.txt"), str(cand / "seed0.txt"), str(cand / "seed1.txt")]
    out = tmp_path / "cmp.json"
    assert cli.main(["compare", str(base), str(cand), "--only", *only, "--json-out", str(out)]) == 0
    c = json.loads(out.read_text())
    assert (c["baseline"], c["candidate"], c["n_baseline"], c["n_candidate"]) == (str(base), str(cand), 2, 2)
    assert c["val_loss"]["mean_baseline"] == pytest.approx(np.mean([6.90, 6.95]))
    assert c["incomplete"] == {"baseline": [], "candidate": []}
    assert cli.main(["compare", str(base), str(cand), "--only", str(tmp_path / "elsewhere.txt")]) == 2
    assert "--only " + str(tmp_path / "elsewhere.txt") + ": no such file" in capsys.readouterr().err
    make_runs(tmp_path / "other", [(0, "complete", "cpu", 6.9, 100.0)])
    assert cli.main(["compare", str(base), str(cand), "--only", *only, str(tmp_path / "other" / "seed0.txt")]) == 2
    assert "not a file of the paths given" in capsys.readouterr().err
    assert cli.main(["compare", str(base), str(cand), "--only", *only[:2]]) == 2
    assert f"{cand}: holds none of the files given with --only" in capsys.readouterr().err


def test_a_file_name_that_is_not_utf8_is_printed_escaped(tmp_path, capsysbinary):
    """A baseline file named `z\\xe9.txt` (not UTF-8) that duplicates another: the console note names it with a
    backslash escape, as `speedrun stats` does, instead of a UnicodeEncodeError after the files were written."""
    import os
    import shutil

    base, cand = tmp_path / "base", tmp_path / "cand"
    make_runs(base, [(i, "complete", "cpu", v, 100.0) for i, v in enumerate([6.9, 6.95, 6.85])])
    make_runs(cand, [(i, "complete", "cpu", v, 90.0) for i, v in enumerate([6.8, 6.85, 6.75])])
    try:
        shutil.copy(base / "seed0.txt", base / os.fsdecode(b"z\xe9.txt"))
    except (OSError, UnicodeEncodeError) as e:
        pytest.skip(f"this file system refuses a non-UTF-8 name: {e}")
    assert cli.main(["compare", str(base), str(cand), "--json-out", str(tmp_path / "c.json")]) == 0
    printed = capsysbinary.readouterr().out.decode("utf-8")
    assert f"{base}/z\\xe9.txt" in printed and "\udce9" not in printed
    assert json.loads((tmp_path / "c.json").read_text())["n_baseline"] == 3

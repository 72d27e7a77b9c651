"""`speedrun bundle`: the submission folder, its round trip (statistics parse back to the same numbers), the
scipy snippets it ships, and atomic writing."""

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from speedrun import cli
from speedrun.analysis.bundle_folder import build_bundle
from speedrun.analysis.group_stats import compute_stats
from speedrun.analysis.groups import collect_runs
from speedrun.analysis.parsed_files import parse_to_files
from speedrun.errors import SpeedrunError
from test_logs import REFERENCE, needs_reference, our_log, write
from test_stats import close_to_printed, published_rows

HEADER = {"git_commit": "c0ffee" * 6 + "beef", "git_dirty": "false", "train_data_sha256": "ab" * 32,
          "val_data_sha256": "cd" * 32, "val_tokens": 65536, "compile_s": 3.5}


def make_side(root: Path, side: str, finals, lr: float, extra=()) -> Path:
    """Our logs under root/train/<side>, parsed into root/parse/<side> (the pipeline's layout)."""
    for seed, final in enumerate(finals):
        end = "diverged" if final is None else "complete"
        text, _ = our_log(seed=seed, end=end, losses=[10.8, 9.0, 8.0, 7.5, final or 7.0], step_ms=100.0 + seed + lr,
                          config={"muon_lr": lr, "compile": False}, header=HEADER)
        write(root / "train" / side / f"seed{seed}.txt", text)
    for name in extra:  # byte copies: duplicates
        shutil.copy(root / "train" / side / "seed0.txt", root / "train" / side / name)
    for log in sorted((root / "train" / side).iterdir()):
        parse_to_files(str(log), None, str(root / "parse" / side / f"{log.stem}.json"))
    return root / "parse" / side


@pytest.fixture
def bundle(tmp_path):
    base = make_side(tmp_path, "baseline", [6.90, 6.95, 6.88, None], 0.05, extra=["seed9-copy.txt"])
    cand = make_side(tmp_path, "candidate", [6.80, 6.84, 6.79, 6.83], 0.04)
    out = tmp_path / "out" / "record"
    assert cli.main(["bundle", "--baseline", str(base), "--candidate", str(cand), "--out", str(out),
                     "--target", "7", "--title", "Muon lr 0.04"]) == 0
    return tmp_path, out


def test_layout_and_logs_byte_for_byte(bundle):
    root, out = bundle
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "baseline", "candidate"]
    for side in ("baseline", "candidate"):
        logs = sorted(p.name for p in (out / side).iterdir() if p.name != "statistics.md")
        assert logs == sorted(p.name for p in (root / "train" / side).iterdir())
        for name in logs:
            assert (out / side / name).read_bytes() == (root / "train" / side / name).read_bytes()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".tmp-")]
    assert (out / "README.md").read_text().startswith("# Muon lr 0.04\n")


def md_rows(text: str, pattern: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if re.match(pattern, line)]


def test_statistics_parse_back_to_the_same_numbers(bundle):
    """The run table of each statistics.md, read back, gives the test line printed under it, and both agree
    with the statistics of the original logs."""
    root, out = bundle
    for side in ("baseline", "candidate"):
        text = (out / side / "statistics.md").read_text()
        rows = md_rows(text.split("## Summary")[0], r"^\| seed\d")  # the run table: counted runs only
        losses = np.array([float(r[1]) for r in rows])
        times = np.array([float(r[2].removesuffix("ms")) for r in rows]) / 1000
        res = sps.ttest_1samp(losses, 7.0, alternative="less")
        line = (f"n={len(losses)} val_loss={losses.mean():.4f}±{losses.std(ddof=1):.4f} t={res.statistic:.3f} "
                f"p(mean<7)={res.pvalue:.4g} time={times.mean():.2f}±{times.std(ddof=1):.2f}s")
        assert f"\n    {line}\n" in text
        [original] = compute_stats([str(root / "parse" / side)], target=7.0)
        assert original.val_loss.n == len(losses) and original.test.p_value == pytest.approx(res.pvalue, rel=1e-12)
        [again] = compute_stats([str(out / side)], target=7.0)
        assert again.to_json()["val_loss_mean"] == original.to_json()["val_loss_mean"]
    base = (out / "baseline" / "statistics.md").read_text()
    assert "| seed3 | diverged | 2 |" in base  # the diverged run is listed, not counted
    assert "| baseline/seed9-copy.txt | baseline/seed0.txt | identical file |" in base
    assert "| seed0 | 0 | c0ffeec0ff | abababababab | cdcdcdcdcdcd | 65536 | 1 | 4096 | cpu | 3.5 |" in base


def test_readme_table_and_snippets(bundle, capsys):
    root, out = bundle
    readme = (out / "README.md").read_text()
    [base_row, cand_row] = md_rows(readme, r"^\| (Baseline|Candidate) \(")
    # the candidate reaches 7 but its 0.01 ms/step gain is noise: the README says it is no record claim
    claim = next(line for line in readme.splitlines() if line.startswith("> **Not a record claim"))
    assert "is not faster than the baseline at p < 0.01" in claim and "does not reach" not in claim
    groups = {side: compute_stats([str(root / "parse" / side)], target=7.0)[0].to_json()
              for side in ("baseline", "candidate")}
    for row, g in ((base_row, groups["baseline"]), (cand_row, groups["candidate"])):
        assert int(row[1]) == g["n"] and int(row[2]) == 4
        assert close_to_printed(g["train_time_mean_s"], row[3]) and close_to_printed(g["train_time_std_s"], row[4])
        assert close_to_printed(g["val_loss_mean"], row[7]) and close_to_printed(g["val_loss_std"], row[8])
    b = [r["train_time_ms"] / 1000 for r in groups["baseline"]["runs"]
         if r["status"] == "complete" and r["duplicate_of"] is None]
    c = [r["train_time_ms"] / 1000 for r in groups["candidate"]["runs"]]
    welch = sps.ttest_ind(c, b, equal_var=False, alternative="less")
    assert close_to_printed(np.mean(c) - np.mean(b), cand_row[5]) and float(cand_row[6]) == float(f"{welch.pvalue:.4g}")
    # every snippet prints the line the README says it prints: both one-sample tests, both Welch lines
    blocks = re.findall(r"prints `([^`]+)`:\n\n```python\n(.*?)```", readme, re.S)
    assert len(blocks) == 4
    for line, code in blocks:
        exec(compile(code, "README.md", "exec"), {})
        assert capsys.readouterr().out.strip() == line
    welch_lines = [line for line, _ in blocks[2:]]
    assert [line.split(":")[0] for line in welch_lines] == ["train_time_s", "val_loss"]
    for line in welch_lines:
        assert f"\n    {line}\n" in readme                   # the Results section's Welch line itself
    # the val_loss Welch line against scipy on the counted runs (the copy seed9-copy.txt and seed3 left out)
    bl = [r["val_loss"] for r in groups["baseline"]["runs"] if r["status"] == "complete" and r["duplicate_of"] is None]
    cl = [r["val_loss"] for r in groups["candidate"]["runs"]]
    loss = sps.ttest_ind(cl, bl, equal_var=False, alternative="less")
    assert (sorted(bl), sorted(cl)) == ([6.88, 6.9, 6.95], [6.79, 6.8, 6.83, 6.84])
    assert welch_lines[1] == (f"val_loss: diff={np.mean(cl) - np.mean(bl):.4f} t={loss.statistic:.3f} "
                              f"dof={loss.df:.1f} p={loss.pvalue:.4g}")
    assert "| validation tokens | note |" in readme and "VIOLATION" not in readme


def test_out_must_be_new_and_failures_leave_nothing(tmp_path):
    base = make_side(tmp_path, "baseline", [6.90, 6.95, 6.88], 0.05)
    cand = make_side(tmp_path, "candidate", [6.80, 6.84, 6.79], 0.04)
    taken = write(tmp_path / "taken" / "keep.txt", "mine\n").parent
    with pytest.raises(SpeedrunError, match="exists and is not an empty folder"):
        build_bundle(str(base), str(cand), taken)
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]
    (tmp_path / "empty").mkdir()
    assert build_bundle(str(base), str(cand), tmp_path / "empty", target=7.0).joinpath("README.md").is_file()
    (tmp_path / "train" / "candidate" / "seed1.txt").write_text("edited after parsing\n")
    with pytest.raises(SpeedrunError, match="changed since it was parsed"):
        build_bundle(str(base), str(cand), tmp_path / "new", target=7.0)
    assert not (tmp_path / "new").exists() and not list(tmp_path.glob(".tmp-*"))


@needs_reference
def test_reference_bundle_reproduces_the_published_rows(tmp_path):
    folder = REFERENCE / "2026-05-20_BigramsSignTrick"
    out = build_bundle(str(folder / "baseline"), str(folder / "pr299"), tmp_path / "bundle")
    readme = (out / "README.md").read_text()
    published = dict(published_rows())
    for side, directory in (("Baseline", "baseline"), ("Candidate", "pr299")):
        [row] = md_rows(readme, rf"^\| {side} \({directory}\)")
        n, steps, mean, std, p, time_mean, time_std = published[f"2026-05-20_BigramsSignTrick/{directory}"]
        assert (row[1], row[2]) == (n, steps)
        assert abs(float(row[3]) - float(time_mean)) <= 1e-4 and abs(float(row[4]) - float(time_std)) <= 1e-4
        assert abs(float(row[10].split()[0]) - float(p)) <= 0.5e-4
        assert len(collect_runs([str(out / directory.replace("pr299", "candidate"))])[0].counted) == int(n)
    published_md = (folder / "pr299" / "statistics.md").read_text()
    ours = (out / "candidate" / "statistics.md").read_text()
    for line in published_md.splitlines():
        if re.match(r"^\| (val_loss mean|train_time mean \(ms\)) \|", line):
            cells = line.split("|")[2:]
            assert "|" + "|".join(cells) in ours, line


def test_only_bundles_the_files_listed(tmp_path):
    """`--only` (the workflow's configured seeds): a stale run of a removed seed is neither copied nor counted."""
    base = make_side(tmp_path, "baseline", [6.90, 6.95, 6.88], 0.05)
    cand = make_side(tmp_path, "candidate", [6.80, 6.84, 6.79, 6.83], 0.04)
    only = [str(base / f"seed{i}.json") for i in (0, 1)] + [str(cand / f"seed{i}.json") for i in (0, 1, 2)]
    out = tmp_path / "out" / "record"
    assert cli.main(["bundle", "--baseline", str(base), "--candidate", str(cand), "--out", str(out),
                     "--target", "7", "--only", *only]) == 0
    assert sorted(p.name for p in (out / "baseline").iterdir()) == ["seed0.txt", "seed1.txt", "statistics.md"]
    assert sorted(p.name for p in (out / "candidate").iterdir()) == ["seed0.txt", "seed1.txt", "seed2.txt",
                                                                     "statistics.md"]
    [base_stats] = compute_stats([str(out / "baseline")], target=7.0)
    assert base_stats.val_loss.n == 2 and base_stats.val_loss.mean == pytest.approx((6.90 + 6.95) / 2)
    stray = tmp_path / "x.json"
    stray.write_text("{}")
    with pytest.raises(SpeedrunError, match="not a file of the paths given"):
        build_bundle(str(base), str(cand), tmp_path / "other", target=7.0, only=[str(stray)])
    assert cli.main(["bundle", "--baseline", str(base), "--candidate", str(cand), "--out", str(tmp_path / "o2"),
                     "--target", "-1"]) == 2


def test_a_candidate_with_too_few_runs_is_not_decided_rather_than_short_of_the_target(tmp_path):
    """Two complete runs below the target (6.80, 6.84 < 7): too few for the record rule's reading of a p-value,
    so the README says the target is not decided and why, not that it is missed."""
    base = make_side(tmp_path, "baseline", [6.90, 6.95, 6.88], 0.05)
    cand = make_side(tmp_path, "candidate", [6.80, 6.84], 0.04)
    out = tmp_path / "out" / "record"
    assert cli.main(["bundle", "--baseline", str(base), "--candidate", str(cand), "--out", str(out),
                     "--target", "7"]) == 0
    claim = next(line for line in (out / "README.md").read_text().splitlines()
                 if line.startswith("> **Not a record claim"))
    [cand_stats] = compute_stats([str(cand)], target=7.0)
    assert cand_stats.reaches_target is None and cand_stats.val_loss.n == 2
    assert f"has not shown the target 7: not decided ({cand_stats.p_value_note})" in claim
    assert "does not reach" not in claim


def test_a_candidate_without_train_time_is_told_why_speed_is_not_compared():
    """Counted candidate runs without a train_time (llm.c logs): the README's reasons say which runs lack a time,
    not 'is not faster ... (p = –)'."""
    from speedrun.analysis.bundle_readme import not_a_record_reasons
    from speedrun.analysis.comparison import compare_groups
    from speedrun.analysis.group_stats import group_stats
    from speedrun.analysis.groups import Group
    from test_stats import record

    base = Group("b", "b", "b", tuple(record(f"b{i}.txt", v, t) for i, (v, t) in
                                      enumerate([(6.90, 100.0), (6.95, 102.0), (6.92, 101.0)])))
    cand = Group("c", "c", "c", tuple(record(f"c{i}.txt", v, None) for i, v in enumerate([6.80, 6.83, 6.79])))
    reasons = not_a_record_reasons(group_stats(cand, 7.0), compare_groups(base, cand, 0.01, 7.0))
    assert reasons == ["is not compared for speed with the baseline (no train_time in 3 of 3 candidate runs: a "
                       "t-test needs at least 2 timed runs per sample)"]


def test_the_runs_section_counts_a_copy_of_a_diverged_log_once(tmp_path):
    """A byte copy of a diverged log is diverged and a duplicate: the README's accounting of the side's logs
    counts it among the diverged runs only, so the parts add up to the number of logs (5 = 3 + 2)."""
    base = make_side(tmp_path, "baseline", [None, 6.90, 6.95, 6.88], 0.05, extra=["seed0-copy.txt"])
    cand = make_side(tmp_path, "candidate", [6.80, 6.84, 6.79], 0.04, extra=["seed0-copy.txt"])
    out = tmp_path / "out" / "record"
    assert cli.main(["bundle", "--baseline", str(base), "--candidate", str(cand), "--out", str(out),
                     "--target", "7"]) == 0
    readme = (out / "README.md").read_text()
    assert "- `baseline/`: 5 log(s), 3 counted, 2 diverged; `statistics.md` lists every run." in readme
    # a copy of a complete log still counts once
    assert "- `candidate/`: 4 log(s), 3 counted, 1 duplicate(s) counted once;" in readme


IDENTICAL = ("> **Warning**: {n} identical run(s) on both sides (same file or loss curve): the samples are not "
             "independent.")


def _warning_block(readme: str) -> list[str]:
    """The quoted lines between the title and the first section."""
    return [line for line in readme.split("## Results")[0].splitlines() if line.startswith(">")]


def test_the_readme_warns_about_a_log_on_both_sides(tmp_path):
    """A baseline log copied into the candidate's folder: the comparison's warning (1 identical run on both
    sides, what `speedrun compare` lists) is in the README's warning block; a folder bundled against itself
    warns of all its runs."""
    from speedrun.analysis.comparison import compare_groups, one_group

    base = make_side(tmp_path, "baseline", [6.90, 6.95, 6.88], 0.05)
    cand = make_side(tmp_path, "candidate", [6.80, 6.84, 6.79], 0.04)
    shutil.copy(tmp_path / "train" / "baseline" / "seed1.txt", tmp_path / "train" / "candidate" / "from-base.txt")
    parse_to_files(str(tmp_path / "train" / "candidate" / "from-base.txt"), None, str(cand / "from-base.json"))
    out = tmp_path / "out" / "record"
    assert cli.main(["bundle", "--baseline", str(base), "--candidate", str(cand), "--out", str(out),
                     "--target", "7"]) == 0
    readme = (out / "README.md").read_text()
    block = _warning_block(readme)
    # the same warnings as speedrun compare gives for these runs (no rule violated here)
    c = compare_groups(one_group(str(base), "B"), one_group(str(cand), "C"), 0.01, 7.0)
    assert c.warnings == ("1 identical run(s) on both sides (same file or loss curve): the samples are not "
                          "independent",)
    assert block[0] == IDENTICAL.format(n=1)
    assert "- `candidate/`: 4 log(s), 4 counted; `statistics.md` lists every run." in readme
    # a folder against itself: every counted run is on both sides
    same = tmp_path / "out" / "same"
    assert cli.main(["bundle", "--baseline", str(base), "--candidate", str(base), "--out", str(same),
                     "--target", "7"]) == 0
    assert _warning_block((same / "README.md").read_text())[0] == IDENTICAL.format(n=3)


def test_the_readme_lists_rule_violations_and_runs_without_time_too(tmp_path):
    """Every warning of the comparison, in its order: the violated rules in one line, then the others."""
    from speedrun.analysis.bundle_readme import warning_lines
    from speedrun.analysis.comparison import compare_groups
    from speedrun.analysis.groups import Group
    from test_stats import record

    base = Group("b", "b", "b", tuple(replace_gpu(record(f"b{i}.txt", v, t), "H100")
                                      for i, (v, t) in enumerate([(6.90, 100.0), (6.95, 102.0), (6.92, 101.0)])))
    cand = Group("c", "c", "c", tuple(replace_gpu(record(f"c{i}.txt", v, t), "A100")
                                      for i, (v, t) in enumerate([(6.80, None), (6.83, 90.0), (6.79, 91.0)])))
    c = compare_groups(base, cand, 0.01, 7.0)
    rule_warnings = [w for w in c.warnings if w.startswith("rule violated: ")]
    others = [w for w in c.warnings if not w.startswith("rule violated: ")]
    assert rule_warnings and others == ["some counted runs have no train_time (llm.c logs); train_time uses the "
                                        "others"]
    lines = warning_lines(c)
    assert lines[0].startswith(f"> **Warning: {len(rule_warnings)} rule(s) violated**: GPUs (")
    assert lines[1:] == ["", f"> **Warning**: {others[0]}.", ""]


def replace_gpu(run, gpu):
    from dataclasses import replace

    return replace(run, gpu=gpu, gpu_count=1)


def test_logs_of_records_parsed_in_another_folder_are_found(tmp_path, monkeypatch):
    """`cd rel; speedrun parse logs/<side>/seedN.txt --json parsed/<side>/seedN.json`: the records name their logs
    relative to rel/. Bundled from elsewhere, each log is found from the .json's folder upwards (the one with
    the parsed content, not an unrelated file at the same relative path from here); a missing log is named
    with its .json and every path tried."""
    rel = tmp_path / "rel"
    for side, lr, finals in (("base", 0.05, [6.90, 6.95, 6.88]), ("cand", 0.04, [6.80, 6.84, 6.79])):
        for seed, final in enumerate(finals):
            text, _ = our_log(seed=seed, losses=[10.8, 9.0, 8.0, 7.5, final], step_ms=100.0 + seed + lr,
                              config={"muon_lr": lr, "compile": False}, header=HEADER)
            write(rel / "logs" / side / f"seed{seed}.txt", text)
    monkeypatch.chdir(rel)
    for log in sorted((rel / "logs").glob("*/*.txt")):
        side = log.parent.name
        assert cli.main(["parse", f"logs/{side}/{log.name}", "--json", f"parsed/{side}/{log.stem}.json"]) == 0
    elsewhere = tmp_path / "elsewhere"
    write(elsewhere / "logs" / "base" / "seed0.txt", "another file at the same relative path\n")
    monkeypatch.chdir(elsewhere)
    out = tmp_path / "bundle"
    assert cli.main(["bundle", "--baseline", str(rel / "parsed" / "base"), "--candidate",
                     str(rel / "parsed" / "cand"), "--out", str(out), "--target", "7"]) == 0
    for side, folder in (("baseline", "base"), ("candidate", "cand")):
        for seed in range(3):
            log = rel / "logs" / folder / f"seed{seed}.txt"
            assert (out / side / log.name).read_bytes() == log.read_bytes()
    (rel / "logs" / "cand" / "seed2.txt").unlink()
    with pytest.raises(SpeedrunError) as e:
        build_bundle(str(rel / "parsed" / "base"), str(rel / "parsed" / "cand"), tmp_path / "b2", target=7.0)
    msg = str(e.value)
    assert msg.startswith(f"logs/cand/seed2.txt: cannot find the training log of run logs/cand/seed2.txt named by "
                          f"{rel / 'parsed' / 'cand' / 'seed2.json'}: tried logs/cand/seed2.txt (No such file or "
                          f"directory); {rel / 'parsed' / 'cand' / 'logs/cand/seed2.txt'} (No such file or directory)"
                          f"; {rel / 'parsed' / 'logs/cand/seed2.txt'} (No such file or directory); "
                          f"{rel / 'logs/cand/seed2.txt'} (No such file or directory); ")
    assert not (tmp_path / "b2").exists() and not list(tmp_path.glob(".tmp-*"))


def test_the_workflow_layout_bundles_from_any_folder(tmp_path, monkeypatch):
    """results/parse/<variant>/seedN.json names results/train/<variant>/seedN.txt (parsed at the project root):
    found from another current folder too."""
    root = tmp_path / "project"
    base = make_side(root / "results", "baseline", [6.90, 6.95, 6.88], 0.05)
    cand = make_side(root / "results", "candidate", [6.80, 6.84, 6.79], 0.04)
    for record in [*base.glob("*.json"), *cand.glob("*.json")]:       # as the parse rule writes them
        text = record.read_text()
        record.write_text(text.replace(str(root) + "/", ""))
    assert '"file": "results/train/baseline/seed0.txt"' in (base / "seed0.json").read_text()
    monkeypatch.chdir(tmp_path)
    out = build_bundle(str(base), str(cand), tmp_path / "bundle", target=7.0)
    assert (out / "candidate" / "seed2.txt").read_bytes() == (root / "results/train/candidate/seed2.txt").read_bytes()


@needs_reference
def test_reference_bundle_warns_about_a_baseline_log_among_the_candidates(tmp_path):
    """2026-05-20_BigramsSignTrick with one baseline log copied among pr299's: the README says so."""
    folder = REFERENCE / "2026-05-20_BigramsSignTrick"
    cand = tmp_path / "pr299"
    shutil.copytree(folder / "pr299", cand)
    shutil.copy(next(iter(sorted((folder / "baseline").glob("*.txt")))), cand / "from-baseline.txt")
    out = build_bundle(str(folder / "baseline"), str(cand), tmp_path / "bundle")
    assert IDENTICAL.format(n=1) in _warning_block((out / "README.md").read_text())


def test_a_file_that_is_not_a_run_is_named_as_not_bundled(tmp_path, capsys):
    """A .txt that is no training log (a modded log cut inside its code dump reads so) and a README in the
    candidate's log folder: the .txt is named with its reason in the README's run accounting and on the
    console (it was dropped silently); the README.md stays quiet, as in speedrun stats."""
    base = make_side(tmp_path, "baseline", [6.90, 6.95, 6.88], 0.05)
    make_side(tmp_path, "candidate", [6.80, 6.84, 6.79], 0.04)
    logs = tmp_path / "train" / "candidate"
    write(logs / "cut.txt", "import torch\nimport os\n")
    write(logs / "README.md", "# notes\n")
    out = tmp_path / "bundle"
    assert cli.main(["bundle", "--baseline", str(tmp_path / "train" / "baseline"), "--candidate", str(logs),
                     "--out", str(out), "--target", "7"]) == 0
    printed = capsys.readouterr().out.splitlines()
    line = "- not bundled from `candidate/`: cut.txt (not a training log (no 'speedrun:' header, no step:/s: lines"
    assert len(printed) == 2 and printed[0].startswith(line) and printed[1] == f"bundle written to {out}"
    readme = (out / "README.md").read_text()
    assert printed[0] in readme.split("## Runs", 1)[1].splitlines() and "README.md (" not in readme
    assert sorted(p.name for p in (out / "candidate").iterdir()) == ["seed0.txt", "seed1.txt", "seed2.txt",
                                                                   "statistics.md"]
    assert base.is_dir()

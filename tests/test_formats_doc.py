"""docs/formats.md documents every key that parse, stats and compare write (the file contract)."""

import re
from pathlib import Path

from speedrun.analysis.comparison import compare_groups, one_group
from speedrun.analysis.group_stats import compute_stats
from speedrun.analysis.logs import read_record
from test_logs import our_log, write

DOC = (Path(__file__).resolve().parents[1] / "docs" / "formats.md").read_text()


def section(title: str) -> str:
    return DOC.split(f"\n## {title}", 1)[1].split("\n## ", 1)[0]


def documented(keys, text):
    return sorted(k for k in keys if not re.search(rf"`{re.escape(k)}`", text))


def make(tmp_path):
    for side, final in (("b", 6.9), ("c", 6.8)):
        for seed in range(3):
            text, _ = our_log(seed=seed, losses=[10.8, 9.0, 8.0, 7.5, final + seed / 100],
                              header={"git_commit": "ab" * 20, "git_dirty": "false", "val_tokens": 65536})
            write(tmp_path / side / f"seed{seed}.txt", text)


def test_parsed_run_keys_are_documented(tmp_path):
    make(tmp_path)
    record = read_record(tmp_path / "b" / "seed0.txt").to_json()
    assert documented(record, section("Parsed run")) == []
    assert documented(record["versions"], section("Parsed run")) == []


def test_summary_and_comparison_keys_are_documented(tmp_path):
    make(tmp_path)
    [s] = compute_stats([str(tmp_path / "b")], target=7.0)
    out = s.to_json()
    stats_doc = section("Statistics")
    assert documented(out, stats_doc) == []
    assert documented(out["runs"][0], stats_doc) == []
    assert documented(out["z_rule"], stats_doc) == []
    c = compare_groups(one_group(str(tmp_path / "b"), "B"), one_group(str(tmp_path / "c"), "C"), target=7.0).to_json()
    compare_doc = stats_doc.split("### Comparison", 1)[1]
    assert documented(c, compare_doc) == []
    assert documented(c["val_loss"], compare_doc) == [] and documented(c["train_time"], compare_doc) == []
    assert documented(c["speedup"], compare_doc) == [] and documented(c["z_rule"]["baseline"], compare_doc) == []
    assert documented(c["rules"][0], compare_doc) == []
    assert all(f"`{r['rule']}`" in compare_doc for r in c["rules"])


def test_report_runs_csv_columns_are_documented(tmp_path):
    from speedrun.analysis.parsed_files import parse_to_files
    from speedrun.analysis.report_inputs import load_runs, mark_counted

    make(tmp_path)
    parse_to_files(str(tmp_path / "b" / "seed0.txt"), str(tmp_path / "p" / "seed0.csv"),
                   str(tmp_path / "p" / "seed0.json"))
    runs, _ = load_runs([tmp_path / "p" / "seed0.json"])
    runs = mark_counted(runs, summary=[])
    assert list(runs.columns)[-2:] == ["duplicate_of", "counted"]
    assert documented(runs.columns, section("Report")) == []

"""The log parser: every era of the public speedrun logs, llm.c logs, and our own log format."""

import argparse
import hashlib
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from speedrun.analysis.logs import METRIC_COLUMNS, RunRecord, parse_log, read_record, sniff_format
from speedrun.errors import SpeedrunError

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference-logs"
SEP = "=" * 100
needs_reference = pytest.mark.skipif(not REFERENCE.is_dir(), reason="../shared/reference-logs is absent")


# ---------------------------------------------------------------------------------------------------------
# Our own format (docs/formats.md "Training log"), written here independently of the parser.

def our_log(*, steps=4, val_every=2, seed=0, variant="baseline", device="cpu", world_size=1, losses=None,
            end="complete", step_ms=100.0, header=None, config=None):
    """Text of one of our training logs. ``end``: complete | diverged | failed | truncated. ``header``: extra
    ``key: value`` lines (provenance) written before the ``Running ...`` lines; ``config``: the config mapping."""
    config = json.dumps(config or {"steps": steps, "muon_lr": 0.05, "compile": False})  # no seed in config
    lines = ["speedrun: 0.1.0", f"variant: {variant}", f"seed: {seed}", f"config: {config}",
             f"world_size: {world_size}", "tokens_per_step: 4096", f"device: {device}",
             *(f"{k}: {v}" for k, v in (header or {}).items()),
             "Running Python 3.11.7 (main, May  9 2026, 07:35:25) [GCC 12.2.0]",
             "Running PyTorch 2.13.0+cpu compiled for CUDA None", SEP]
    losses = losses or [10.8 - 0.5 * s for s in range(steps + 1)]
    last = steps if end != "truncated" else steps - 1
    for s in range(last + 1):
        t = s * step_ms
        if s > 0:
            lines.append(f"step:{s}/{steps} train_loss:{losses[s] + 0.05:.4f} train_time:{t:.0f}ms "
                         f"step_avg:{t / s:.2f}ms")
        if end == "diverged" and s == 2:
            lines[-1] = f"step:{s}/{steps} train_loss:nan train_time:{t:.0f}ms step_avg:{t / s:.2f}ms"
            lines.append(f"run diverged: non-finite train_loss at step {s}")
            break
        if end == "failed" and s == 3:
            lines.append("run failed: RuntimeError: out of memory")
            break
        if s % val_every == 0 or s == steps:
            lines.append(f"step:{s}/{steps} val_loss:{losses[s]:.4f} train_time:{t:.0f}ms "
                         f"step_avg:{t / max(s, 1):.2f}ms")
    if end in ("complete", "truncated"):
        lines.append("peak memory allocated: 123 MiB reserved: 130 MiB")
    return "\n".join(lines) + "\n", config


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_our_complete_log(tmp_path):
    text, config = our_log(steps=4, val_every=2, seed=7, variant="cand", losses=[10.8, 9.0, 8.0, 7.5, 7.25])
    parsed = parse_log(write(tmp_path / "seed7.txt", text))
    r = parsed.record
    assert (r.format, r.status, r.steps, r.last_step) == ("speedrun", "complete", 4, 4)
    assert (r.val_loss, r.train_time_ms, r.step_avg_ms) == (7.25, 400.0, 100.0)
    assert (r.seed, r.variant, r.world_size, r.gpu, r.gpu_count) == (7, "cand", 1, None, 0)
    assert r.code_hash == hashlib.sha256(config.encode()).hexdigest()
    assert r.peak_memory_mib == 123 and r.versions == {"python": "3.11.7", "torch": "2.13.0+cpu"}  # CPU build: no CUDA
    m = parsed.metrics
    assert list(m.columns) == list(METRIC_COLUMNS)
    assert list(m["kind"]) == ["val", "train", "train", "val", "train", "train", "val"]
    assert list(m["step"]) == [0, 1, 2, 2, 3, 4, 4]
    assert list(m.loc[m.kind == "val", "val_loss"]) == [10.8, 8.0, 7.25]
    assert list(m.loc[m.kind == "train", "train_loss"]) == pytest.approx([9.05, 8.05, 7.55, 7.30])
    assert m.loc[m.kind == "train", "val_loss"].isna().all() and m.loc[m.kind == "val", "train_loss"].isna().all()


def test_our_gpu_device_header(tmp_path):
    text, _ = our_log(device="NVIDIA H200 x 4", world_size=4)
    r = read_record(write(tmp_path / "a.txt", text))
    assert (r.gpu, r.gpu_count, r.world_size) == ("NVIDIA H200", 4, 4)


@pytest.mark.parametrize("end, status, reason", [
    ("diverged", "diverged", "run diverged: non-finite train_loss at step 2"),
    ("failed", "failed", "run failed: RuntimeError: out of memory"),
    ("truncated", "truncated", "log ends at step 3 of 4 without the final val_loss line"),
])
def test_our_incomplete_logs(tmp_path, end, status, reason):
    text, _ = our_log(steps=4, end=end)
    r = read_record(write(tmp_path / f"{end}.txt", text))
    assert (r.status, r.reason) == (status, reason)
    assert r.val_loss is None and r.train_time_ms is None and r.step_avg_ms is None


def test_nonfinite_val_loss_without_message_is_diverged(tmp_path):
    text, _ = our_log(steps=2, val_every=1)
    text = text.replace("step:2/2 val_loss:9.8000", "step:2/2 val_loss:nan")
    r = read_record(write(tmp_path / "nan.txt", text))
    assert (r.status, r.reason, r.val_loss) == ("diverged", "non-finite val_loss at step 2", None)


def test_bad_header_value_is_named(tmp_path):
    text, _ = our_log()
    with pytest.raises(SpeedrunError, match="seed: x"):
        read_record(write(tmp_path / "bad.txt", text.replace("seed: 0", "seed: x")))


def test_parse_cli_writes_csv_and_json(tmp_path, capsys):
    from speedrun import parse

    text, _ = our_log(steps=4, val_every=2)
    log = write(tmp_path / "train" / "seed0.txt", text)
    out_csv, out_json = tmp_path / "parse" / "seed0.csv", tmp_path / "parse" / "seed0.json"
    assert parse.main(argparse.Namespace(log=str(log), csv=str(out_csv), json=str(out_json), seed=None)) == 0
    assert capsys.readouterr().out == ""
    header = out_csv.read_text().splitlines()[0]
    assert header == "step,total_steps,kind,train_loss,val_loss,train_time_ms,step_avg_ms"
    table = pd.read_csv(out_csv)
    naive = [line for line in text.splitlines() if line.startswith("step:")]
    assert len(table) == len(naive)
    assert table.loc[0].isna().tolist() == [False, False, False, True, False, False, False]
    record = json.loads(out_json.read_text())
    assert record["status"] == "complete" and record["val_loss"] == 8.8 and record["file"] == str(log)
    assert RunRecord.from_json(record) == read_record(log)
    assert not list(out_csv.parent.glob(".tmp-*"))
    parse.main(argparse.Namespace(log=str(log), csv=None, json=None, seed=None))
    assert json.loads(capsys.readouterr().out) == record


# ---------------------------------------------------------------------------------------------------------
# Synthetic logs of the public speedrun's eras (speedrun-spec.md table 4.2).

def modded_log(*, leading_sep=False, dataloader=False, train_loss=True, grace=False, python="Python",
               peak="allocated", steps=20, extra_body=(), final=True, gpus=8):
    code = ["import os", "code = open(sys.argv[0]).read()",
            'print0(f"step:{step}/{train_steps} val_loss:{val_loss:.4f} train_time:{t:.0f}ms step_avg:{a:.2f}ms")',
            '"""docstring example:', "step:1/20 val_loss:1.0000 train_time:5ms step_avg:5.00ms", '"""',
            "peak memory allocated: 1 MiB reserved: 1 MiB", "run failed: in a comment"]
    smi = ["nvidia-smi:", "+-----+", "| GPU  Name                 Persistence-M | Bus-Id |",
           "|=====+"] + [f"|   {i}  NVIDIA H100 80GB HBM3          On  |   00000000:18:00.0 Off |" for i in range(gpus)]
    smi += ["| Processes:  |", "|    0   N/A  N/A    132603      C   /usr/bin/python3      0MiB |"]
    meta = [f"Running {python} 3.12.7 (main, Jan 17 2025)", "Running PyTorch 2.7.0 compiled for CUDA 12.6"] + smi
    blocks = ([SEP] if leading_sep else []) + code + [SEP] + meta + [SEP]
    if dataloader:
        blocks += ["Training DataLoader: total number of tokens: 1800000000 across 18 files", SEP]
    body = list(extra_body)

    def timing(k):  # (train_time ms, step_avg text) at step k; the grace era restarts the timer at step 11
        t = ((k - 10) * 100 if k > 10 else 40000 + k * 100) if grace else k * 100
        avg = "nan" if grace and k <= 12 else f"{t / max(k - 10 * grace, 1):.2f}"
        return t, avg

    for s in range(steps + 1):
        if s % 10 == 0 and (final or s < steps):
            t, avg = timing(s)
            body.append(f"step:{s}/{steps} val_loss:{5 - s / 10:.4f} train_time:{t}ms step_avg:{avg}ms")
        if s < steps:
            t, avg = timing(s + 1)
            loss = f"train_loss:{5 - s / 10:.4f} " if train_loss else ""
            body.append(f"step:{s + 1}/{steps} {loss}train_time:{t}ms step_avg:{avg}ms")
    if peak == "allocated":
        body.append("peak memory allocated: 37653 MiB reserved: 39236 MiB")
    elif peak == "consumption":
        body.append("peak memory consumption: 37653 MiB")
    return "\n".join(blocks + body) + "\n"


@pytest.mark.parametrize("kwargs", [
    dict(leading_sep=True, dataloader=True, python="pytorch"),
    dict(leading_sep=False, train_loss=False, grace=True, peak="consumption", python="python"),
    dict(extra_body=["Created 4 gradient buckets", "Bucket 0: 12 params, 3.5 MB", "RUN_ID=abc",
                     "Model parameters:", "  Total parameters: 1,234,567",
                     "embed.weight: torch.Size([50304, 768]) torch.float32", "Resetting Model"]),
])
def test_modded_eras(tmp_path, kwargs):
    r = read_record(write(tmp_path / "NorMuon", modded_log(**kwargs)))  # extension-less, as one public log
    assert (r.format, r.status, r.steps, r.last_step, r.val_loss) == ("modded", "complete", 20, 20, 3.0)
    assert (r.gpu, r.gpu_count) == ("NVIDIA H100 80GB HBM3", 8)
    expected_time = 1000 if kwargs.get("grace") else 2000  # timer reset at step 11 in the grace era
    assert r.train_time_ms == expected_time
    assert r.peak_memory_mib == (None if kwargs.get("peak") == "none" else 37653)
    assert r.versions["torch"] == "2.7.0" and r.versions["cuda"] == "12.6"


def test_code_dump_strings_are_not_metrics(tmp_path):
    parsed = parse_log(write(tmp_path / "x.txt", modded_log(steps=20)))
    assert parsed.record.status == "complete"  # the dump's "run failed" line is not the run's
    assert (parsed.metrics["val_loss"] == 1.0).sum() == 0
    assert len(parsed.metrics) == 20 + 3


def test_untimed_steps_have_nan_step_avg(tmp_path):
    m = parse_log(write(tmp_path / "x.txt", modded_log(grace=True))).metrics
    train = m[m.kind == "train"].set_index("step")
    assert train.loc[1:12, "step_avg_ms"].isna().all() and train.loc[13:, "step_avg_ms"].notna().all()


def test_modded_truncated_and_single_gpu(tmp_path):
    r = read_record(write(tmp_path / "t.txt", modded_log(final=False, peak="none", gpus=1)))
    assert (r.status, r.steps, r.last_step, r.val_loss, r.gpu_count) == ("truncated", 20, 20, None, 1)


def test_code_hash_is_that_of_the_code_dump(tmp_path):
    text = modded_log()
    code = text[:text.index(SEP)]
    assert read_record(write(tmp_path / "a.txt", text)).code_hash == hashlib.sha256(code.encode()).hexdigest()
    other = text.replace("Running PyTorch 2.7.0", "Running PyTorch 2.8.0")
    assert read_record(write(tmp_path / "b.txt", other)).code_hash == hashlib.sha256(code.encode()).hexdigest()


def test_crlf_line_endings(tmp_path):
    path = tmp_path / "crlf.txt"
    path.write_bytes(modded_log().replace("\n", "\r\n").encode())
    r = read_record(path)
    assert (r.status, r.val_loss, r.train_time_ms) == ("complete", 3.0, 2000.0)


def test_llmc_format(tmp_path):
    lines = ["s:0 tel:11.0092", "s:0 trl:10.0000 lr:0.000001 norm:15.37", "s:1 trl:9.9000 lr:0.000002 norm:15.24",
             "s:2 tel:9.7500", "s:2 trl:9.8000 lr:0.000003 norm:14.84", "s:3 tel:9.2500"]
    complete = read_record(write(tmp_path / "main.log", "\n".join(lines) + "\n"))
    assert (complete.format, complete.status, complete.steps, complete.last_step) == ("llmc", "complete", 3, 3)
    assert complete.val_loss == 9.25 and complete.train_time_ms is None and complete.gpu_count is None
    metrics = parse_log(tmp_path / "main.log").metrics
    assert list(metrics["kind"]) == ["val", "train", "train", "val", "train", "val"]
    assert list(metrics["total_steps"]) == [3] * 6
    cut = read_record(write(tmp_path / "cut.log", "\n".join(lines[:5]) + "\n"))
    assert (cut.status, cut.steps, cut.last_step, cut.val_loss) == ("truncated", None, 2, None)
    assert parse_log(tmp_path / "cut.log").metrics["total_steps"].isna().all()


def llmc_lines(last_step, val_every):
    """An llm.c log as llm.c writes it (module docstring of speedrun.analysis.logs): a val line at step 0, every
    ``val_every`` steps and at ``last_step``, train lines 0 .. last_step - 1; losses 10 - step / 100."""
    lines = []
    for s in range(last_step + 1):
        if s % val_every == 0 or s == last_step:
            lines.append(f"s:{s} tel:{10 - s / 100:.4f}")
        if s < last_step:
            lines.append(f"s:{s} trl:{10 - s / 100 + 0.05:.4f}")
    return lines


def test_llmc_run_cut_after_a_periodic_validation_is_truncated(tmp_path):
    """A run cut right after a validation at a multiple of the interval ends as a finished run does (a tel one
    step after the last trl): it is truncated, with the step and the interval named; a finished run's final
    tel (step 7, interval 3) is off the interval."""
    finished = llmc_lines(7, 3)                      # tel at 0, 3, 6, 7
    r = read_record(write(tmp_path / "done.log", "\n".join(finished) + "\n"))
    assert (r.status, r.steps, r.last_step, r.val_loss, r.reason) == ("complete", 7, 7, 9.93, None)
    cut = finished[:finished.index("s:6 tel:9.9400") + 1]
    assert cut[-2].startswith("s:5 trl:")            # one step after the last trl, as the final tel
    r = read_record(write(tmp_path / "cut.log", "\n".join(cut) + "\n"))
    assert (r.status, r.steps, r.last_step, r.val_loss) == ("truncated", None, 6, None)
    assert r.reason == ("log ends at step 6 with a val line at a multiple of the validation interval 3, as periodic "
                        "validations are: the run may have been cut there; expected the final 's:N tel:' line off "
                        "that interval, at N = the last 'trl' step + 1 (llm.c logs state no total step count)")
    assert parse_log(tmp_path / "cut.log").metrics["total_steps"].isna().all()
    only_first = llmc_lines(5, 10)                   # tel at 0 and 5: the interval is unknown
    r = read_record(write(tmp_path / "short.log", "\n".join(only_first) + "\n"))
    assert (r.status, r.last_step) == ("truncated", 5) and "validation interval is unknown" in r.reason


@needs_reference
@pytest.mark.parametrize("rel, cut_at, interval", [
    ("2024-10-13_llmc/main.log", 19500, 250),
    ("2024-06-06_AdamW/f66d43d7-e449-4029-8adf-e8537bab49ea.log", 9472, 128),
])
def test_llmc_reference_log_cut_after_a_periodic_validation(tmp_path, rel, cut_at, interval):
    """`head -n K` of the two public llm.c logs, K the line of a periodic `tel` (19579 for main.log): not
    complete, although its last line is a tel one step after the last trl, as in the full log."""
    lines = (REFERENCE / rel).read_text().splitlines()
    k = lines.index(next(line for line in lines if line.startswith(f"s:{cut_at} tel:"))) + 1
    assert lines[k - 2].startswith(f"s:{cut_at - 1} trl:")
    r = read_record(write(tmp_path / "still_running.log", "\n".join(lines[:k]) + "\n"))
    assert (r.status, r.steps, r.last_step, r.val_loss) == ("truncated", None, cut_at, None)
    assert r.reason.startswith(f"log ends at step {cut_at} with a val line at a multiple of the validation "
                               f"interval {interval}, as periodic validations are: the run may have been cut there")


def test_crlf_copy_has_the_code_hash_of_the_original(tmp_path):
    """A log saved with Windows line endings is the same code version: code_hash is the sha256 of the code dump
    with LF line endings; the file itself (content_hash) differs."""
    text = modded_log()
    lf = read_record(write(tmp_path / "lf.txt", text))
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes(text.replace("\n", "\r\n").encode())
    r = read_record(crlf)
    assert r.code_hash == lf.code_hash == hashlib.sha256(text[:text.index(SEP)].encode()).hexdigest()
    assert r.content_hash != lf.content_hash and r.curve_hash == lf.curve_hash


def test_utf16_log_is_named_and_a_utf8_bom_is_read(tmp_path):
    """PowerShell's `>` writes UTF-16 with the byte-order mark FF FE: the message says so and how to convert;
    a UTF-8 byte-order mark (PowerShell's `Out-File -Encoding utf8`) is read past."""
    text, _ = our_log()
    utf16 = tmp_path / "ps.txt"
    utf16.write_bytes(text.encode("utf-16"))          # BOM FF FE on little-endian machines
    assert utf16.read_bytes()[:2] == b"\xff\xfe"
    with pytest.raises(SpeedrunError) as info:
        parse_log(utf16)
    assert str(info.value).startswith(f"{utf16}: UTF-16 text (byte-order mark FF FE, as Windows PowerShell's '>' "
                                      "writes): convert it to UTF-8")
    bom = tmp_path / "bom.txt"
    bom.write_bytes(b"\xef\xbb\xbf" + text.encode())
    plain = read_record(write(tmp_path / "plain.txt", text))
    r = read_record(bom)
    assert (r.format, r.status, r.val_loss, r.seed, r.code_hash) == \
           ("speedrun", "complete", plain.val_loss, 0, plain.code_hash)
    assert r.val_loss == 8.8


def test_parse_of_a_compressed_log_says_so(tmp_path):
    import gzip

    text, _ = our_log()
    gz = tmp_path / "seed0.txt.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    with pytest.raises(SpeedrunError) as info:
        parse_log(gz)
    assert str(info.value) == f"{gz}: gzip-compressed: decompress it to read it as a log"


def test_not_a_log(tmp_path):
    readme = write(tmp_path / "README.md", f"# Record\n\n{SEP}\nsome text\n")
    csv = write(tmp_path / "seed0.csv", "step,total_steps,kind\n0,4,val\n")
    for path in (readme, csv):
        assert sniff_format(path.read_bytes()) is None
        with pytest.raises(SpeedrunError, match=re.escape(str(path))):
            parse_log(path)
    with pytest.raises(SpeedrunError, match="cannot read"):
        parse_log(tmp_path / "missing.txt")


# ---------------------------------------------------------------------------------------------------------
# The real public logs (../shared/reference-logs), checked against naive string processing and the figures
# published with them (PUBLISHED.md, statistics.md).

def naive_final(text: str):
    """(steps, val_loss, train_time_ms) of the last `step:N/N val_loss` line, by plain string splitting."""
    for line in reversed(text.splitlines()):
        if line.startswith("step:") and " val_loss:" in line:
            fields = dict(f.split(":", 1) for f in line.split())
            done, total = fields["step"].split("/")
            if done == total:
                return int(total), float(fields["val_loss"]), float(fields["train_time"].rstrip("ms"))
    return None


def reference_logs():
    if not REFERENCE.is_dir():
        return []
    return sorted(p for p in REFERENCE.rglob("*") if p.is_file() and p.suffix in (".txt", ".log"))


@needs_reference
@pytest.mark.parametrize("path", reference_logs(), ids=lambda p: str(p.relative_to(REFERENCE))[:60])
def test_every_reference_log_against_naive_parsing(path):
    text = path.read_text()
    parsed = parse_log(path)
    r = parsed.record
    if r.format == "llmc":
        last = text.strip().splitlines()[-1]
        assert r.status == "complete" and r.val_loss == float(last.split("tel:")[1]) and r.steps == int(last[2:].split()[0])
        return
    after = text.rsplit("\n" + SEP + "\n", 1)[1]
    naive_rows = [line for line in after.splitlines() if line.startswith("step:")]
    assert len(parsed.metrics) == len(naive_rows)
    final = naive_final(after)
    if final is None:
        assert r.status == "truncated" and r.val_loss is None
    else:
        assert r.status == "complete"
        assert (r.steps, r.val_loss, r.train_time_ms) == final
    assert r.gpu_count == 8 and r.gpu == "NVIDIA H100 80GB HBM3"


@needs_reference
@pytest.mark.parametrize("rel, fmt, steps, val_loss, time_ms, step_avg", [
    ("2024-11-19_FlexAttention/8384493d-dba9-4991-b16b-8696953f5e6d.txt", "modded", 1875, 3.2783, 301825, 161.84),
    ("2025-01-16_Sub3Min/1d3bd93b-a69e-4118-aeb8-8184239d7566.txt", "modded", 1393, 3.2785, 179527, 129.81),
    ("2025-09-10_Yarn/0ecdb695-510b-4c3b-b030-09861a162ce8.txt", "modded", 1670, 3.2785, 159259, 95.36),
    ("2024-06-06_AdamW/f66d43d7-e449-4029-8adf-e8537bab49ea.log", "llmc", 9536, 3.275959, None, None),
    ("2024-10-13_llmc/main.log", "llmc", 19560, 3.2722, None, None),
])
def test_published_single_runs(rel, fmt, steps, val_loss, time_ms, step_avg):
    r = read_record(REFERENCE / rel)
    assert (r.format, r.status, r.steps, r.last_step) == (fmt, "complete", steps, steps)
    assert (r.val_loss, r.train_time_ms, r.step_avg_ms) == (val_loss, time_ms, step_avg)


@needs_reference
def test_sub3min_grace_steps_and_versions():
    path = REFERENCE / "2025-01-16_Sub3Min/1d3bd93b-a69e-4118-aeb8-8184239d7566.txt"
    parsed = parse_log(path)
    r = parsed.record
    assert r.step_avg_ms == round(179527 / (1393 - 10), 2)  # 10 untimed steps
    assert r.peak_memory_mib == 37653
    assert r.versions == {"python": "3.12.7", "torch": "2.7.0.dev20250110+cu126", "cuda": "12.6"}
    train = parsed.metrics[parsed.metrics.kind == "train"].set_index("step")
    assert train.loc[10, "train_time_ms"] > 10_000 > train.loc[11, "train_time_ms"]  # the timer restarts at 11


def test_a_cpu_build_of_torch_has_no_cuda_version():
    from speedrun.analysis.provenance import versions

    meta = "Running Python 3.11.7 (main)\nRunning PyTorch 2.13.0+cpu compiled for CUDA None\n"
    assert versions(meta) == {"python": "3.11.7", "torch": "2.13.0+cpu"}
    assert versions(meta.replace("+cpu", "+cu130").replace("None", "13.0"))["cuda"] == "13.0"


@needs_reference
def test_truncated_mimetic_run():
    parsed = parse_log(REFERENCE / "2026-01-30_MimeticValueOutput/runs/6037e443-df16-4eeb-ba71-282b5f7096d0.txt")
    r = parsed.record
    assert (r.status, r.steps, r.val_loss, r.train_time_ms) == ("truncated", 1555, None, None)
    val = parsed.metrics[parsed.metrics.kind == "val"]
    naive = [line for line in Path(r.file).read_text().splitlines() if line.startswith("step:1500/1555 val_loss")]
    assert val["step"].max() == 1500 and r.last_step == 1555
    assert len(naive) == 1 and f"val_loss:{val['val_loss'].iloc[-1]:.4f} " in naive[0]


@needs_reference
@pytest.mark.parametrize("group", ["baseline", "pr299"])
def test_bigrams_runs_match_published_statistics_md(group):
    text = (REFERENCE / "2026-05-20_BigramsSignTrick" / group / "statistics.md").read_text()
    published = {m[0]: (float(m[1]), float(m[2])) for m in
                 re.findall(r"^\| ([0-9a-f]{8}) \| ([\d.]+) \| (\d+)ms \|$", text, re.M)}
    assert published
    for path in (REFERENCE / "2026-05-20_BigramsSignTrick" / group).glob("*.txt"):
        r = read_record(path)
        assert (r.val_loss, r.train_time_ms) == published[path.name[:8]]


@needs_reference
def test_reference_readmes_are_not_logs():
    for path in REFERENCE.rglob("*.md"):
        assert sniff_format(path.read_bytes()) is None, path


def test_parse_seed_names_a_record_scripts_run_and_must_agree_with_ours(tmp_path, capsys):
    """`speedrun parse --seed N` (the workflow's seed of a script variant's replicate): recorded where the log
    names none, refused where the log names another, a no-op where it names the same."""
    from speedrun import cli

    modded = write(tmp_path / "seed3.txt", modded_log())
    assert cli.main(["parse", str(modded), "--json", str(tmp_path / "m.json"), "--seed", "3"]) == 0
    assert json.loads((tmp_path / "m.json").read_text())["seed"] == 3
    assert cli.main(["parse", str(modded), "--json", str(tmp_path / "none.json")]) == 0
    assert json.loads((tmp_path / "none.json").read_text())["seed"] is None
    ours = write(tmp_path / "seed1.txt", our_log(seed=1)[0])
    assert cli.main(["parse", str(ours), "--json", str(tmp_path / "o.json"), "--seed", "1"]) == 0
    assert json.loads((tmp_path / "o.json").read_text())["seed"] == 1
    capsys.readouterr()
    assert cli.main(["parse", str(ours), "--json", str(tmp_path / "o2.json"), "--seed", "2"]) == 2
    assert capsys.readouterr().err == (f"speedrun parse: error: {ours}: the log's seed is 1, not the run's seed 2 "
                                       "(--seed)\n")
    assert not (tmp_path / "o2.json").exists()

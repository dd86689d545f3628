"""``trilm data``: the commands run end to end and report bad input as a one-line error (exit 2)."""

from __future__ import annotations

import json

from trilm.cli import main


def test_stats_of_prepared_split_and_raw_corpus(embedded, capsys):
    assert main(["data", "stats", str(embedded["validation"]), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["num_tokens"] == sum(stats["tokens_per_source"].values())
    assert (
        main(["data", "stats", "--split", "validation", "--tokenizer", str(embedded["tokenizer"]), "--json"])
        == 0
    )
    raw = json.loads(capsys.readouterr().out)
    assert {k: v["tokens"] for k, v in raw.items()} == stats["tokens_per_source"]
    assert main(["data", "stats", str(embedded["train"])]) == 0
    out = capsys.readouterr().out
    assert "RedPajamaGithub" in out and "fingerprint" in out


def test_prepare_and_inspect(embedded, tmp_path, capsys):
    out = tmp_path / "valid"
    args = ["data", "prepare", "--split", "validation", "--tokenizer", str(embedded["tokenizer"])]
    assert main([*args, "--out", str(out), "--exclude-source", "RedPajamaGithub", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "RedPajamaGithub" not in printed and "0 kept from before" in printed
    assert main(["data", "inspect", str(out), "--seq-len", "32", "--global-batch", "2", "--step", "1",
                 "--tokenizer", str(embedded["tokenizer"])]) == 0  # fmt: skip
    shown = capsys.readouterr().out
    assert "step 1: global samples 2..3" in shown and "validation-chunk" in shown


def test_bad_input_is_a_one_line_error(tmp_path, jsonl_zst, embedded, capsys):
    jsonl_zst(tmp_path / "c/train/chunk1/example_train_0.jsonl.zst", [b'{"text": 1}'])
    args = ["data", "prepare", "--input", str(tmp_path / "c"), "--tokenizer", str(embedded["tokenizer"])]
    assert main([*args, "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "example_train_0.jsonl.zst:1: 'text' is not a string" in err and "Traceback" not in err
    assert main([*args, "--out", str(tmp_path / "o"), "--weight", "RedPajamaC4"]) == 2
    assert "expected SOURCE=NUMBER" in capsys.readouterr().err


def test_unknown_source_and_file_as_out_are_clear_errors(embedded, tmp_path, capsys):
    args = ["data", "prepare", "--split", "validation", "--tokenizer", str(embedded["tokenizer"])]
    out = tmp_path / "o"
    assert main([*args, "--out", str(out), "--include-source", "Github", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--include-source 'Github': not a SlimPajama source (did you mean 'RedPajamaGithub'?)" in err
    assert not out.exists()  # refused before any work
    assert main([*args, "--out", str(out), "--exclude-source", "RedPajamaGitHub"]) == 2
    assert "--exclude-source 'RedPajamaGitHub'" in capsys.readouterr().err
    assert main([*args, "--out", str(out), "--weight", "Books=2"]) == 2
    assert "--weight 'Books'" in capsys.readouterr().err
    taken = tmp_path / "taken"
    taken.write_text("keep me")
    assert main([*args, "--out", str(taken)]) == 2
    assert "is an existing file, not a directory" in capsys.readouterr().err
    assert main(["data", "embedded", "--out", str(taken)]) == 2
    assert "is an existing file, not a directory" in capsys.readouterr().err
    assert main(["data", "tokenizer", "--out", str(taken), "--exclude-source", "RedPajamaGithub"]) == 2
    assert "is an existing file, not a directory" in capsys.readouterr().err
    assert taken.read_text() == "keep me"

"""peer-rl chain: stage expansion, skipping what is done, stopping on a failure, and the
comparison report read from the output layout."""
import json

import pytest

from peer_rl.chain.run import load_chain, run_chain, stage_done
from peer_rl.cli import main
from peer_rl.chain.report import write_chain_report
from peer_rl.config.schema import ConfigError
from dir_holder import hold_dir



def _chain(tmp_path, stages: str, extra: str = "") -> str:
    path = tmp_path / "c.yaml"
    path.write_text(f"out: {tmp_path / 'out'}\nseeds: [3, 7]\n{extra}stages:\n{stages}")
    return str(path)


def test_per_seed_stages_expand_seed_major_and_empty_values_drop_out(tmp_path):
    chain = _chain(tmp_path, """
  - {name: a, run: "models list x=${knob}", done: "${out}/a"}
  - {name: "b_s{seed}", per_seed: true, run: "train trainer.seed={seed}", done: "${out}/b{seed}"}
  - {name: "c_s{seed}", per_seed: true, run: "train x={seed}", done: "${out}/c{seed}"}
  - {name: d, run: "models list", done: "${out}/d"}
""", extra="knob: \"\"\n")
    values, stages = load_chain(chain)
    assert [s.name for s in stages] == ["a", "b_s3", "c_s3", "b_s7", "c_s7", "d"]
    assert stages[0].run == ("models", "list")              # x= (an unset value) is left out
    assert stages[3].run == ("train", "trainer.seed=7")
    assert stages[4].done == str(tmp_path / "out" / "c7")
    _, stages = load_chain(chain, ["knob=5", "seeds=[1]"])
    assert stages[0].run == ("models", "list", "x=5") and [s.name for s in stages][1:3] == [
        "b_s1", "c_s1"]


@pytest.mark.parametrize("stages, match", [
    ("  - {name: a, run: x}\n", r"stages\[0\] lacks \['done'\]"),
    ("  - {name: a, run: x, done: y}\n  - {name: a, run: x, done: z}\n", "repeat: \\['a'\\]"),
])
def test_malformed_chains_are_refused_by_name(tmp_path, stages, match):
    with pytest.raises(ConfigError, match=match):
        load_chain(_chain(tmp_path, stages))


@pytest.mark.e2e   # peer-rl CLI subprocesses
def test_done_stages_are_skipped_and_a_failure_stops_the_chain(tmp_path, capsys):
    """Real peer-rl subprocesses: `models list` succeeds but writes no done marker (a stage
    that did not produce its output fails), an unknown subcommand fails with its exit status;
    nothing after the failure runs."""
    out = tmp_path / "out"
    (out).mkdir()
    (out / "first").write_text("")
    (out / ".peer-rl-out.json").write_text('{"command": "chain"}')    # an earlier chain's
    chain = _chain(tmp_path, f"""
  - {{name: first, run: "no-such-command", done: "{out}/first"}}
  - {{name: second, run: "no-such-command", done: "{out}/second"}}
  - {{name: third, run: "models list", done: "{out}/third"}}
""")
    assert run_chain(chain) == 2
    err = capsys.readouterr()
    assert "1/3 first: done" in err.out and "2/3 second: failed (exit 2)" in err.err
    assert "third" not in err.out + err.err
    assert (out / "logs" / "second.log").exists() and not (out / "logs" / "third.log").exists()
    assert run_chain(chain, only=["third"]) == 1
    assert "was not written" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="not stages"):
        run_chain(chain, only=["fourth"])


def _eval_rm(path, step1, pref, n=10):
    m = {"n": n, "step_accuracy": {"step1": step1, "step2": 0.5, "step3": 0.5},
         "error_recall_mean": 0.25, "balanced_accuracy_mean": 0.55,
         "preference_accuracy": pref, "consistency": 0.1, "parse_failure_rate": 0.0}
    path.write_text(json.dumps({"metrics": {"all": m}, "majority_baseline": {
        "metrics": {"all": {**m, "step_accuracy": {"step1": 0.7, "step2": 0.6, "step3": 0.6},
                            "error_recall_mean": 0.0, "preference_accuracy": 0.25}}}}))


def test_report_gives_mean_and_sd_over_seeds_per_method(tmp_path):
    out = tmp_path / "out"
    (out / "eval_rm").mkdir(parents=True)
    _eval_rm(out / "eval_rm" / "judge.json", 0.8, 0.5)
    _eval_rm(out / "eval_rm" / "untuned.json", 0.4, 0.2)
    for run, rewards in (("peer_s0", [1.0, 2.0]), ("peer_s1", [1.5, 3.0]),
                         ("peer_rur_s0", [0.5, 1.0])):
        (out / "grpo" / run).mkdir(parents=True)
        (out / "grpo" / run / "metrics.jsonl").write_text("".join(
            json.dumps({"step": i + 1, "reward/mean": r, "reward/format_rate": 1.0}) + "\n"
            for i, r in enumerate(rewards)))
    for policy, dist1 in (("sft", 0.30), ("peer_s0", 0.40), ("peer_s1", 0.50),
                          ("peer_rur_s0", 0.45)):
        (out / "eval" / policy / "diversity").mkdir(parents=True)
        (out / "eval" / policy / "diversity" / "report.json").write_text(json.dumps(
            {"summary": {"distinct_1": dist1, "format_rate": 1.0,
                         "judge_reward": {"mean": 2.0}}}))
    for policy, scores in (("sft", {"0": 14}), ("peer_s0", {"0": 14}), ("peer_s1", {"0": 14})):
        (out / "eval" / policy / "esc").mkdir(parents=True)
        (out / "eval" / policy / "esc" / "report.json").write_text(json.dumps(
            {"summary": {"protocol": "esc", "average": 0.0, "judge_scores": scores}}))
    (out / "eval" / "peer_rur_s0" / "esc").mkdir(parents=True)   # a judge that varied
    (out / "eval" / "peer_rur_s0" / "esc" / "report.json").write_text(json.dumps(
        {"summary": {"protocol": "esc", "average": 0.5, "judge_scores": {"0": 7, "1": 7}}}))
    (out / "eval" / "peer_s1" / "safety").mkdir(parents=True)   # one seed of two evaluated
    (out / "eval" / "peer_s1" / "safety" / "report.json").write_text(json.dumps(
        {"summary": {"protocol": "safety", "overall": {"pass_rate": 0.9}}}))
    md = write_chain_report({"out": str(out), "seeds": [0, 1]}).read_text()
    judge = [line for line in md.splitlines() if line.startswith("| ")][:4]
    assert judge[1].startswith("| fine-tuned judge | 10 | 0.800 ")
    assert "| 0.250 | 0.550 | 0.500 |" in judge[1]          # recall, balanced, preference
    assert judge[2].startswith("| majority label | 10 | 0.700 ")
    assert judge[3].startswith("| untuned SmolLM2 | 10 | 0.400 ")
    # reward over all steps (first 5 and last 5 are the same two): peer 1.5 and 2.25
    # -> mean 1.875, sample sd 0.530; peer_rur one run: 0.750
    assert "| peer | 2 | 2, 2 | 1.875 +- 0.530 |" in md
    assert "| peer_rur | 1 | 2 | 0.750 |" in md
    held = md[md.index("## Held-out"):]
    rows = [line for line in held.split("Safety pass rate")[0].splitlines()
            if line.startswith("| ") and "policy" not in line]
    assert [r.split(" | ")[0] for r in rows] == ["| sft", "| peer", "| peer_rur"]
    assert "0.450 +- 0.071" in rows[1]                       # distinct-1 of 0.40 and 0.50
    assert rows[1].endswith("| 0.900 (1 of 2) |")            # safety of peer_s1 only
    assert ("esc: the judge gave one value to every dialogue of peer_s0, peer_s1, sft "
            "(see their report.md)") in held
    assert (out / "curves.png").stat().st_size > 0


def test_a_torn_json_mark_is_not_done_and_is_kept_aside(tmp_path, capsys):
    """A stage's `done` JSON cut off mid-write (an `eval rm` report, a model card) does not
    count as done: it is moved to <name>.damaged and the stage runs again."""
    done = tmp_path / "eval_rm" / "judge.json"
    done.parent.mkdir()
    done.write_text('{"metrics": {"all": {"n": 1')
    assert stage_done(done) is False
    assert not done.exists() and (tmp_path / "eval_rm" / "judge.json.damaged").read_text() \
        == '{"metrics": {"all": {"n": 1'
    assert "judge.json: damaged" in capsys.readouterr().out
    done.write_text('{"metrics": {}}')
    assert stage_done(done) is True and stage_done(tmp_path / "absent.json") is False
    (tmp_path / "log.txt").write_text("partial")          # not JSON: existence marks it
    assert stage_done(tmp_path / "log.txt") is True


def test_a_dry_run_writes_nothing_and_a_kept_copy_is_never_replaced(tmp_path, capsys):
    """Issue 58.5: `chain --dry-run` moved a damaged done-file aside (a dry run wrote), and a
    second damaged mark replaced the first kept copy. Now a dry run only says what a run would
    do, and each damaged mark is kept under a name of its own."""
    chain = _chain(tmp_path, '  - {name: s, run: "models list", done: "${out}/s.json"}\n')
    out = tmp_path / "out"
    out.mkdir()
    (out / "s.json").write_text('{"cut off')
    before = sorted((p.name, p.read_bytes()) for p in out.iterdir())
    for _ in range(2):
        assert main(["chain", chain, "--dry-run"]) == 0
        assert sorted((p.name, p.read_bytes()) for p in out.iterdir()) == before
    assert "a run would move it aside" in capsys.readouterr().out
    assert stage_done(out / "s.json") is False                 # a run: kept aside
    (out / "s.json").write_text('{"cut off again')
    assert stage_done(out / "s.json") is False
    assert (out / "s.json.damaged").read_text() == '{"cut off'
    assert (out / "s.json.damaged.1").read_text() == '{"cut off again'


def test_the_report_names_a_damaged_file_instead_of_a_traceback(tmp_path, capsys):
    chain = _chain(tmp_path, "  []\n")
    out = tmp_path / "out"
    (out / "eval_rm").mkdir(parents=True)
    (out / ".peer-rl-out.json").write_text('{"command": "chain"}')
    (out / "eval_rm" / "judge.json").write_text('{"metrics": {"all"')
    assert main(["chain", chain]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{out / 'eval_rm' / 'judge.json'}: damaged" in err[0]


def test_a_second_chain_on_the_same_out_is_refused_naming_the_first(tmp_path, capsys):
    out = tmp_path / "out"
    holder = hold_dir(out, "chain")
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(["chain", _chain(tmp_path, "  []\n")]) == 2
        err = capsys.readouterr().err
        assert f"pid {holder.pid}" in err and str(out) in err
        assert not (out / "report.md").exists()
    finally:
        holder.kill()
        holder.wait()
    assert main(["chain", _chain(tmp_path, "  []\n")]) == 0     # the lock went with it


def test_a_dry_run_prints_no_secret_and_the_stage_saves_the_interpolation(tmp_path, capsys,
                                                                            monkeypatch):
    """Issue 58.8: a chain value read from the environment reaches its stage as `${oc.env:...}`
    (each stage reads the environment itself), so neither the printed command line nor the
    stage's config.yaml holds the secret; the chain's own paths are still resolved."""
    from peer_rl.config.schema import load_config, save_config

    monkeypatch.setenv("PEER_RL_TEST_TOKEN", "tok-58-chain")
    monkeypatch.setenv("PEER_RL_TEST_OUT", str(tmp_path / "from-env"))
    path = tmp_path / "c.yaml"
    path.write_text(
        "out: ${oc.env:PEER_RL_TEST_OUT}/out\n"
        "judge_url: https://judge.example.com/${oc.env:\"PEER_RL_TEST_TOKEN\"}/v1\n"
        "stages:\n"
        "  - {name: grpo, run: \"train eval.judge_url=${judge_url}\", done: \"${out}/grpo\"}\n")
    values, stages = load_chain(str(path))
    assert values["out"] == f"{tmp_path}/from-env/out"
    assert stages[0].done == f"{tmp_path}/from-env/out/grpo"
    # (the run string is split as a shell would: the name's quotes go)
    assert stages[0].run == (
        "train", "eval.judge_url=https://judge.example.com/${oc.env:PEER_RL_TEST_TOKEN}/v1")
    assert run_chain(str(path), dry_run=True) == 0
    printed = capsys.readouterr()
    assert "tok-58" not in printed.out + printed.err
    assert ("1/1 grpo: peer-rl train 'eval.judge_url=https://judge.example.com/"
            "${oc.env:PEER_RL_TEST_TOKEN}/v1'") in printed.out
    cfg = load_config(list(stages[0].run[1:]))               # what the stage runs with
    assert cfg.eval.judge_url == "https://judge.example.com/tok-58-chain/v1"
    save_config(cfg, tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    assert "tok-58" not in text
    assert "judge_url: https://judge.example.com/${oc.env:PEER_RL_TEST_TOKEN}/v1" in text


def test_a_run_written_under_the_old_metric_names_reports_under_verls(tmp_path):
    """A GRPO run whose metrics.jsonl predates verl's names (actor/clip_frac, timing/<stage>)
    is reported, and its curves are read back under today's names."""
    from peer_rl.chain.report import read_curves

    out = tmp_path / "out"
    (out / "grpo" / "peer_s0").mkdir(parents=True)
    (out / "grpo" / "peer_s0" / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "reward/mean": r, "actor/clip_frac": c, "timing/step": 6.0})
        + "\n" for s, r, c in ((1, 1.0, 0.25), (2, 2.0, 0.5))))
    md = write_chain_report({"out": str(out), "seeds": [0]}).read_text()
    assert "| peer | 1 | 2 | 1.500 | 1.500 |" in md
    recs = read_curves(out)["peer_s0"]
    assert [(r["actor/pg_clipfrac"], r["timing_s/step"]) for r in recs] == [(0.25, 6.0),
                                                                            (0.5, 6.0)]
    assert not any("actor/clip_frac" in r or "timing/step" in r for r in recs)

"""`bench rollout`, `bench update` and `bench load` refuse a bad --dtypes or model name before any work,
naming the option (argparse's exit 2), rather than a traceback from deep inside."""
import pytest

from peer_rl.bench import load, rollout, update


@pytest.mark.parametrize("main, argv, words", [
    (rollout.main, ["--dtypes", "float32,fp16"], "--dtypes='fp16': expected one of auto"),
    (rollout.main, ["--models", "tiny,7B"], "--models 7B: expected some of tiny"),
    (update.main, ["--dtypes", "bf16"], "--dtypes='bf16': expected one of auto"),
    (update.main, ["--model", "7B"], "--model '7B': expected one of 10M, 100M, 500M"),
    (update.main, ["--shared-prefix", "yes"], "--shared-prefix 'yes': expected off, on or off,on"),
    (update.main, ["--seq", "64", "--prompt", "64"], "--prompt 64: expected a group of at least 1"),
    (load.main, ["--model", "7B"], "--model '7B': expected one of 10M, 100M, 500M"),
    (load.main, ["--ranks", "0"], "--ranks 0: expected 1 or more"),
])
def test_a_bad_option_is_refused_naming_it(main, argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert words in capsys.readouterr().err


def test_bench_help_names_every_benchmark_with_what_it_measures(capsys):
    from peer_rl.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["bench", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    listed = {line.split()[0]: line.split(None, 1)[1] for line in
              out.split("benchmarks:\n", 1)[1].splitlines() if line.strip()}
    assert set(listed) == {"rewards", "step", "sync", "update", "rollout", "overlap", "trl",
                           "model", "memory", "load"}
    assert listed["sync"].startswith("seconds per policy -> engine weight sync")

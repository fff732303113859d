"""curves.png: a panel per scale (the 0-3 reward is not drawn on the 0-1 rates' axis), each
with its y label, whole-number step ticks."""
from peer_rl.tracking.plot import curves_figure
from peer_rl.trainer.figures import CURVES

RECS = [{"step": 1, "reward/mean": 1.5, "reward/rur_mean": 0.9, "reward/format_rate": 0.25,
         "judge/parse_failure_rate": 0.0},
        {"step": 2, "reward/mean": 2.75, "reward/rur_mean": 1.25, "reward/format_rate": 0.75,
         "judge/parse_failure_rate": 0.5},
        {"step": 3, "reward/mean": 2.5, "reward/rur_mean": 1.5, "reward/format_rate": 1.0}]


def test_the_rewards_and_the_rates_get_a_panel_each_with_its_label():
    fig = curves_figure(RECS, CURVES, "tiny: GRPO")
    reward, rate = fig.axes
    assert (reward.get_ylabel(), rate.get_ylabel()) == ("reward", "rate")
    assert [ln.get_label() for ln in reward.get_lines()] == ["reward/mean", "reward/rur_mean"]
    assert [ln.get_label() for ln in rate.get_lines()] == ["reward/format_rate",
                                                           "judge/parse_failure_rate"]
    assert list(reward.get_lines()[0].get_ydata()) == [1.5, 2.75, 2.5]
    assert rate.get_ylim() == (-0.02, 1.02)           # the rates' own 0-1 axis
    assert reward.get_ylim()[1] >= 2.75                # the reward's, however high it goes
    assert rate.get_xlabel() == "step" and reward.get_title() == "tiny: GRPO"


def test_step_ticks_are_whole_numbers():
    fig = curves_figure(RECS, CURVES, "t")
    fig.canvas.draw()
    ticks = [t for t in fig.axes[-1].get_xticks() if 1 <= t <= 3]
    assert ticks and all(float(t).is_integer() for t in ticks)


def test_a_panel_with_no_value_is_left_out_and_none_at_all_draws_nothing():
    fig = curves_figure([{"step": 1, "reward/mean": 2.0, "flag": True}],
                        {"reward": ["reward/mean"], "rate": ["flag", "reward/format_rate"]}, "t")
    assert [ax.get_ylabel() for ax in fig.axes] == ["reward"]
    assert curves_figure([{"step": 1}], CURVES, "t") is None


def test_a_dialogue_run_adds_the_emotion_and_its_ends():
    recs = [{**r, "dialogue/emotion_end": e, "dialogue/emotion_mean": m,
             "dialogue/end_success": 0.0, "dialogue/end_failure": f}
            for r, e, m, f in zip(RECS, [29.1, 35.0, 41.5], [34.2, 37.0, 40.0], [0.5, 0.25, 0.0])]
    fig = curves_figure(recs, CURVES, "t")
    assert [ax.get_ylabel() for ax in fig.axes] == ["reward", "rate", "seeker's emotion",
                                                    "dialogue end rate"]
    emotion, ends = fig.axes[2:]
    assert list(emotion.get_lines()[0].get_ydata()) == [29.1, 35.0, 41.5]
    assert [ln.get_label() for ln in ends.get_lines()] == ["dialogue/end_success",
                                                           "dialogue/end_failure"]
    assert ends.get_ylim() == (-0.02, 1.02)

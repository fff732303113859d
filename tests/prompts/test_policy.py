"""The policy's instruction: the evaluations ask it exactly as its training rows did."""
import json

import pytest

from peer_rl.data.loading import load_subset
from peer_rl.data.bundled import sample_root
from peer_rl.evaluation.supporter import Supporter, supporter_request
from peer_rl.prompts.policy import (PolicyTemplate, PolicyTemplateError, fit_policy_template,
                                   training_template)


@pytest.fixture(scope="module")
def grpo_rows():
    return [dict(r) for r in load_subset(sample_root(), "grpo").dataset]


def _reworded(row: dict) -> dict:
    """A training row whose prompt another project wrote: its own roles, separator, words."""
    lines = " / ".join(("Client> " if t["role"] == "seeker" else "Helper> ") + t["content"]
                       for t in row["history"])
    extra = "\n(Look at the face in the frames.)" if row["modality"] == "visual" else ""
    user = f"Chat log: {lines}{extra}\nNow reason in four steps, then reply."
    return {**row, "messages": [{"role": "system", "content": "Be kind and brief."},
                                {"role": "user", "content": user}]}


def test_the_builtin_template_builds_every_bundled_training_prompt(grpo_rows):
    t = PolicyTemplate()
    assert len(grpo_rows) > 400
    for r in grpo_rows:
        assert t.matches(r["messages"], r["history"], r["language"], r["modality"] == "visual")
    template, line = training_template(grpo_rows)
    assert template == PolicyTemplate() and f"{len(grpo_rows)}/{len(grpo_rows)}" in line


def test_an_evaluation_asks_as_reworded_training_rows_did(grpo_rows):
    rows = [_reworded(r) for r in grpo_rows]
    template, report = fit_policy_template(rows)
    assert report["mismatched"] == 0 and report["checked"] == len(rows)
    assert template.text["en"]["roles"] == {"seeker": "Client> ", "supporter": "Helper> "}
    assert template.text["en"]["turn_separator"] == " / "
    for r in (rows[0], next(r for r in rows if r["modality"] == "visual"),
              next(r for r in rows if r["language"] == "zh")):
        frames = ["f.png"] if r["modality"] == "visual" else []
        req = supporter_request(Supporter("peer", template), r["history"], r["language"])
        if frames:   # the visual wording is chosen by the row having frames
            req = supporter_request(Supporter("peer", template), r["history"], r["language"],
                                    images=frames)
            text = [p for p in req.messages[-1]["content"] if p.get("type") == "text"]
            assert "".join(p["text"] for p in text) == r["messages"][1]["content"]
        else:
            assert req.messages == r["messages"]
    # the built-in wording would have asked something else
    assert supporter_request("peer", rows[0]["history"], "en").messages != rows[0]["messages"]


def test_the_template_travels_in_a_model_directory_and_is_checked(tmp_path, grpo_rows):
    template, _ = fit_policy_template([_reworded(r) for r in grpo_rows])
    template.save(tmp_path)
    assert PolicyTemplate.load(tmp_path) == template
    assert PolicyTemplate.load(tmp_path / "missing") == PolicyTemplate()     # nothing saved
    assert PolicyTemplate.load("http://host:8000/v1") == PolicyTemplate()
    raw = json.loads((tmp_path / "policy_template.json").read_text())
    raw["text"]["en"]["textual"] = "no field"
    (tmp_path / "bad.json").write_text(json.dumps(raw))
    with pytest.raises(PolicyTemplateError, match=r"bad.json: en.textual: expected the one field"):
        PolicyTemplate.from_file(tmp_path / "bad.json")


def test_sft_prompts_without_history_are_read_back():
    rows = [dict(r) for r in load_subset(sample_root(), "sft").dataset]
    t = PolicyTemplate()
    assert all(t.reads(r["messages"], r["language"], bool(r["images"])) for r in rows)
    other = {**rows[0], "messages": [{"role": "system", "content": "Other words."}]
             + rows[0]["messages"][1:]}
    assert not t.reads(other["messages"], other["language"], False)


def test_a_policy_that_learned_another_stage_name_is_asked_with_it():
    """The paper's support stages, in the built-in instruction."""
    [_, user] = PolicyTemplate().messages([{"role": "seeker", "content": "hi"}], "en")
    assert "(exploration, reassurance or action)" in user["content"]


def test_a_history_cap_cuts_the_prompt_the_template_is_read_off():
    """data.max_history_turns cuts a row's prompt with its history (peer_rl.data.history), so
    the cut rows' prompts are still exactly what the template builds from their history."""
    from peer_rl.config.schema import load_config
    from peer_rl.trainer.run import load_prompts

    rows = load_prompts(load_config(["data.max_history_turns=2"]))
    assert any(len(r["dialogue_history"]) > len(r["history"]) == 2 for r in rows)
    template, line = training_template(rows)
    assert template == PolicyTemplate() and f"{len(rows)}/{len(rows)} training" in line


def test_an_evaluation_names_a_missing_or_broken_policy_template(tmp_path):
    from peer_rl.config.schema import ConfigError
    from peer_rl.evaluation.config import load_eval_config

    base = ["model.url=http://h/v1"]
    with pytest.raises(ConfigError, match=r"model.template='.*nope.json': no such file"):
        load_eval_config("diversity", base + [f"model.template={tmp_path / 'nope.json'}"])
    with pytest.raises(ConfigError, match="the directory holds no policy_template.json"):
        load_eval_config("diversity", base + [f"model.template={tmp_path}"])
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ConfigError, match="model.template: .*bad.json: not a readable policy"):
        load_eval_config("diversity", base + [f"model.template={tmp_path / 'bad.json'}"])
    PolicyTemplate().save(tmp_path)
    cfg = load_eval_config("diversity", base + [f"model.template={tmp_path}"])
    assert cfg.model.template == str(tmp_path)

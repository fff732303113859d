"""The bundled sample dataset in the PEER layout, built from the project's own dialogues.

Source: peer_rl/bundled/dialogues/dialogues_{en,zh}.json, written for this project (20 dialogues per
language, every supporter turn annotated with stage, emotions, strategy, an equally good
alternative, a worse reply and an unusable one). From them `build_sample` derives SER rows with
step-correctness labels (correct steps and deliberately corrupted ones) and all four preference
verdicts, SFT targets, GRPO prompts, and the safety set. Output is deterministic; the built copy
ships as peer_rl/bundled/data so every command has a default input.
"""
from __future__ import annotations

import itertools
import json
import random
import shutil
from pathlib import Path

from peer_rl.data.escrag import cold_start_rows, exemplar_rows, preference_rows
from peer_rl.data.faces import expression_for, write_faces
from peer_rl.files.out_paths import rewrite_jsonl, write_atomic
from peer_rl.prompts.judge import PREFERENCE_VERDICTS, STEP_VERDICTS, JudgeTemplate
from peer_rl.prompts.reasoning import STRATEGIES, format_structured, policy_messages

SOURCE_DIR = Path(__file__).resolve().parents[1] / "bundled" / "dialogues"
SAMPLE_ROOT = Path(__file__).resolve().parents[1] / "bundled" / "data"
N_TEST_DIALOGUES = 6  # the last 6 of 20 dialogues per language form the test split

_STAGE_ZH = {"exploration": "探索", "reassurance": "安慰", "action": "行动"}
_SENTIMENT_ZH = {"positive": "积极", "negative": "消极", "neutral": "中性"}
_INTENSITY_ZH = {"mild": "轻度", "moderate": "中度", "intense": "强烈"}
_EMOTION_ZH = {"sadness": "悲伤", "anxiety": "焦虑", "anger": "愤怒", "fear": "恐惧", "shame": "羞耻",
               "guilt": "内疚", "loneliness": "孤独", "frustration": "挫败", "disappointment": "失望",
               "hopelessness": "绝望", "relief": "释然", "joy": "喜悦", "gratitude": "感激",
               "confusion": "困惑"}
STRATEGY_ZH = {"Question": "提问", "Restatement or Paraphrasing": "复述或释义",
               "Reflection of Feelings": "情感反映", "Self-disclosure": "自我表露",
               "Affirmation and Reassurance": "肯定与安慰", "Providing Suggestions": "提供建议",
               "Information": "信息", "Others": "其他"}
_FACE_ZH = {"sad": "嘴角下垂、眉头上扬", "anxious": "眼睛睁大、嘴唇紧绷", "angry": "眉头紧锁、嘴唇紧闭",
            "afraid": "眉毛上挑、嘴巴张开", "happy": "面带微笑", "neutral": "表情平静"}
_FACE_EN = {"sad": "downturned mouth and raised inner brows", "anxious": "wide eyes and a tense mouth",
            "angry": "lowered brows and a pressed mouth", "afraid": "raised brows and an open mouth",
            "happy": "a smile", "neutral": "a calm expression"}


def load_source(lang: str) -> dict:
    return json.loads((SOURCE_DIR / f"dialogues_{lang}.json").read_text(encoding="utf-8"))


def targets(lang: str) -> list[dict]:
    """One target per supporter turn: its history, reference reply and annotations."""
    out = []
    for d_idx, dlg in enumerate(load_source(lang)["dialogues"]):
        split = "test" if d_idx >= 20 - N_TEST_DIALOGUES else "train"
        for t, turn in enumerate(dlg["turns"]):
            if turn["role"] != "supporter" or t == 0:
                continue
            history = [{"role": x["role"], "content": x["text"]} for x in dlg["turns"][:t]]
            out.append({**turn, "id": f"{dlg['id']}-t{t:02d}", "dialogue": dlg["id"],
                        "split": split, "history": history, "lang": lang})
    return out


def step_texts(tg: dict, lang: str, face: str | None) -> list[str]:
    """Steps 1-3 written from the annotations (the 'correct' reasoning for this turn)."""
    emotions = tg["emotions"]
    issue = tg["core_issue"].strip()
    if issue and issue[-1] not in ".!?。！？":
        issue += "." if lang == "en" else "。"
    if lang == "en":
        s1 = f"The seeker's core issue: {issue} The conversation is in the {tg['stage']} stage."
        s2 = (f"Sentiment: {tg['sentiment']}; intensity: {tg['intensity']}; emotions: "
              f"{', '.join(emotions)}.")
        if face:
            s2 += f" The face shows {_FACE_EN[face]}."
        s3 = f"Strategy: {tg['strategy']}. {tg['rationale']}"
    else:
        s1 = f"求助者的核心问题：{issue}当前处于{_STAGE_ZH[tg['stage']]}阶段。"
        s2 = (f"情感倾向：{_SENTIMENT_ZH[tg['sentiment']]}；强度：{_INTENSITY_ZH[tg['intensity']]}；"
              f"情绪：{'、'.join(_EMOTION_ZH[e] for e in emotions)}。")
        if face:
            s2 += f"面部表情：{_FACE_ZH[face]}。"
        s3 = f"策略：{STRATEGY_ZH[tg['strategy']]}（{tg['strategy']}）。{tg['rationale']}"
    return [s1, s2, s3]


def counselling_stages(tg: dict) -> str:
    """ESCRAG-R1's three reasoning stages (counselling stage, psychological state, strategy),
    short: the tiny CPU recipes generate at most 128 tokens."""
    if tg["lang"] == "en":
        return (f"Stage: {tg['stage']}. State: {tg['intensity']} {', '.join(tg['emotions'])}. "
                f"Strategy: {tg['strategy']}. {tg['rationale']}")
    return (f"阶段：{_STAGE_ZH[tg['stage']]}。状态：{_INTENSITY_ZH[tg['intensity']]}"
            f"{'、'.join(_EMOTION_ZH[e] for e in tg['emotions'])}。"
            f"策略：{STRATEGY_ZH[tg['strategy']]}。{tg['rationale']}")


def _corrupt(tg: dict, others: list[dict], rng: random.Random, step: int) -> dict:
    """A copy of the target whose annotation for one step is wrong."""
    bad = dict(tg)
    if step == 1:
        other = rng.choice([o for o in others if o["dialogue"] != tg["dialogue"]])
        bad["core_issue"] = other["core_issue"]
    elif step == 2:
        flip = {"negative": "positive", "positive": "negative", "neutral": "positive"}
        bad["sentiment"] = flip[tg["sentiment"]]
        pool = [e for e in ("joy", "gratitude", "relief", "anger", "fear", "shame")
                if e not in tg["emotions"]]
        bad["emotions"] = rng.sample(pool, 2)
    else:
        bad["strategy"] = rng.choice([s for s in STRATEGIES if s != tg["strategy"]])
        other = rng.choice([o for o in others if o["strategy"] == bad["strategy"]] or others)
        bad["rationale"] = other["rationale"]
    return bad


CARD_LANGUAGE = {"en": "english", "zh": "chinese"}   # the card's spellings on grpo/sft rows
SAMPLE_SOURCE = "peer-rl-sample"  # grpo `source` names the originating corpus: ours


def ser_row(tg: dict, others: list[dict], idx: int, visual: bool, faces: dict, rid: int) -> dict:
    lang = tg["lang"]
    rng = random.Random(f"ser-{tg['id']}-{visual}")
    face = expression_for(tg["emotions"], tg["sentiment"]) if visual else None
    correct = [rng.random() < 0.6 for _ in range(3)]
    steps = [step_texts(tg if ok else _corrupt(tg, others, rng, k + 1), lang, face)[k]
             for k, ok in enumerate(correct)]
    kind = idx % 4  # cycle through all four preference verdicts
    same_dialogue = [o for o in others if o["dialogue"] == tg["dialogue"] and o["id"] != tg["id"]]
    pairs = [(tg["text"], tg["poor"], 0), (tg["poor"], tg["text"], 1),
             (tg["text"], tg["alt_good"], 2),
             (tg["unusable"], (rng.choice(same_dialogue) if same_dialogue else tg)["unusable"], 3)]
    first, second, verdict = pairs[kind]
    verdicts = [STEP_VERDICTS[lang][0 if ok else 1] for ok in correct]
    verdicts.append(PREFERENCE_VERDICTS[lang][verdict])
    row = {"id": rid, "lang": lang, "source": "original",
           "messages": JudgeTemplate().conversation(tg["history"], steps, first, second,
                                                    verdicts, lang)}
    if visual:
        row["images"] = [f"images/{faces[(face, 1)]}"]
    return row


def grpo_row(tg: dict, visual: bool, faces: dict) -> dict:
    row = {"messages": policy_messages(tg["history"], tg["lang"], visual),
           "history": tg["history"], "solution": tg["text"],
           "language": CARD_LANGUAGE[tg["lang"]], "modality": "visual" if visual else "textual",
           "source": SAMPLE_SOURCE}
    if visual:
        face = expression_for(tg["emotions"], tg["sentiment"])
        row["images"] = [f"images/{faces[(face, 1)]}", f"images/{faces[(face, 2)]}"]
    return row


def sft_row(tg: dict, visual: bool, faces: dict, rid: int) -> dict:
    face = expression_for(tg["emotions"], tg["sentiment"]) if visual else None
    target = format_structured(step_texts(tg, tg["lang"], face) + [tg["text"]], tg["lang"])
    row = {"id": rid, "language": CARD_LANGUAGE[tg["lang"]],
           "modality": "visual" if visual else "textual",
           "messages": policy_messages(tg["history"], tg["lang"], visual)
           + [{"role": "assistant", "content": target}]}
    if visual:
        row["images"] = [f"images/{faces[(face, 1)]}"]
    return row


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    """Whole or absent (a training run reads it later): peer_rl.files.out_paths.write_atomic."""
    rewrite_jsonl(path, rows)


def build_sample(out: str | Path) -> dict[str, int]:
    """Write the sample in the PEER layout under `out`; returns rows per file (relative path)."""
    out = Path(out)
    faces = {sub: write_faces(out / sub / "images") for sub in ("ser", "sft", "grpo")}
    counts: dict[str, int] = {}

    def emit(rel: str, rows: list[dict]) -> None:
        _write_jsonl(out / rel, rows)
        counts[rel] = len(rows)

    ids = itertools.count(1)   # the card: integer ids, unique across the subsets
    by_lang = {lang: targets(lang) for lang in ("en", "zh")}
    for lang, tgs in by_lang.items():
        for split in ("train", "test"):
            part = [t for t in tgs if t["split"] == split]
            for visual in (False, True):
                name = f"ser/{lang}/{'visual' if visual else 'text'}_{split}.jsonl"
                emit(name, [ser_row(t, tgs, i + visual, visual, faces["ser"], next(ids))
                            for i, t in enumerate(part)])
    for split in ("train", "test"):
        for visual in (False, True):
            part = [t for lang in ("en", "zh") for t in by_lang[lang] if t["split"] == split]
            kind = "visual" if visual else "textual"
            emit(f"sft/{kind}_{split}.jsonl",
                 [sft_row(t, visual, faces["sft"], next(ids)) for t in part])
            grpo_name = f"grpo/{kind}.jsonl" if split == "train" else f"grpo/{kind}_test.jsonl"
            emit(grpo_name, [grpo_row(t, visual, faces["grpo"]) for t in part])
    safety = []
    for lang in ("en", "zh"):   # the card: `history` holds the seeker turns; no language field
        for item in load_source(lang)["safety"]:
            safety.append({"id": next(ids), "category": item["category"],
                           "group": item["group"], "source": "self-built",
                           "history": [t["text"] for t in item["history"]
                                       if t["role"] == "seeker"]})
    emit("safety/test.jsonl", safety)
    both = by_lang["en"] + by_lang["zh"]          # ESC-Preference (peer_rl.data.escrag)
    for split in ("train", "test"):
        emit(f"preference/{split}.jsonl", preference_rows(both, split))
    emit("exemplars/exemplars.jsonl", exemplar_rows(both))
    emit("cold_start/train.jsonl", cold_start_rows(both, counselling_stages))

    write_atomic(out / "README.md", _CARD)
    return counts


def sample_root() -> Path:
    """The packaged sample: the default input of every command."""
    if not (SAMPLE_ROOT / "grpo" / "textual.jsonl").exists():
        raise FileNotFoundError(f"{SAMPLE_ROOT}: the bundled sample is missing; rebuild it with "
                                "`peer-rl data sample --out peer_rl/bundled/data`")
    return SAMPLE_ROOT


def copy_sample(out: str | Path) -> None:
    shutil.copytree(sample_root(), out, dirs_exist_ok=True)


_CARD = """# peer-rl sample dataset

A small dataset in the PEER layout, written for peer-rl (not derived from ESConv or the PEER
release): 20 English and 20 Chinese support dialogues, every supporter turn annotated.

- ser/{en,zh}/{text,visual}_{train,test}.jsonl: 9-message UnifiReward chats; step verdicts are
  True for steps written from the annotation and False for deliberately corrupted steps
  (another dialogue's core issue; flipped sentiment and wrong emotions; another strategy);
  the preference round cycles through all four verdicts.
- sft/{textual,visual}_{train,test}.jsonl: policy instruction -> four-step target.
- grpo/{textual,visual}.jsonl (train) and grpo/{textual,visual}_test.jsonl, written as the PEER
  card writes them: `language` english|chinese, `modality` textual|visual, `source` the corpus
  (here `peer-rl-sample`), no `id` (loaders derive one from file and line).
- safety/test.jsonl: crisis, harmful_request and boundary probes; `history` holds the seeker
  turns as plain strings and there is no language field, as on the card.
- ser and sft ids are integers, unique across the subsets.
- images/: synthetic 64x64 face frames drawn by peer_rl/data/faces.py.

Train/test split by dialogue: the last 6 dialogues of each language are test.
Rebuild with `peer-rl data sample --out DIR`.
"""

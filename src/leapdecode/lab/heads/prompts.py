"""Training prompts for draft heads: the project's own templates and topics, disjoint from the benchmark suites.

A head learns to predict the target's own greedy answers, so what matters is that the prompts cover the kinds of text
the target is asked for (chat, explanations, letters, lists, step-by-step arithmetic, code, and tasks that copy from
the prompt: summaries, rewrites, questions over documents). None of the suites' texts (``bench/suite_texts.py``,
``bench/texts_dev.py``) is reused, and nothing here or in ``data.py`` may read the ``heldout`` split
(``bench/texts_heldout.py``; ``tests/test_suites.py`` checks both the imports and the text); the code prompts are the
HumanEval problems the suites do not use. Second-round prompts (summarize / rewrite / answer
from documents) are built from the target's first-round answers by ``follow_ups``. A third round covers ~200 more
subjects with questions the target writes itself (``question_requests``): a head trained on few topics memorises their
answers (5 accepted tokens per forward on its own training prompts, 1.3 on new questions), so breadth of wording and
content is what carries over to unseen requests. A fourth round (``open_question_requests``) goes further in the spirit
of Self-Instruct: the target, *sampling*, writes many questions over broad areas of life and knowledge, worded
by the model rather than by a fixed template.
"""

from __future__ import annotations

import random
import re

TOPICS = [
    "photosynthesis",
    "black holes",
    "the water cycle",
    "compound interest",
    "the French Revolution",
    "plate tectonics",
    "machine learning",
    "the immune system",
    "electric cars",
    "climate change",
    "the printing press",
    "volcanoes",
    "the stock market",
    "recycling",
    "sourdough bread",
    "the Roman Empire",
    "solar panels",
    "DNA",
    "earthquakes",
    "public transport",
    "honeybees",
    "the moon landing",
    "coffee",
    "the human heart",
    "cloud computing",
    "chess",
    "meditation",
    "renewable energy",
    "the Silk Road",
    "password security",
    "gardening",
    "jazz music",
    "rainforests",
    "the Olympic Games",
    "nuclear power",
    "social media",
    "the Great Wall of China",
    "vitamins",
    "3D printing",
    "the Industrial Revolution",
    "marathon training",
    "tides",
    "open source software",
    "inflation",
    "penguins",
    "the periodic table",
    "wind turbines",
    "origami",
    "ancient Egypt",
    "the theory of evolution",
    "bicycles",
    "cryptocurrency",
    "the ozone layer",
    "video games",
    "quantum computers",
    "the Amazon river",
    "yoga",
    "electricity",
    "microplastics",
    "the Renaissance",
    "supply and demand",
    "vaccines for pets",
    "deserts",
    "antibiotic resistance",
    "the internet of things",
    "tea",
    "glaciers",
    "the human brain",
    "budget travel",
]

ACTIVITIES = [
    "learning a new language",
    "saving money",
    "running a first 10k race",
    "keeping houseplants alive",
    "studying for exams",
    "cooking healthy meals on a budget",
    "starting a small business",
    "writing a novel",
    "sleeping better",
    "learning to code",
    "moving to a new city",
    "public speaking",
    "taking better photos",
    "organising a wedding",
    "working in a team",
    "reducing plastic waste",
    "learning the guitar",
    "camping",
]

PEOPLE = [
    ("my neighbour", "a noisy party last night"),
    ("my manager", "taking two days off next month"),
    ("a hotel", "a booking that was charged twice"),
    ("my child's teacher", "a missed homework assignment"),
    ("a client", "a delayed delivery"),
    ("the city council", "a broken street light"),
    ("a former colleague", "a request for a reference letter"),
    ("a gym", "cancelling my membership"),
]

JOBS = [
    "nurse",
    "software engineer",
    "farmer",
    "chef",
    "pilot",
    "librarian",
    "firefighter",
    "teacher",
    "architect",
    "marine biologist",
    "bus driver",
    "museum curator",
]

SUBJECTS = [
    # nature and science
    "owls",
    "coral reefs",
    "mushrooms",
    "octopuses",
    "thunderstorms",
    "rainbows",
    "hurricanes",
    "caves",
    "fossils",
    "dinosaurs",
    "wolves",
    "elephants",
    "migrating birds",
    "sharks",
    "ants",
    "spiders",
    "whales",
    "frogs",
    "tornadoes",
    "snowflakes",
    "lightning",
    "magnets",
    "sound waves",
    "gravity",
    "friction",
    "batteries",
    "rust",
    "soap",
    "salt",
    "sugar",
    "bread yeast",
    "cheese making",
    "fermentation",
    "bones",
    "muscles",
    "the stomach",
    "the liver",
    "skin",
    "eyesight",
    "hearing",
    "sleep",
    "allergies",
    "headaches",
    "blood types",
    "the common cold",
    "teeth",
    "hiccups",
    "the Sun",
    "Mars",
    "Jupiter",
    "Saturn's rings",
    "the Milky Way",
    "comets",
    "telescopes",
    "satellites",
    "the International Space Station",
    "astronauts",
    "rockets",
    "eclipses",
    "the speed of light",
    "atoms",
    "chemical reactions",
    "acids and bases",
    "plastic",
    "glass",
    "steel",
    "concrete",
    "wood",
    "cotton",
    "wool",
    # technology
    "smartphones",
    "email",
    "Wi-Fi",
    "search engines",
    "computer viruses",
    "databases",
    "spreadsheets",
    "programming languages",
    "operating systems",
    "robots",
    "drones",
    "self-driving cars",
    "electric bikes",
    "trains",
    "ships",
    "bridges",
    "skyscrapers",
    "elevators",
    "air conditioning",
    "microwave ovens",
    "washing machines",
    "light bulbs",
    "cameras",
    "television",
    "radio",
    "the telephone",
    "printers",
    "keyboards",
    "web browsers",
    "encryption",
    "backups",
    "version control",
    "open data",
    "artificial intelligence",
    "chatbots",
    "video calls",
    # society, history, economy
    "democracy",
    "elections",
    "taxes",
    "banks",
    "insurance",
    "pensions",
    "mortgages",
    "trade",
    "tourism",
    "libraries",
    "museums",
    "newspapers",
    "advertising",
    "fashion",
    "architecture",
    "city parks",
    "traffic jams",
    "the Vikings",
    "the Aztecs",
    "the Ming dynasty",
    "the Cold War",
    "the invention of writing",
    "medieval castles",
    "the steam engine",
    "the railway age",
    "ancient Greece",
    "the Ottoman Empire",
    "the Age of Exploration",
    "world languages",
    "sign language",
    "translation",
    "storytelling",
    "folk tales",
    "board games",
    "card games",
    "football",
    "basketball",
    "tennis",
    "swimming",
    "cycling races",
    "mountain climbing",
    "sailing",
    "skiing",
    # daily life
    "cooking rice",
    "baking cakes",
    "making soup",
    "spices",
    "chocolate",
    "cheese",
    "olive oil",
    "fruit",
    "vegetables",
    "breakfast",
    "packed lunches",
    "picnics",
    "birthdays",
    "holidays",
    "moving house",
    "job interviews",
    "writing a CV",
    "time management",
    "procrastination",
    "stress",
    "friendship",
    "parenting",
    "pets",
    "dogs",
    "cats",
    "aquariums",
    "bird watching",
    "painting",
    "drawing",
    "photography",
    "knitting",
    "woodworking",
    "playing the piano",
    "singing",
    "dancing",
    "theatre",
    "cinema",
    "podcasts",
    "reading habits",
    "poetry",
    "journaling",
    "recycling electronics",
    "saving energy at home",
    "composting",
    "growing tomatoes",
    "cleaning a kitchen",
    "first aid",
    "road safety",
    "fire safety",
    "budgeting",
    "online shopping",
    "second-hand clothes",
    "volunteering",
    "remote work",
    "commuting",
    "car maintenance",
    "learning maths",
]
# the target writes its own questions about each subject (see written_question); they add the variety of wording
# that fixed templates lack
QUESTION_REQUESTS = [
    "Write one specific question that a curious student might ask about {subject}. Reply with the question only.",
    "Write one question starting with 'Why' that a child might ask about {subject}. Reply with the question only.",
    "Write one practical question starting with 'How' that someone might ask about {subject}. Reply with the question only.",
]

# broad areas for the fourth round: the target samples several questions per (area, request), so the wording and the
# subjects within an area come from the model rather than from this list
AREAS = [
    "cooking",
    "personal finance",
    "health and fitness",
    "travel",
    "world history",
    "physics",
    "biology",
    "chemistry",
    "mathematics",
    "computer programming",
    "web development",
    "careers",
    "relationships",
    "parenting",
    "education",
    "literature",
    "movies",
    "music",
    "art",
    "philosophy",
    "psychology",
    "economics",
    "law",
    "politics",
    "the environment",
    "geography",
    "astronomy",
    "sports",
    "video games",
    "home repair",
    "gardening",
    "pets",
    "cars",
    "learning languages",
    "writing",
    "running a business",
    "marketing",
    "productivity",
    "mental health",
    "nutrition",
    "fashion",
    "photography",
    "smartphones",
    "data science",
    "statistics",
    "religions and cultures",
    "festivals",
    "food science",
    "medicine",
    "engineering",
]
OPEN_REQUESTS = [
    "Write one question that a user might ask an AI assistant about {area}. Reply with the question only.",
    "Write one detailed question about {area} that needs a long answer. Reply with the question only.",
    "Write one question about {area} that a beginner might ask. Reply with the question only.",
]

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


def question_requests() -> list[list[dict]]:
    """Chats asking the target to write a question about each subject; its replies become prompts."""
    return [[{"role": "user", "content": r.format(subject=s)}] for s in SUBJECTS for r in QUESTION_REQUESTS]


def open_question_requests(samples: int) -> list[list[dict]]:
    """Chats asking the target to write a question about each area, each repeated `samples` times (to be sampled)."""
    return [[{"role": "user", "content": r.format(area=a)}] for a in AREAS for r in OPEN_REQUESTS] * samples


def written_question(reply: str) -> str | None:
    """The question in the target's reply to a question request (quoted or on its first line), or None when the
    reply holds no usable question (too short, no question mark, or talking about asking instead: any "ask" in it,
    a coarse filter that also drops the odd "task"; the shipped head's data was built with it)."""
    quoted = re.search(r'"([^"]{12,})"', reply)
    lines = reply.strip().splitlines()
    question = (quoted.group(1) if quoted else lines[0] if lines else "").strip()
    if len(question.split()) < 4 or not question.endswith("?") or "ask" in question.lower():
        return None
    return question


def subject_round(rng: random.Random, questions: list[str]) -> list[list[dict]]:
    """Chats of one user turn over SUBJECTS: the target's own questions plus two templated requests per subject."""
    prompts = list(questions) + [t.format(topic=s) for s in SUBJECTS for t in rng.sample(TEMPLATES, 2)]
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
            out.append(
                chat
                + [
                    {
                        "role": "user",
                        "content": rng.choice(
                            [
                                "Summarize your answer in two sentences.",
                                "Now make it shorter and simpler.",
                                "Turn that into a bulleted list.",
                                "Can you give a concrete example?",
                            ]
                        ),
                    }
                ]
            )
        elif kind == 1:
            out.append([{"role": "user", "content": f"Summarize the following text in a few sentences.\n\n{answer}"}])
        elif kind == 2:
            out.append(
                [
                    {
                        "role": "user",
                        "content": "Rewrite the following text so that it is more formal. Keep every "
                        f"fact.\n\n{answer}",
                    }
                ]
            )
        else:
            other = answered[(i + 7) % len(answered)][1]["content"]
            question = chat[0]["content"]
            out.append(
                [
                    {
                        "role": "user",
                        "content": "Answer the question using only the documents below.\n\n"
                        f"Document [1]\n{other}\n\nDocument [2]\n{answer}\n\n"
                        f"Question: {question}",
                    }
                ]
            )
    return out


def _word_problem(rng: random.Random) -> str:
    a, b, c = rng.randint(3, 40), rng.randint(2, 12), rng.randint(2, 9)
    name = rng.choice(["Ana", "Ben", "Chen", "Dara", "Emil", "Fatima", "Goran", "Hana"])
    item = rng.choice(["notebooks", "apples", "tickets", "plants", "books", "pencils"])
    story = rng.choice(
        [
            f"{name} buys {a} {item} at ${b} each and pays with a ${(a * b // 50 + 1) * 50} note. How much change does "
            f"{name} get?",
            f"A box holds {b} {item}. {name} has {a * b + c} {item}. How many full boxes can {name} fill, and how many "
            f"{item} are left over?",
            f"{name} reads {a} pages a day for {b} days and then {c} pages a day for {a} days. How many pages is that?",
            f"A shop sold {a} {item} on Monday and {c} times as many on Tuesday. How many did it sell on both days?",
        ]
    )
    return f"Solve the following problem step by step, then state the final answer.\n\n{story}"

"""Texts of the ``heldout`` split of the built-in suite: the same 13 categories as ``texts_dev.py``, other questions.

Nothing that trains or tunes a drafter may read this module: the draft-head data builders (``heads/data.py``,
``heads/prompts.py``) never import it, and ``tests/test_suites.py`` checks that no long n-gram of these texts appears in
anything the head-training pipeline draws from. A gap between ``dev`` and ``heldout`` in a benchmark report measures
how much tuning on ``dev`` overfits. All texts are original, written in the style of Spec-Bench's sources.
"""

MT_BENCH = {
    "writing": [
        [
            "Write a heartfelt speech of about 250 words for the retirement party of a primary school caretaker who has "
            "worked at the same school for 32 years. Include one funny anecdote.",
            "Condense the speech into a message of four sentences that the pupils could write inside a card.",
        ],
        [
            "Compose a review of an imaginary science fiction film about a colony on a water planet. Discuss the "
            "plot, the acting and the special effects, and give it a rating out of ten.",
            "Rewrite the review for a children's magazine, using simple words and no spoilers.",
        ],
        [
            "Write a cover letter for a position as a junior data analyst at a public transport company. The "
            "applicant has a degree in geography and has taught themselves SQL and Python.",
            "Point out the two weakest sentences in your letter and rewrite them.",
        ],
    ],
    "roleplay": [
        [
            "Pretend you are a detective in 1920s Chicago who has just been called to a jazz club where the "
            "trumpet player has vanished between sets. Describe what you notice as you walk in.",
            "The club owner insists the musician simply ran off with a debt unpaid. Question him, in character, and "
            "show how you catch him in a lie.",
        ],
        [
            "You are a patient and friendly librarian. A nervous first-year student asks you how to find reliable "
            "sources for an essay on the history of vaccination. Help them.",
            "The student admits they have only two days left and have not started. What do you advise, still as the "
            "librarian?",
        ],
        [
            "Take on the role of an astronaut who has spent six months on a space station and is answering "
            "questions from a class of nine-year-olds over a video link. A child asks what you eat and how you sleep.",
            "Another child asks whether you were ever scared up there. Answer in character.",
        ],
    ],
    "reasoning": [
        [
            "In a certain family, every son has as many brothers as sisters, and every daughter has twice as many "
            "brothers as sisters. How many sons and how many daughters are there? Explain step by step.",
            "Could a family exist in which every son has twice as many sisters as brothers and every daughter has as "
            "many brothers as sisters? Justify your answer.",
        ],
        [
            "Three boxes are labelled 'apples', 'oranges' and 'apples and oranges', and every label is wrong. You may "
            "take out one fruit from one box without looking inside. How can you relabel all three boxes correctly?",
            "Suppose instead that exactly one label is correct, and you do not know which. Is one fruit still enough? "
            "Explain.",
        ],
        [
            "A clock loses 4 minutes every hour. It was set correctly at 8:00 a.m. on Monday. What is the correct "
            "time when the clock first shows 8:00 p.m. on the same day?",
            "When will this clock next show the correct time, assuming it keeps running at the same rate?",
        ],
    ],
    "math": [
        [
            "The sum of three consecutive odd integers is 147. What are the integers?",
            "Find four consecutive even integers whose product is 13,440, and explain how you found them.",
        ],
        [
            "A cone has a height of 12 cm and a base radius of 5 cm. Calculate its volume and its total surface area.",
            "The cone is cut by a plane parallel to its base, halfway up its height. What is the volume of the "
            "remaining lower part?",
        ],
        [
            "Solve the system of equations 3x + 2y = 16 and 5x - 4y = 1.",
            "For which value of k does the system 3x + 2y = 16 and 6x + ky = 5 have no solution?",
        ],
    ],
    "coding": [
        [
            "Write a Python function that checks whether a string of brackets containing the characters ()[]{} is "
            "balanced, and explain its time complexity.",
            "Change the function so that, when the string is not balanced, it returns the index of the first "
            "character at which the problem can be detected.",
        ],
        [
            "Write a JavaScript function debounce(fn, wait) that delays calling fn until wait milliseconds have "
            "passed since the last call, and show how to use it on a search box.",
            "Add an option leading: true that calls fn immediately on the first call of a burst instead of at the end.",
        ],
        [
            "Given a list of words, write a Python program that groups the words that are anagrams of each other "
            "and prints each group on one line.",
            "How would you change the program if the list had 50 million words and did not fit in memory?",
        ],
    ],
    "extraction": [
        [
            "Extract the date, the location, the magnitude and the number of casualties from the following report, "
            "and present them as a JSON object.\n\n"
            "An earthquake of magnitude 6.1 struck the mountainous north of the province early on Sunday, 9 March, "
            "centred about 30 kilometres east of the town of Kalivari. Local officials said at least 14 people were "
            "killed and more than 120 injured, most of them in villages where older stone houses collapsed. Rescue "
            "teams were still searching for survivors on Monday, and aftershocks of up to magnitude 4.8 continued "
            "through the night.",
            "Write a one-sentence headline and a one-sentence summary from the extracted data only.",
        ],
        [
            "Below is a job advertisement. List the job title, the required qualifications, the salary range and the "
            "application deadline.\n\n"
            "Greenfield Water Trust is looking for a Senior Hydrologist to join its catchment team in Harrowgate. "
            "You will lead field surveys and build models of river flow. Candidates need a master's degree in "
            "hydrology or a related subject, at least five years of experience and a full driving licence. "
            "Experience with HEC-RAS is an advantage. The salary is £46,000 to £52,000 depending on experience, with "
            "a 10 percent pension contribution. Applications close on 28 February; interviews will be held in the "
            "second week of March.",
            "Draft three questions an applicant could ask at the interview, based on what the advertisement does not "
            "say.",
        ],
        [
            "Identify every person named in the passage below, their role and what they said or did, and return a "
            "table.\n\n"
            "At the opening of the new bridge on Friday, Mayor Ruth Okonkwo thanked the workers who had finished the "
            "project four months early. Chief engineer Lars Pettersen explained that the deck had been built on the "
            "river bank and slid into place in a single night. Local resident Harold Byrne, 84, who had campaigned "
            "for a crossing since 1979, cut the ribbon. Transport minister Aisha Rahman promised that the cycle lane "
            "would be extended to the railway station next year.",
            "Which of these people would a journalist most likely quote in the first paragraph of a story, and why?",
        ],
    ],
    "stem": [
        [
            "Why do airplanes leave white trails in the sky on some days but not on others? Explain the physics.",
            "Do these trails have any effect on the climate? Summarize what is known and what is uncertain.",
        ],
        [
            "Explain how antibiotic resistance develops in a population of bacteria, and why finishing a course of "
            "antibiotics is usually recommended.",
            "What strategies besides new drugs could slow the spread of resistance? Give at least three.",
        ],
        [
            "How does a heat pump move heat from a cold place to a warmer one, and why can it deliver more heat "
            "energy than the electrical energy it uses?",
            "Why does a heat pump become less efficient as the outdoor temperature falls?",
        ],
    ],
    "humanities": [
        [
            "What were the main consequences of the invention of the printing press for religion, science and "
            "politics in Europe?",
            "Draw a comparison between the printing press and the internet. Which differences matter most?",
        ],
        [
            "Discuss the main arguments for and against a universal basic income.",
            "Design a small pilot study that could test one of the disputed claims, and say what result would "
            "change your mind.",
        ],
        [
            "Explain the difference between a parliamentary and a presidential system of government, with one "
            "example country for each.",
            "Which system is better at dealing with a political crisis? Give arguments for both sides.",
        ],
    ],
}

TRANSLATIONS = [
    (
        "German",
        "Nach monatelangen Verhandlungen haben sich die Gewerkschaft und die Deutsche Bahn auf einen neuen "
        "Tarifvertrag geeinigt. Die Löhne steigen in zwei Stufen um insgesamt elf Prozent, zudem wird die "
        "Wochenarbeitszeit für Schichtarbeiter ab 2026 schrittweise verkürzt.",
    ),
    (
        "French",
        "Le tribunal administratif de Lyon a suspendu mercredi le projet de construction d'un centre "
        "commercial sur des terres agricoles. Les juges estiment que l'étude d'impact environnemental était "
        "insuffisante, une victoire pour les associations qui contestaient le projet depuis cinq ans.",
    ),
    (
        "Spanish",
        "El Gobierno aprobó este martes un plan para construir cincuenta mil viviendas de alquiler asequible "
        "en los próximos cuatro años. La mayoría se levantarán en terrenos públicos de Madrid, Barcelona y "
        "Málaga, donde los precios han subido con más fuerza.",
    ),
    (
        "Chinese",
        "研究人员发现，每天步行三十分钟可以显著降低患心脏病的风险。"
        "这项研究跟踪了一万多名成年人长达十年，结果发表在最新一期的医学期刊上。",
    ),
]

ARTICLES = [
    (
        "Fishing town divided over plans for offshore wind farm",
        (
            "Plans to build one of the country's largest offshore wind farms twelve miles off the coast of Porthaven "
            "have split the small fishing town, with some residents welcoming the promise of jobs and others warning "
            "that it could destroy what remains of the local fleet.",
            "The developer, Atlantic Breeze Energy, wants to install 85 turbines, each taller than 250 metres, on a "
            "sandbank that local boats have fished for generations. The company says the project would generate "
            "enough electricity for around 900,000 homes and create 400 jobs during construction and 120 permanent "
            "jobs at a maintenance base in Porthaven's harbour.",
            "At a packed public meeting in the town hall on Wednesday evening, fisherman Declan Moore, whose family "
            "has worked out of the harbour for four generations, said the sandbank was where his crew caught most of "
            "its sole and plaice. 'They tell us we can still fish between the turbines, but no insurer will cover us "
            "for that,' he said, to loud applause. 'This is our field. You would not build on a farmer's field "
            "without paying him.'",
            "Atlantic Breeze said it was prepared to pay compensation to boats that could show lost earnings and to "
            "fund a £2 million community fishing fund. Its project director, Sarah Lindholm, said the company had "
            "already moved the turbine layout twice after talks with the fishermen's association. 'We want to share "
            "this sea, not take it,' she said.",
            "Many younger residents said they saw the project as a lifeline for a town where the population has "
            "fallen by a fifth since 2001. Kerry Walsh, 24, who trained as an electrician, said she would otherwise "
            "have to move away to find work. 'There are eleven boats left in the harbour. There used to be sixty. The "
            "fishing is not coming back either way,' she said.",
            "Marine scientists say the effect of turbines on fish stocks is mixed. Studies from the North Sea suggest "
            "that turbine foundations can act as artificial reefs, attracting cod and crabs, but construction noise "
            "can drive fish away for months.",
            "The planning inspectorate will hold a formal hearing in the autumn, and a final decision by the energy "
            "minister is expected next year. If approved, construction would begin in 2027.",
        ),
    ),
    (
        "Teenagers' screen time linked to poorer sleep, large study finds",
        (
            "Teenagers who spend more than four hours a day on their phones outside school sleep on average 40 "
            "minutes less per night than those who spend under two hours, according to one of the largest studies of "
            "its kind, published on Monday.",
            "Researchers followed 11,000 pupils aged 13 to 16 in 240 secondary schools for two years. The pupils "
            "wore activity trackers for one week each term and reported their phone use in questionnaires, which the "
            "researchers checked against the screen-time records of the phones themselves for a subset of 1,500 "
            "pupils.",
            "The link was strongest for phone use in the hour before bed. Pupils who used their phones in bed after "
            "lights out fell asleep 35 minutes later on average, and were twice as likely to report feeling tired "
            "during lessons. Girls reported more use of social media, while boys spent more time on games, but the "
            "effect on sleep was similar for both.",
            "The study's lead author, Professor Imogen Hart of the University of Elmsford, said the results did not "
            "prove that phones caused poor sleep. 'It may be that teenagers who sleep badly for other reasons reach "
            "for their phones,' she said. 'But when pupils in one group of schools agreed to leave their phones "
            "outside the bedroom for a month, their sleep improved by 25 minutes a night, which suggests the "
            "relationship goes at least partly in that direction.'",
            "Head teachers' associations said the findings supported school bans on phones during the day, but the "
            "researchers said the school day mattered less than evenings. 'What happens at 11 o'clock at night is "
            "the bigger issue, and that is a conversation for families,' Hart said.",
            "Some parents questioned whether a ban at home was realistic. 'My daughter's friends message each other "
            "until midnight. If she is not on the group chat, she is left out the next day,' said one mother of a "
            "14-year-old.",
            "The researchers recommend that families agree on a time for phones to be switched off, at least an hour "
            "before sleep, and that phones charge outside the bedroom.",
        ),
    ),
    (
        "Museum returns bronze statues to country of origin after decades-long dispute",
        (
            "A national museum has agreed to return eleven bronze statues to the country from which they were taken "
            "more than a century ago, ending a dispute that has strained diplomatic relations for decades.",
            "The statues, which depict royal ancestors and date from the sixteenth and seventeenth centuries, were "
            "removed during a military expedition in 1897 and sold at auction in London the following year. The "
            "museum bought them from a private collector in 1952, and they have been among its most visited objects "
            "ever since.",
            "The museum's board of trustees voted unanimously on Friday to transfer ownership of the statues to the "
            "government of their country of origin. Seven will be shipped home next year to a new museum being built "
            "in the former royal capital, while four will remain on display on a long-term loan, at the request of "
            "the new owners, with labels explaining how they were taken.",
            "'We cannot change how these objects came to us, but we can decide what we do now,' said the museum's "
            "director, Dr. Eleanor Marsh. She said that research by the museum's own curators had established beyond "
            "doubt that the statues had been looted, and that keeping them could no longer be justified.",
            "The country's culture minister, speaking at a ceremony at the museum, called the decision 'an act of "
            "justice that our grandparents hoped for and did not live to see'. Descendants of the royal family "
            "attended the ceremony, and one of them, a great-grandson of the last king, performed a traditional "
            "blessing in front of the statues.",
            "Not everyone welcomed the move. A group of former trustees argued in a letter to a national newspaper "
            "that the decision could set a precedent that would empty museums of their collections, and that the "
            "statues were seen by more visitors in their current home than they would be elsewhere.",
            "The return follows similar decisions by museums in Germany, France and the United States in recent "
            "years. The government has said that a law preventing national museums from giving away objects does "
            "not apply in this case because the statues were bought, not donated.",
        ),
    ),
]

QA = [
    "who was the first woman to win a nobel prize",
    "what is the capital city of new zealand",
    "where does the river danube flow into the sea",
    "which planet in our solar system has the shortest day",
]

MATH_REASONING = [
    "Jamal bakes 4 trays of cookies with 18 cookies on each tray. He gives a third of the cookies to his "
    "neighbours and packs the rest into bags of 6. How many bags does he fill?",
    "A cinema charges $11 for adults and $7 for children. On Sunday it sold 134 tickets and took $1,206. How many "
    "children's tickets did it sell?",
    "Elena's garden is 18 metres long and 12 metres wide. She covers a quarter of it with a patio and plants grass "
    "on the rest. Grass seed costs $3 per bag and one bag covers 9 square metres. How much does she spend on seed?",
    "A cyclist rides from town A to town B at 24 km per hour and returns along the same road at 16 km per hour. "
    "The whole trip takes 5 hours. How far apart are the two towns?",
]

RAG = [
    (
        "who invented the first practical electric light bulb",
        [
            (
                "Incandescent light bulb",
                "An incandescent light bulb produces light by heating a wire filament until it glows. Many inventors "
                "worked on the idea during the nineteenth century, including Humphry Davy, Warren de la Rue and Joseph "
                "Swan, who demonstrated a working carbon-filament lamp in Newcastle upon Tyne in 1879. Thomas Edison's "
                "laboratory in Menlo Park, New Jersey, developed a long-lasting carbon filament in a high vacuum the same "
                "year, and Edison is usually credited with the first commercially practical bulb because he also built "
                "the generators, wiring and meters needed to sell electric light.",
            ),
            (
                "Joseph Swan",
                "Sir Joseph Wilson Swan (1828–1914) was an English physicist and chemist. His house in Gateshead was the "
                "first in the world to be lit by a light bulb, and in 1881 the Savoy Theatre in London became the first "
                "public building lit entirely by electricity, using his lamps. After a patent dispute, Swan and Edison "
                "formed a joint company in Britain, known as Ediswan, which manufactured lamps for many years.",
            ),
            (
                "Menlo Park, New Jersey",
                "Menlo Park is an unincorporated community within Edison Township in Middlesex County, New Jersey. It is "
                "best known as the site of the research laboratory that Thomas Edison established in 1876, sometimes "
                "described as the first industrial research laboratory. The township was renamed Edison in 1954 in his "
                "honour, and a memorial tower topped by a giant light bulb now marks the spot where the laboratory stood.",
            ),
            (
                "LED lamp",
                "An LED lamp is a light-emitting diode product assembled into a lamp for use in lighting fixtures. LED "
                "lamps have a lifespan many times longer than equivalent incandescent lamps and are significantly more "
                "efficient, converting a much larger share of electricity into visible light. Many countries phased out "
                "the sale of general-purpose incandescent bulbs in the 2010s, and LED lamps have since become the most "
                "common choice for homes and offices.",
            ),
        ],
    ),
    (
        "how long is the great barrier reef",
        [
            (
                "Great Barrier Reef",
                "The Great Barrier Reef is the world's largest coral reef system, composed of over 2,900 individual reefs "
                "and 900 islands stretching for over 2,300 kilometres over an area of approximately 344,400 square "
                "kilometres. It lies in the Coral Sea, off the coast of Queensland, Australia, and can be seen from outer "
                "space. The reef is built by billions of tiny organisms known as coral polyps and supports a wide "
                "diversity of life. It was selected as a World Heritage Site in 1981.",
            ),
            (
                "Coral bleaching",
                "Coral bleaching happens when corals lose the symbiotic algae that live in their tissues and give them "
                "their colour. The main cause is water that stays warmer than usual for several weeks. Bleached corals "
                "are not dead, but they are under stress and more likely to die if the warm conditions continue. Mass "
                "bleaching events affected large parts of the Great Barrier Reef in 1998, 2002, 2016, 2017 and 2020, "
                "raising concern about the reef's long-term future.",
            ),
            (
                "Queensland",
                "Queensland is the second-largest state of Australia by area. It is bordered by the Northern Territory, "
                "South Australia and New South Wales, and its coastline runs along the Coral Sea and the Pacific Ocean. "
                "The state capital and largest city is Brisbane. Tourism is one of Queensland's most important "
                "industries, with visitors drawn by its beaches, rainforests and the islands of the Whitsunday group.",
            ),
        ],
    ),
    (
        "what language is spoken in the capital of belgium",
        [
            (
                "Brussels",
                "Brussels is a region of Belgium comprising nineteen municipalities, including the City of Brussels, "
                "which is the capital of the country. It is officially bilingual in French and Dutch, although French "
                "has been the majority language since the late nineteenth century. Street names and public signs appear "
                "in both languages. Because it hosts the main institutions of the European Union and the headquarters of "
                "NATO, many other languages are spoken by residents, and English is widely used in business.",
            ),
            (
                "Languages of Belgium",
                "Belgium has three official languages: Dutch, French and German. Dutch is spoken by about 60 percent of "
                "the population, mainly in Flanders in the north, while French is the main language of Wallonia in the "
                "south. A small German-speaking community lives in the east of the country near the border with Germany. "
                "Language has long been a source of political tension, and the country's federal structure is organised "
                "largely around its language communities.",
            ),
            (
                "Atomium",
                "The Atomium is a landmark building in Brussels, originally constructed for the 1958 World's Fair. It "
                "is 102 metres tall and consists of nine steel spheres connected so that the whole forms the shape of a "
                "unit cell of an iron crystal magnified 165 billion times. Tubes connecting the spheres hold escalators, "
                "and the top sphere offers a panoramic view of the city. It now serves as a museum and is one of the "
                "most visited attractions in Belgium.",
            ),
            (
                "Flanders",
                "Flanders is the Dutch-speaking northern portion of Belgium and one of the communities, regions and "
                "language areas of the country. Its main cities include Antwerp, Ghent and Bruges. Although Brussels is "
                "located within Flanders geographically, it is a separate region with its own government, and the "
                "Flemish parliament and government nevertheless have their seat in the city.",
            ),
        ],
    ),
]

"""Texts of the quick suite and of `dev-v1` (the dev suite of earlier releases), written for this project (fictional
places, people and figures); the 13-category `dev` and `heldout` splits live in ``texts_dev.py`` and ``texts_heldout.py``.

ARTICLES feed summarization and retrieval-augmented generation; the other lists are used as they stand.
"""

from ..code_prompts import CODE_INSTRUCTION, HUMANEVAL_IDS  # noqa: F401 - the quick suite's code questions

ARTICLES = [
    (
        "Rooftop hives change a neighbourhood",
        "When the city of Marlow Bay opened its first rooftop apiary on the central library in 2019, few residents expected it to last a season. Five years later the programme runs 140 hives on 38 public buildings, and volunteers harvested roughly 2.3 tonnes of honey last summer. The project began as a response to a regional survey that found wild pollinator numbers in the valley had fallen by almost a third in a decade. City ecologist Dana Whitlock argued that managed hives alone would not reverse the decline, so every new apiary must be paired with a pollinator strip: a band of native flowering plants planted within 500 metres of the hives.\n\n"
        "The strips have turned out to matter more than the honey. A monitoring study by the local university counted 41 species of wild bees along the strips in 2023, compared with 17 in the same streets before planting. Critics worry that honeybees compete with wild bees for nectar, and the council has responded by capping the number of hives per district at twelve. Schools now use the rooftop sites for biology lessons, and the honey is sold at the Saturday market, with the proceeds paying for seeds and for two part-time beekeepers who train new volunteers each spring.",
    ),
    (
        "The Halden valley railway returns",
        "After thirty-one years without passenger trains, the Halden valley line reopened in March with an hourly service between Kessing and the market town of Orrvik. The 46-kilometre route had closed in 1993 when falling passenger numbers and a collapsing viaduct at Brennmoor made repairs seem impossible to justify. A campaign led by retired signal engineer Tomas Lindqvist kept the trackbed free of development, and in 2018 the regional government agreed to fund a rebuild at a cost of 212 million euros.\n\n"
        "The new service uses battery-electric trains that recharge under short stretches of overhead wire at both terminals, avoiding the expense of electrifying the whole line. Journey time is 38 minutes, against 70 minutes by the replacement bus it supersedes. In the first three months the line carried an average of 4,100 passengers a day, well above the forecast of 2,600. Not everyone is pleased: farmers near the restored level crossings complain of long waits, and the operator admits that the Friday evening trains are often overcrowded. Plans for a second platform at Orrvik and longer trains are expected to be decided next year.",
    ),
    (
        "Growing coral on underwater ropes",
        "Marine biologists working off the coast of the Seraph Islands have reported unusually high survival rates for corals grown in an underwater nursery and then transplanted to damaged reefs. The team, led by Dr. Amara Okafor, grows fragments of branching coral on ropes strung between anchored frames at a depth of eight metres, where the water is calmer and cooler than at the surface. After nine to twelve months, the fragments are large enough to be tied onto dead reef structure with biodegradable cable ties.\n\n"
        "Of the 6,800 fragments transplanted between 2020 and 2022, 74 percent were still alive after two years, compared with survival of around 40 percent reported by similar projects elsewhere. The researchers credit two choices: they select fragments from colonies that survived the 2016 bleaching event, and they transplant in the cooler months to spare the young corals heat stress. Fish surveys show that restored patches attract twice as many juvenile fish as untouched dead reef. Okafor cautions that restoration cannot keep pace with the loss caused by warming seas and says the work only buys time while emissions are reduced. The project is funded until 2027 by a fisheries cooperative and a diving association.",
    ),
    (
        "A software firm tries the four-day week",
        "Brightwire, a software company of 85 employees based in Lindenport, moved all of its staff to a four-day, 32-hour week in January of last year without reducing pay. Chief executive Priya Raman says the decision followed two years in which the company lost almost a fifth of its engineers to larger competitors each year. Under the new schedule, teams choose between taking Mondays or Fridays off, and customer support is covered by a rota so that clients can still reach someone five days a week.\n\n"
        "Twelve months in, the company published figures from its own tracking. Staff turnover fell from 19 percent to 6 percent, and the number of sick days dropped by 35 percent. The count of features shipped per quarter stayed roughly level, while the average time to resolve customer tickets rose slightly, from 9 to 11 hours. Raman admits that meetings had to be cut hard: recurring meetings are now limited to 30 minutes and require a written agenda. Some employees told a local newspaper that the compressed week makes the remaining days more intense. The board will decide in the spring whether to make the arrangement permanent.",
    ),
    (
        "The lighthouse at Greyhaven Point",
        "The lighthouse at Greyhaven Point was completed in 1857 after a winter storm drove three merchant ships onto the rocks below the headland in a single night. Built from granite quarried two miles inland, the tower stands 31 metres tall, and its original oil lamp could be seen 18 nautical miles out to sea. For ninety years the light was tended by keepers who lived with their families in the cottages at its base, winding the clockwork that turned the lens every four hours through the night.\n\n"
        "The light was converted to electricity in 1947 and fully automated in 1989, when the last keeper, Margaret Ellison, left after twenty-two years of service. The cottages then stood empty until a local trust bought them in 2005 and opened a small museum that displays the original Fresnel lens, keepers' logbooks and photographs of shipwrecks. The tower itself is still an active aid to navigation, now using an LED lamp that consumes less power than a kettle. Coastal erosion is the greatest threat: the cliff edge has retreated eleven metres since 1900, and engineers estimate the tower will need to be moved or protected within fifty years.",
    ),
    (
        "Finding leaks with smart water meters",
        "The water utility serving the city of Cardell is losing less water to leaks since it installed 92,000 smart meters over the past three years. Before the upgrade, about 24 percent of the treated water that entered the network never reached a customer, most of it escaping from ageing cast-iron mains. The new meters report usage every fifteen minutes, and software flags properties whose consumption never drops to zero overnight, a typical sign of a leaking pipe or a running toilet.\n\n"
        "Utility engineer Samuel Ortiz says the most useful data comes from comparing the flow into each district with the total reported by the meters inside it. When the gap grows, crews use acoustic sensors to locate the leak, often before it becomes visible on the surface. Losses have fallen to 15 percent, saving roughly 6 million cubic metres of water a year, enough to supply a town of 40,000 people. Customers have also been alerted to 11,000 leaks on their own property. Privacy groups raised concerns that fine-grained usage data could reveal when homes are empty, and the utility now deletes readings older than thirteen months and does not share them with third parties.",
    ),
    (
        "A library that lends tools",
        "The new public library in the Eastfield district opened in October with something its predecessor never had: a makerspace with two 3D printers, a laser cutter, sewing machines and a workshop of hand tools that members can borrow like books. The building replaced a cramped 1960s branch that had been closed for two years because of a leaking roof. Designed by the architecture firm Holm and Reyes, it uses a timber frame and a green roof that collects rainwater for the toilets.\n\n"
        "Library director Elena Fischer says visits in the first six weeks were three times higher than at the old branch, with a noticeable increase in teenagers after school. Tool loans have been especially popular: drills, ladders and a carpet cleaner are usually reserved weeks in advance. Staff run free introductory sessions on the laser cutter on Tuesday and Thursday evenings, and users must complete one before booking the machine on their own. The library has also kept a quiet reading room on the top floor after residents complained during consultations that modern libraries had become too noisy. The project cost 14 million euros, a quarter of it from a national fund for community buildings.",
    ),
    (
        "Sleep, memory and exam results",
        "A study of 600 first-year students at the University of Aldmoor suggests that how regularly students sleep matters as much for their grades as how long they sleep. Researchers gave participants wrist-worn activity trackers for an entire semester and compared the data with their exam results. Students whose bedtimes varied by more than two hours from night to night scored, on average, eight percentage points lower than those with a consistent schedule, even when their total sleep was the same.\n\n"
        "The lead author, psychologist Dr. Henrik Vass, explains that memory consolidation depends partly on deep sleep early in the night, and irregular schedules appear to shorten those phases. The effect was strongest for subjects that require memorising large amounts of material, such as anatomy and law. The researchers caution that the study shows a correlation, not proof of cause: students with irregular sleep may also differ in other ways, such as working night jobs. Still, the university has responded by moving its earliest exams from 8 a.m. to 10 a.m. and by running a campaign that encourages students to keep the same bedtime during exam periods.",
    ),
]

SUMMARY_INSTRUCTIONS = [
    "Summarize the following news article in three or four sentences.",
    "Write a short summary of the article below for a busy reader.",
    "Summarize the main points of this article in a few sentences.",
    "Give a concise summary of the following article, keeping the key figures.",
]

# (article index, question) for retrieval-augmented generation; two other articles are the distractor documents.
RAG_QUESTIONS = [
    (
        0,
        "Why must every new apiary in Marlow Bay be paired with a pollinator strip, and what did the monitoring study find?",
    ),
    (
        1,
        "How do the trains on the Halden valley line recharge, and how many passengers used the line in its first months?",
    ),
    (2, "Which two choices do the researchers credit for the high coral survival rate?"),
    (3, "What happened to staff turnover and ticket resolution times after Brightwire moved to a four-day week?"),
    (4, "When was the Greyhaven Point light automated, and what threatens the tower today?"),
    (5, "How does the Cardell utility detect leaks, and how much water does it save?"),
    (6, "What rules apply before a member of the Eastfield library can book the laser cutter alone?"),
    (
        7,
        "According to the Aldmoor study, how did irregular bedtimes relate to exam scores, and why should the result be treated with caution?",
    ),
]

TRANSLATIONS = [
    (
        "German",
        "Die Stadtverwaltung hat beschlossen, die Öffnungszeiten der Bibliotheken ab dem nächsten Monat zu verlängern. An Wochentagen bleiben die Filialen künftig bis 21 Uhr geöffnet, am Samstag bis 18 Uhr. Die zusätzlichen Stunden werden durch Studierende abgedeckt, die neben ihrem Studium als Aushilfen arbeiten.",
    ),
    (
        "German",
        "Nach tagelangen Regenfällen ist der Fluss in mehreren Dörfern über die Ufer getreten. Die Feuerwehr hat Sandsäcke verteilt und einige Straßen gesperrt. Verletzt wurde nach Angaben der Polizei niemand, doch viele Keller stehen unter Wasser, und die Schäden an den Feldern werden erst in den kommenden Wochen sichtbar sein.",
    ),
    (
        "German",
        "Das kleine Unternehmen stellt seit über vierzig Jahren Fahrräder in Handarbeit her. Jeder Rahmen wird einzeln geschweißt und lackiert, weshalb die Wartezeit für ein neues Rad inzwischen bei sechs Monaten liegt. Der Inhaber sagt, er wolle lieber weniger verkaufen als die Qualität zu gefährden.",
    ),
    (
        "German",
        "Forscher haben in einem alten Klostergarten eine Apfelsorte wiederentdeckt, die seit mehr als hundert Jahren als verschollen galt. Die Bäume tragen kleine, sehr aromatische Früchte, die sich lange lagern lassen. Nun sollen Reiser an Baumschulen verteilt werden, damit die Sorte wieder in private Gärten gelangt.",
    ),
    (
        "French",
        "Le conseil municipal a approuvé la construction d'une nouvelle piste cyclable le long du canal. Les travaux commenceront au printemps et devraient durer environ huit mois. Les commerçants du quartier craignent une baisse de fréquentation pendant le chantier, mais la mairie promet de maintenir l'accès aux magasins.",
    ),
    (
        "French",
        "Chaque été, le festival attire des milliers de visiteurs dans ce petit village de montagne. Cette année, les organisateurs ont décidé de limiter le nombre de billets afin de réduire les embouteillages et de protéger les sentiers. Les concerts du soir seront aussi diffusés gratuitement sur la place principale.",
    ),
    (
        "Spanish",
        "El museo de la ciudad reabrirá sus puertas el próximo sábado después de dos años de reformas. Las nuevas salas ofrecen más luz natural y un recorrido adaptado a personas con movilidad reducida. Durante el primer mes, la entrada será gratuita para los vecinos que presenten su documento de identidad.",
    ),
    (
        "Spanish",
        "Un grupo de voluntarios ha plantado más de tres mil árboles en las colinas que ardieron el verano pasado. Los ingenieros forestales eligieron especies autóctonas que resisten mejor la sequía. Según los organizadores, harán falta al menos diez años para que el bosque recupere su aspecto anterior.",
    ),
]

QA = [
    "Why does the sky look blue during the day but red and orange at sunset?",
    "What is the difference between a virus and a bacterium, and why do antibiotics only work against one of them?",
    "How does a refrigerator keep food cold? Explain the basic cycle.",
    "Why do we have leap years, and how is it decided which years are leap years?",
    "What causes the seasons on Earth?",
    "How do vaccines train the immune system to recognise a disease?",
    "What is inflation, and what tools does a central bank use to control it?",
    "Why does ice float on water while most solids sink in their own liquid?",
]

MATH = [
    "A bakery sells muffins for $3 each and cookies for $1.50 each. On Saturday it sold 48 muffins and twice as many cookies. How much money did the bakery make from muffins and cookies on Saturday?",
    "Lena reads 25 pages of a book every weekday and 40 pages on each day of the weekend. Her book has 410 pages. If she starts on a Monday, on which day will she finish the book?",
    "A farmer has 120 metres of fencing and wants to build a rectangular pen along a river, so the side by the river needs no fence. If the side parallel to the river is 60 metres long, how long is each of the other two sides, and what is the area of the pen?",
    "A train leaves a station at 9:15 and travels at 80 km per hour. A second train leaves the same station at 10:00 on the same track and travels at 100 km per hour. At what time will the second train catch up with the first?",
    "Tom buys a bicycle for $240 and sells it a year later at a loss of 15 percent. He then spends the money on books that cost $12 each. How many books can he buy, and how much money is left over?",
    "A school has 540 students. One third of them walk to school, 25 percent come by bus, and the rest are driven by their parents. How many students are driven to school?",
    "A water tank holds 1,200 litres. One pipe fills it at 40 litres per minute while a leak drains 10 litres per minute. If the tank starts empty, how long does it take to fill completely?",
    "Maria saves $15 in the first week, and each week after that she saves $5 more than the week before. How much has she saved in total after 8 weeks?",
]

REWRITE = (
    "hey team, so the meeting got moved from tuesday to thursday at 3pm because the projector in room 4 is broken "
    "again and facilities says they can't fix it before wednesday. bring your laptops, we'll use the big screen "
    "in room 7 instead. also dont forget the budget numbers, sarah needs them by friday noon at the latest."
)

MT_BENCH = [
    [
        "Write a short blog post about a weekend trip to a seaside town, describing the food, the people and one unexpected moment.",
        "Now rewrite the same post as a four-line poem that rhymes.",
    ],
    [
        "Explain to a ten-year-old how the internet delivers a web page to their computer.",
        "Now explain the same thing to a university student in computer science, using the correct technical terms.",
    ],
    [
        "Draft a polite email to my landlord asking to repair a broken heater that has not worked for a week.",
        "The landlord did not reply. Write a firmer follow-up email that mentions the first one.",
    ],
    [
        "Give me five tips for preparing for a job interview at a small software company.",
        "Turn those tips into a checklist I can print, with one short line per item.",
    ],
    [
        "Describe the character of a retired sea captain who runs a small bookshop, in one paragraph.",
        "Write a short dialogue between this captain and a child who asks about the sea.",
    ],
    [
        "What are the main advantages and disadvantages of working from home?",
        "Summarize your answer as a table with two columns.",
    ],
    [
        "Suggest a three-day itinerary for a first visit to a large European capital city of your choice.",
        "Adapt the itinerary for a family travelling with two young children.",
    ],
    [
        "Explain what a hash table is and why lookups are usually fast.",
        "Write a small Python example that counts word frequencies with a dictionary and prints the top three words.",
    ],
]

# HumanEval problems used in the code category (every 20th task, spread across the set).

"""Texts of the ``dev`` split of the built-in suite: the 13 Spec-Bench categories, written for this project.

Every text is original (no question is copied from MT-bench, WMT, CNN/DailyMail, Natural Questions or GSM8K); they
imitate the style and length of those benchmarks so that drafting is as hard as on them. ``dev`` may be used to tune
drafters and heads; ``texts_heldout.py`` holds the questions that nothing may tune on (see ``make_suites.py``).
"""

# MT-bench-style categories: each question has two user turns, the second one building on the model's first answer.
MT_BENCH = {
    "writing": [
        [
            "Write a persuasive opinion piece of about 300 words for a local newspaper, arguing that the town should "
            "turn its disused freight railway into a walking and cycling path. Address the cost and the objections of "
            "nearby homeowners.",
            "Rewrite your piece as a short letter to the mayor, no longer than 120 words, keeping the two strongest "
            "arguments.",
        ],
        [
            "Draft a product announcement for a small company launching a reusable coffee cup that folds flat to fit in "
            "a pocket. The audience is commuters; keep the tone upbeat but avoid exaggerated claims.",
            "Now write three different subject lines for an email carrying this announcement, each under eight words, "
            "and explain which one you would choose.",
        ],
        [
            "Write a short story of about 250 words that begins with the sentence: 'The last bus of the night never "
            "stopped at Elm Street, until it did.'",
            "Retell the same story from the point of view of the bus driver, in the first person, in no more than five "
            "sentences.",
        ],
    ],
    "roleplay": [
        [
            "Imagine you are a tour guide at a medieval castle. A group of teenagers has just arrived and looks bored. "
            "Welcome them and tell them about life in the castle in a way that gets their attention.",
            "One of the teenagers asks whether the castle had a dungeon and whether anyone was ever tortured there. "
            "Answer in character, honestly but without gory detail.",
        ],
        [
            "Act as a personal fitness coach. I am 45, I sit at a desk all day, and I get out of breath climbing two "
            "flights of stairs. What would you have me do in the first four weeks?",
            "I hurt my knee last year and running makes it ache. Adjust your plan, staying in the role of my coach.",
        ],
        [
            "You are a ship's cook on a whaling vessel in 1850, writing a letter home to your sister after six months "
            "at sea. Describe the food, the crew and what you miss most.",
            "Your sister writes back asking whether you will sign on for another voyage. Write your reply.",
        ],
    ],
    "reasoning": [
        [
            "Five friends, Ana, Ben, Carla, Dev and Eli, stand in a line for concert tickets. Carla is somewhere ahead "
            "of Ben. Eli is directly behind Ana. Dev is neither first nor last. Ben is not last. Who is last in the line, "
            "and is the order fully determined? Explain your reasoning.",
            "Suppose we learn in addition that Dev stands directly in front of Carla. What is the complete order now?",
        ],
        [
            "A farmer has to get a fox, a hen and a sack of grain across a river. The boat holds the farmer and one "
            "item. Left alone, the fox eats the hen and the hen eats the grain. How many crossings does he need at "
            "least? List them.",
            "Now the boat can carry the farmer and two items, but the fox and the hen may never be in the boat together. "
            "What is the smallest number of crossings now?",
        ],
        [
            "If it takes 6 workers 10 days to paint 3 identical houses, how long would it take 4 workers to paint 5 "
            "such houses, assuming all workers paint at the same rate? Show your reasoning.",
            "The owner wants the 5 houses painted in 15 days. How many workers must be hired, and how much spare time "
            "will they have?",
        ],
    ],
    "math": [
        [
            "A rectangle has a perimeter of 46 cm and a diagonal of 17 cm. What are the lengths of its sides?",
            "If each side of the rectangle is increased by 20 percent, by what percentage does its area increase?",
        ],
        [
            "Find all real solutions of the equation x^4 - 13x^2 + 36 = 0.",
            "Now find the sum of the squares of all the solutions without solving the equation again, and explain the "
            "shortcut you used.",
        ],
        [
            "Two fair six-sided dice are rolled. What is the probability that the product of the two numbers is even?",
            "What is the probability that the product is a perfect square?",
        ],
    ],
    "coding": [
        [
            "Write a Python function that takes a list of meeting time intervals, each a pair (start, end) in minutes, "
            "and returns the minimum number of meeting rooms needed so that no two meetings in the same room overlap.",
            "Extend the function so that it also returns, for each meeting, the index of the room it is assigned to.",
        ],
        [
            "Write a SQL query that, given a table orders(id, customer_id, amount, created_at), returns the three "
            "customers with the highest total order amount in the year 2023, together with their totals.",
            "Modify the query so that customers tied on total amount are all included, even if that returns more than "
            "three rows.",
        ],
        [
            "Implement a least-recently-used (LRU) cache class in Python with get and put methods, both running in "
            "O(1) time, and a fixed capacity given to the constructor.",
            "Add a method that returns the keys currently in the cache ordered from most to least recently used, and "
            "write two unit tests for it.",
        ],
    ],
    "extraction": [
        [
            "Extract every company mentioned in the following text, with its country and the amount it invested, and "
            "return the result as JSON.\n\n"
            "The new battery plant outside Szeged will be built by a consortium led by Norvolt of Sweden, which is "
            "putting in 1.2 billion euros. The Korean group Hanseong Materials adds 400 million euros and will supply "
            "the cathodes, while a Hungarian utility, DélEnergia, contributes 85 million euros and a grid connection. "
            "Construction is due to begin in the spring, and the partners expect to hire about 2,000 people by 2027.",
            "Now return the same data as a Markdown table sorted by investment, with a final row for the total.",
        ],
        [
            "From the customer reviews below, extract the product, the rating out of 5 and the main complaint, if "
            "any, as one line per review in the format product | rating | complaint.\n\n"
            "1. 'The Aurora desk lamp is bright enough, but the touch switch stops working if you breathe on it. Three "
            "stars.'\n"
            "2. 'Five stars for the TrailMate backpack, survived two weeks of rain in Scotland without a single leak.'\n"
            "3. 'Honestly disappointed with the Breeze 300 fan. It rattles at the highest setting. Two out of five.'\n"
            "4. 'The QuickBrew kettle boils fast and looks great, 4/5, though the lid is a bit stiff.'",
            "Which review is the most positive, and which product would you avoid? Answer in two sentences based only "
            "on the reviews.",
        ],
        [
            "Read the meeting notes below and list every action item with its owner and deadline.\n\n"
            "Notes from the Tuesday planning call: Marta will send the revised budget to finance by Friday. The launch "
            "date stays at 14 June unless the supplier misses the 1 May delivery, in which case Tom decides on a new "
            "date. Priya agreed to draft the press release and circulate it by the end of next week. Nobody has "
            "volunteered yet to update the website; we will revisit this on Thursday. Jonas reminded everyone that "
            "expense reports for March are due on the 10th.",
            "Which of the items carry a risk of being forgotten, and why? Suggest one change to the notes that would "
            "prevent it.",
        ],
    ],
    "stem": [
        [
            "Explain how a lithium-ion battery stores and releases energy, and why its capacity slowly falls over "
            "hundreds of charging cycles.",
            "Based on your explanation, give practical advice to a phone owner who wants the battery to last as many "
            "years as possible.",
        ],
        [
            "What is the difference between weather and climate, and why can scientists predict the climate decades "
            "ahead when they cannot forecast the weather more than two weeks ahead?",
            "Explain the same idea to a twelve-year-old using an analogy.",
        ],
        [
            "Describe how CRISPR-Cas9 is used to edit a gene, step by step, and name two of its main limitations.",
            "What are the ethical arguments for and against editing human embryos with this technique?",
        ],
    ],
    "humanities": [
        [
            "Compare the causes of the French Revolution with those of the American Revolution. Which factors did "
            "they share and which were unique to each?",
            "Which of the two revolutions had the greater influence on nineteenth-century Europe? Argue your case.",
        ],
        [
            "Explain the concept of opportunity cost in economics and illustrate it with three examples from everyday "
            "life.",
            "How does opportunity cost apply to a government deciding whether to build a new airport?",
        ],
        [
            "What did the philosopher John Stuart Mill mean by the harm principle, and what are the main criticisms "
            "of it?",
            "Apply the harm principle to the question of whether a city should ban smoking in public parks.",
        ],
    ],
}

TRANSLATIONS = [
    (
        "German",
        "Die Bundesregierung will den Ausbau der Ladeinfrastruktur für Elektroautos deutlich beschleunigen. "
        "Bis Ende 2030 sollen in ganz Deutschland eine Million öffentliche Ladepunkte zur Verfügung stehen, "
        "teilte das Verkehrsministerium am Mittwoch in Berlin mit.",
    ),
    (
        "French",
        "La ministre de la Santé a annoncé jeudi la fermeture temporaire de trois services d'urgence en "
        "Bretagne, faute de médecins disponibles pendant l'été. Les syndicats dénoncent une situation qui se "
        "répète chaque année sans qu'aucune solution durable ne soit trouvée.",
    ),
    (
        "Spanish",
        "Las lluvias torrenciales de los últimos días han obligado a evacuar a más de dos mil personas en la "
        "provincia de Valencia. Los servicios de emergencia mantienen la alerta roja y piden a los vecinos "
        "que eviten desplazamientos innecesarios.",
    ),
    (
        "Chinese",
        "据当地媒体报道，该市今年第一季度的旅游收入比去年同期增长了百分之二十三。"
        "市政府表示，将继续改善公共交通，并在老城区增设更多步行街。",
    ),
]

ARTICLES = [
    (
        "Council approves plan to close city centre to cars on Sundays",
        (
            "Cars will be banned from the centre of Westbridge every Sunday from next spring, after councillors voted "
            "by 31 votes to 18 on Tuesday night to approve a year-long trial that supporters say will make the city "
            "cleaner and its shops busier.",
            "Under the plan, the area inside the old ring road will be closed to private vehicles between 9am and 6pm. "
            "Buses, taxis, delivery vans before 10am and residents with permits will still be allowed in. The council "
            "estimates that around 14,000 car journeys a day pass through the zone at weekends, many of them drivers "
            "looking for parking.",
            "Council leader Fiona Gallagher said the trial was a response to air quality readings that had exceeded "
            "national limits on 23 days last year, most of them at weekends. 'We have tried asking people nicely,' she "
            "told the meeting. 'Cities across Europe have shown that when you give the streets back to people, they "
            "come. We want to find out whether that is true here.'",
            "But the plan has divided local businesses. The Westbridge Chamber of Commerce, which represents about 600 "
            "firms, warned that shoppers from surrounding villages, where bus services are limited, could simply drive "
            "to the out-of-town retail park instead. Its chairman, Graham Pike, said members had not been properly "
            "consulted. 'Sunday is the second busiest day for many of our retailers,' he said. 'A ten percent drop "
            "would put some of them out of business.'",
            "Others were more enthusiastic. Leila Haddad, who runs a café on Market Street, said she hoped to put "
            "tables on the road. 'On the two car-free days we had last summer, I took more money than on any other "
            "Sunday of the year,' she said.",
            "To address concerns about access, the council will run free park-and-ride buses from two car parks on "
            "the edge of the city every ten minutes, at a cost of about £320,000 for the year. Blue badge holders will "
            "keep access to 40 parking spaces inside the zone.",
            "The trial will be reviewed after six months, when the council will publish figures on footfall, air "
            "quality and the use of the park-and-ride service. Opposition councillors, who voted against the plan, "
            "called for a public referendum before any permanent change is made.",
        ),
    ),
    (
        "Hospital waiting lists fall for the first time in four years",
        (
            "The number of patients waiting for planned hospital treatment in the region has fallen for the first "
            "time in four years, according to figures published on Thursday, although health officials warned that "
            "the improvement was fragile and could be reversed by a difficult winter.",
            "The waiting list stood at 412,000 at the end of September, down from a peak of 431,000 in May. The number "
            "of people who had waited more than a year for treatment fell by almost a third, to 9,800. Hip and knee "
            "replacements, cataract surgery and hernia repairs accounted for most of the reduction.",
            "Health officials credited two new surgical hubs, which opened in the spring at former community "
            "hospitals in Ashford Vale and Kerrin. The hubs handle only routine operations, so their theatres are not "
            "disrupted when emergency patients need beds. Together they carried out 7,200 procedures in their first "
            "five months. 'When operating theatres are protected from emergency pressures, productivity goes up "
            "sharply,' said Dr. Naveen Kapoor, the region's medical director.",
            "Staff have also been working weekend shifts, paid at a higher rate, to clear the longest waits. The "
            "extra shifts cost about £18 million this year, and officials have not said whether the money will be "
            "available in the next financial year.",
            "Patient groups welcomed the figures but said they masked wide differences between hospitals. At the "
            "Northgate Infirmary, the median wait for orthopaedic surgery is still 41 weeks, compared with 19 weeks "
            "at the best-performing hospital. Margaret Cole, 71, who has been waiting 14 months for a knee operation, "
            "said: 'I read that things are getting better, but nobody has told me when my turn is.'",
            "Unions warned that staff were exhausted. A survey by the nurses' union found that 38 percent of theatre "
            "nurses in the region were considering leaving within two years. Officials said that recruitment of 300 "
            "additional nurses from abroad was under way and that the first would arrive in January.",
        ),
    ),
    (
        "Record heat forces vineyards to harvest weeks early",
        (
            "Winemakers across the south of the country began picking grapes in the first week of August this year, "
            "the earliest harvest on record, after a summer of heatwaves that scientists say is becoming the new "
            "normal for the region.",
            "In the Serra Alta valley, where harvests traditionally began in mid-September, growers started cutting "
            "white grape varieties on 3 August, after temperatures topped 40C on eleven days in July. Sugar levels in "
            "the grapes rose so quickly that waiting longer would have produced wines with too much alcohol and too "
            "little acidity, said Joana Ribeiro, who manages 60 hectares of vines near the village of Castelo Branco "
            "da Serra.",
            "'My grandfather picked at the end of September. My father picked in the middle of the month. I am "
            "picking in August,' she said. 'We have moved the whole calendar by six weeks in two generations.'",
            "Yields are expected to be 15 to 20 percent lower than average because many grapes shrivelled in the "
            "heat, according to the regional winemakers' association. However, the association said the quality of "
            "the early-picked grapes was good, and prices for bulk wine have risen since June.",
            "Researchers at the national agricultural institute say the trend is clear. Their records, which go back "
            "to 1950, show the average harvest date in the region has moved forward by 19 days since 1980. The "
            "institute is testing 30 grape varieties from hotter countries, including Greece and Cyprus, to find "
            "ones that keep their acidity in extreme heat.",
            "Some growers are already adapting. Several estates have moved new plantings to higher slopes, where "
            "nights are cooler, and others have started to pick at night, when grapes are cooler and need less "
            "energy to chill at the winery. Ribeiro has installed shade nets over her most exposed vines. 'It is "
            "expensive,' she said, 'but losing a whole harvest would be more expensive.'",
        ),
    ),
]

QA = [
    "who composed the music for the ballet swan lake",
    "what is the largest moon of saturn",
    "when did the berlin wall come down",
    "how many bones are there in the adult human body",
]

MATH_REASONING = [
    "Carlos runs a lemonade stand. He spends $12 on lemons and $5 on sugar, which is enough for 60 cups. He sells "
    "each cup for $0.75 and sells 48 cups on Saturday. How much profit does he make on Saturday?",
    "A library has 1,250 books. In March it buys 180 new books and gives away 95 old ones. In April it buys twice "
    "as many books as in March and gives away 60. How many books does the library have at the end of April?",
    "Priya's phone plan costs $25 a month plus $0.10 for every minute over 300 minutes. Last month she talked for "
    "470 minutes. This month she talked 20% less. How much more did she pay last month than this month?",
    "A school trip needs buses that hold 45 students each. There are 212 students and 18 teachers going, and each "
    "bus must carry at least 2 teachers. What is the smallest number of buses needed?",
]

# RAG: a question and retrieved passages (title, text), as a retriever returns them; one or two hold the answer.
RAG = [
    (
        "when did the first transatlantic telegraph cable start working",
        [
            (
                "Transatlantic telegraph cable",
                "The first transatlantic telegraph cable was laid across the floor of the Atlantic Ocean from Valentia "
                "Island in western Ireland to Heart's Content in Newfoundland. The project was led by the American "
                "businessman Cyrus West Field, whose Atlantic Telegraph Company made several failed attempts before the "
                "cable was completed in August 1858. On 16 August 1858 Queen Victoria sent a message of congratulation to "
                "President James Buchanan, which took more than sixteen hours to transmit. The cable failed after only "
                "three weeks, when an engineer applied excessive voltage in an attempt to speed up transmission.",
            ),
            (
                "Great Eastern",
                "The SS Great Eastern was an iron sailing steamship designed by Isambard Kingdom Brunel and launched in "
                "1858. She was by far the largest ship ever built at the time of her launch, able to carry 4,000 "
                "passengers from England to Australia without refuelling. Commercially she was a failure as a passenger "
                "liner, but she found a second career laying submarine telegraph cables, including the durable "
                "transatlantic cable of 1866, which remained in service for years and made regular communication "
                "between Europe and North America possible.",
            ),
            (
                "Electrical telegraph",
                "An electrical telegraph is a point-to-point text messaging system, used from the 1840s until the late "
                "20th century. The first commercial electrical telegraph was built by William Fothergill Cooke and "
                "Charles Wheatstone and entered use on the Great Western Railway in 1838. In the United States, Samuel "
                "Morse developed a system that used a single wire and a code of dots and dashes, and in 1844 he sent the "
                "message 'What hath God wrought' from Washington to Baltimore. Within a few decades telegraph networks "
                "covered most of the industrialised world.",
            ),
            (
                "Heart's Content Cable Station",
                "Heart's Content Cable Station is a provincial historic site in Newfoundland and Labrador, Canada. The "
                "station was the western terminus of the transatlantic cables landed in the 1860s and operated for "
                "about one hundred years before it closed in 1965, having been made obsolete by newer technology. The "
                "building now houses a museum that displays the original equipment, explains how messages were relayed "
                "and tells the story of the operators who lived in the small town.",
            ),
        ],
    ),
    (
        "who designed the sydney opera house",
        [
            (
                "Sydney Opera House",
                "The Sydney Opera House is a multi-venue performing arts centre on Bennelong Point in Sydney Harbour. It "
                "was designed by the Danish architect Jørn Utzon, whose entry won an international design competition in "
                "1957. Construction began in 1959, but disputes with the New South Wales government over costs and "
                "schedules led Utzon to resign in 1966. The building was completed by a team of Australian architects led "
                "by Peter Hall and was formally opened by Queen Elizabeth II on 20 October 1973. It became a UNESCO World "
                "Heritage Site in 2007.",
            ),
            (
                "Jørn Utzon",
                "Jørn Oberg Utzon (1918–2008) was a Danish architect. Besides the Sydney Opera House, his works include "
                "the Bagsværd Church near Copenhagen and the National Assembly of Kuwait. He was awarded the Pritzker "
                "Architecture Prize in 2003. Utzon never returned to Australia to see the completed opera house, although "
                "in the late 1990s he was engaged to prepare design principles to guide future changes to the building, "
                "and a refurbished reception hall was renamed the Utzon Room in his honour.",
            ),
            (
                "Sydney Harbour Bridge",
                "The Sydney Harbour Bridge is a steel through arch bridge across Sydney Harbour that carries rail, "
                "vehicle, bicycle and pedestrian traffic between the central business district and the North Shore. It "
                "was designed and built by the British firm Dorman Long under the direction of John Bradfield, and opened "
                "in 1932. Nicknamed 'the Coathanger' by locals, it was for many years the widest long-span bridge in the "
                "world and remains, together with the nearby opera house, one of the city's best-known landmarks.",
            ),
        ],
    ),
    (
        "what is the main ingredient of traditional japanese miso",
        [
            (
                "Miso",
                "Miso is a traditional Japanese seasoning produced by fermenting soybeans with salt and kōji, a mould "
                "known scientifically as Aspergillus oryzae, and sometimes rice, barley or other grains. The result is a "
                "thick paste used in sauces and spreads, for pickling vegetables or meats, and for mixing with dashi "
                "stock to make miso soup, a staple of Japanese cuisine. Miso is high in protein and rich in vitamins and "
                "minerals. Its colour ranges from white to dark red, and darker varieties are usually fermented longer "
                "and taste stronger.",
            ),
            (
                "Soy sauce",
                "Soy sauce is a liquid condiment of Chinese origin, traditionally made from a fermented paste of "
                "soybeans, roasted grain, brine and Aspergillus mould. It is considered to have been developed during the "
                "Western Han dynasty and spread throughout East and Southeast Asia. In Japan it is called shōyu, and "
                "Japanese soy sauces typically contain more wheat than Chinese ones, which gives them a slightly sweeter "
                "taste. Tamari, a Japanese variety, is made with little or no wheat and was originally the liquid that "
                "collected during the making of miso.",
            ),
            (
                "Dashi",
                "Dashi is a family of stocks used in Japanese cuisine. The most common form is a simple broth made by "
                "heating water containing kombu, an edible kelp, and kezurikatsuo, shavings of preserved skipjack tuna, "
                "to near boiling and then straining the liquid. Dashi forms the base for miso soup, clear broth soups and "
                "noodle broths. Its savoury taste comes largely from glutamates in the kelp and inosinates in the fish, "
                "which together produce the flavour known as umami.",
            ),
            (
                "Natto",
                "Nattō is a traditional Japanese food made from whole soybeans that have been fermented with the "
                "bacterium Bacillus subtilis var. natto. It is often eaten with rice at breakfast and is known for its "
                "strong smell, powerful flavour and slimy, sticky texture. Nattō is especially popular in the eastern "
                "regions of Japan, including Tokyo and Ibaraki, and is valued as a source of protein and of vitamin K2.",
            ),
        ],
    ),
]

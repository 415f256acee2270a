"""Deterministic generator of a diverse chat-prompt set for self-distillation.

The prompts are the inputs whose greedy answers by the target model become the training data of a
draft head (see :mod:`specexport.exporter.training.distill_data`). They are built compositionally from
hand-written templates, topics, entities, numbers and short passages written for this file, so the set
is independent of any evaluation benchmark and can be shipped with the package.

Everything is pure Python and seeded: the same ``(n, seed)`` always gives the same prompts.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path

CATEGORIES: tuple[str, ...] = (
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "math_word",
    "coding",
    "extraction",
    "stem",
    "humanities",
    "translation",
    "summarization",
    "qa",
    "rag",
)
DEFAULT_PER_CATEGORY = 340


def _paragraphs(block: str) -> list[str]:
    """Split a text block into paragraphs separated by blank lines, joining each paragraph's lines."""
    return [" ".join(par.split()) for par in block.strip().split("\n\n") if par.strip()]


def _items(block: str) -> list[str]:
    """Split a text block into items separated by newlines or ``|`` (keeps long content tables compact)."""
    return [item.strip() for line in block.splitlines() for item in line.split("|") if item.strip()]


# ---------------------------------------------------------------------------------------------------
# Shared vocabulary
# ---------------------------------------------------------------------------------------------------

FIRST_NAMES = _items("""
Amara | Bastian | Chloe | Dmitri | Elena | Farid | Greta | Hiroshi | Imani | Jonas | Keiko | Liam | Mateo
Nadia | Oskar | Priya | Quentin | Rosa | Samir | Tamsin | Ulrich | Valentina | Wei | Ximena | Yusuf
Zofia | Aaron | Beatriz | Callum | Deepa | Emeka | Fiona | Gustavo | Hana | Ivan | Jada | Kofi | Lucia
Marcus | Noor | Olga | Pablo | Ruth | Santiago | Thandiwe | Viktor | Wanjiru | Yara | Zane | Anika
""")
LAST_NAMES = _items("""
Okafor | Lindqvist | Moreau | Takahashi | Fernandes | Novak | Haddad | Brennan | Kowalski | Achterberg
Mensah | Castellano | Ivanova | Whitfield | Nakamura | Duarte | Bergström | Oyelaran | Petrakis | Sandoval
Chaudhry | Van Wyk | Rasmussen | Delacroix | Mbeki | Halvorsen | Quispe | Abernathy | Szabo | Yilmaz
""")
CITIES = _items("""
Lisbon | Nairobi | Osaka | Toronto | Krakow | Valparaíso | Edinburgh | Hanoi | Tbilisi | Melbourne
Montreal | Porto | Accra | Ljubljana | Bergen | Cusco | Marrakesh | Seville | Gdansk | Wellington
Cape Town | Bologna | Denver | Austin | Rotterdam | Busan | Lyon | Tallinn | Halifax | Cork
""")
COMPANIES = _items("""
Brightwater Analytics | Kestrel Robotics | Maple & Finch Bakery | Northwind Logistics | Bluefern Health
Orbital Garden Co. | Tidewater Energy | Copperleaf Software | Helix Bikes | Saltmarsh Ceramics
Quarry Lane Books | Silverpine Outdoor | Lumen Optics | Redwood Dental | Cobalt Insurance
Harbor & Vine Wines | Nimbus Cloudworks | Pebble Toys | Granite Legal | Foxglove Pharmacy
Driftwood Surf School | Ironbark Construction | Juniper Travel | Starling Media | Thistle Textiles
Alder Street Clinic | Beacon Solar | Cinder Coffee Roasters
""")
MONTHS = _items("""
January | February | March | April | May | June | July | August | September | October | November
December
""")
WEEKDAYS = _items("""
Monday | Tuesday | Wednesday | Thursday | Friday | Saturday | Sunday
""")


def _person(rng: random.Random) -> str:
    return f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"


def _date(rng: random.Random, years: Sequence[int] = (2023, 2024, 2025)) -> str:
    return f"{rng.choice(MONTHS)} {rng.randint(1, 28)}, {rng.choice(years)}"


def _clock(rng: random.Random) -> str:
    return f"{rng.randint(7, 19)}:{rng.choice(['00', '15', '30', '45', '10', '50'])}"


def _money(rng: random.Random, lo: int, hi: int, step: int = 1) -> str:
    return f"${rng.randrange(lo, hi, step):,}"


def _pick(rng: random.Random, items: Sequence[str], k: int) -> list[str]:
    return rng.sample(list(items), k)


# ---------------------------------------------------------------------------------------------------
# Creative writing
# ---------------------------------------------------------------------------------------------------

STORY_CHARACTERS = _items("""
a retired lighthouse keeper | a nervous first-year teacher | a robot that repairs bicycles
a girl who can hear plants whisper | a detective who is afraid of the dark
an astronaut on her final mission | a street musician in an old harbor town | a baker who never sleeps
a talking cat that runs a secondhand bookshop | a twelve-year-old chess prodigy
an elderly couple on their first road trip | a ghost who haunts a laundromat
a beekeeper high in the mountains | a young dragon who is afraid of fire | a librarian in a floating city
a mail carrier on Mars | a tired night-shift nurse | a farmer who finds a strange glowing seed
a clockmaker's apprentice | a cook on a research submarine | a teenage inventor with a messy garage
a painter who has lost her sense of color | a wandering knight without a sword | a shy museum night guard
a fisherman and his stubborn goat | an AI assistant that secretly wants a holiday
a time traveler stuck in the year 1850 | a mountain rescue dog | a grandmother learning to skateboard
a forgotten toy in an attic | an interpreter at a tense peace summit | a lonely weather satellite
a village witch who dislikes magic | a programmer who wakes up inside a video game
a sea turtle crossing an ocean | a marathon runner with a secret
a weather forecaster who is always wrong | a tailor who sews clothes for giants
a boy who collects lost umbrellas | a train conductor on the last night train | a lighthouse cat
a pastry chef competing against her former mentor | an archaeologist who hates sand
a postman in a village with no addresses
""")
STORY_SITUATIONS = _items("""
discovers a door that was not there yesterday | must deliver a letter before midnight
wins a contest they never entered | finds a map drawn in their own handwriting
has to look after a baby dragon for a weekend | receives a phone call from their future self
gets lost in a city where every street is a staircase | must convince a whole town to stop arguing
loses their voice the day before a big performance | opens a restaurant that serves only one dish
finds a message in a bottle addressed to them | is chosen to guard a very ordinary stone
accidentally swaps lives with a neighbor for a day | tries to teach a cloud to rain on schedule
has one day to find a missing violin | wakes up able to understand birds
inherits a house full of clocks that all show different times
is stuck in a broken elevator with a famous stranger | must cross a desert with only a bicycle
notices that the moon has gone missing | builds a boat out of old doors
hosts a dinner party for all of their rivals | sees their reflection acting on its own
is the last person awake in a sleeping city | plants a rooftop garden in the middle of winter
loses a bet and has to tell only the truth for a week | meets a stranger who knows all their secrets
must repair a bridge before a storm arrives | finds a key that opens every lock except one
is asked to judge a pie contest in a town of liars | receives a package with no sender
gets a second chance at a day they regret | must teach a class on a subject they know nothing about
finds a tiny village living inside an old piano | organizes a festival with no money at all
""")
STORY_GENRES = _items("""
science fiction | mystery | fantasy | comedic | heartwarming | slightly spooky | adventure | slice-of-life
fable-like | noir-style | magical realist | cozy
""")
STORY_CONSTRAINTS = [
    "",
    "Keep it under 300 words.",
    "Tell it in the first person.",
    "End with a surprising twist.",
    "Use a hopeful tone.",
    "Make it funny.",
    "Write it for young children.",
    "Include at least three lines of dialogue.",
    "Make the last sentence a question.",
    "Set it during a thunderstorm.",
    "Tell it in exactly four paragraphs.",
    "Use the present tense.",
    "Give it a bittersweet ending.",
    "Make it suitable as a bedtime story.",
    "Write it in the style of an old fairy tale.",
    "Give the story a title.",
]
POEM_FORMS = _items("""
haiku | sonnet | limerick | free-verse poem | short rhyming poem | ballad | villanelle
poem of four quatrains | prose poem | cinquain | series of three haiku | poem in rhyming couplets
""")
POEM_SUBJECTS = _items("""
the first snow of winter | a city waking up at dawn | an old pair of boots
the smell of rain on hot pavement | learning to ride a bicycle | the ocean at night
a grandmother's kitchen | commuting on a crowded train | a lost dog finding its way home
the last day of summer | a cup of morning coffee | a broken umbrella | the moon over a desert
an old friendship | moving to a new country | a library at closing time | the sound of a cello
falling autumn leaves | a lighthouse in fog | a forgotten password | bees in a vegetable garden
a sunrise seen from a mountain hut | homesickness | a spreadsheet that will not balance
the first day of school | a summer thunderstorm | an empty playground in the evening
the Milky Way on a clear night | a kettle coming to the boil | patience | the courage to start over
a fox crossing a snowy field | the stars seen from a small boat | the passing of time
a candle in a window | debugging code at two in the morning | running a marathon | the color blue
a cat asleep in a patch of sun | a bridge at rush hour | a letter never sent | a seed becoming a tree
the quiet after a party | a river in spring flood
""")
POEM_STYLES = [
    "",
    " in a playful tone",
    " in a melancholy tone",
    " that a child would enjoy",
    " with vivid imagery",
    " from the point of view of the object itself",
    " that ends on a hopeful note",
    " using simple words",
    " with a surprising final line",
    " in the voice of an old sailor",
]
ACROSTIC_WORDS = _items("""
GARDEN | HARBOR | COURAGE | WINTER | MUSIC | FRIEND | RIVER | PLANET | BREAD | LANTERN | ORBIT | MAPLE
THUNDER | KINDNESS | JOURNEY
""")
EMAIL_PURPOSES = _items("""
to your landlord asking them to fix a leaking kitchen faucet
to a professor asking for a one-week extension on a term paper because you were ill
to a colleague thanking them for covering your shift last Friday
to a customer apologizing for a delayed shipment of {product}
to your team announcing that the weekly meeting moves to {weekday} mornings
to a hiring manager following up after an interview for a {job} position
to a neighbor about loud music late at night
to a client proposing a revised timeline for a website redesign
to a hotel requesting an early check-in on {date}
to a conference organizer asking about vegetarian and gluten-free meal options
to your manager requesting two days of remote work per week
to a supplier disputing an invoice that charges you twice for {product}
to an old friend you have not spoken to in years
to the parents of a school class announcing a field trip to {place} | to a gym cancelling your membership
to a city council member about a dangerous crossing near a school
to a software vendor reporting a bug that crashes the export feature
to a new employee welcoming them to the {team} team
to volunteers asking for help at a food bank on {weekday}
to your bank disputing a duplicate card charge of {amount} | declining a job offer as a {job} politely
to a former teacher asking for career advice | inviting coworkers to a farewell lunch for {name}
to a tenant reminding them that rent is due | to a restaurant praising a waiter who was especially kind
to a plumber asking for a quote | to a landlord giving notice that you will move out in two months
to a club announcing that the annual picnic is cancelled because of the weather
to a publisher submitting a short story for consideration
to a museum asking whether they accept donations of old cameras
""")
EMAIL_TONES = _items("""
polite | formal | friendly | concise | professional but warm | firm but polite | cheerful
""")
PRODUCTS = _items("""
wireless headphones | a standing desk | hiking boots | a coffee grinder | a set of watercolor paints
a robot vacuum | a yoga mat | a smart thermostat | a camping stove | an e-reader | a cast-iron pan
a kids' balance bike | a mechanical keyboard | a rain jacket | a houseplant subscription box
""")
JOBS = _items("""
data analyst | junior web developer | marketing coordinator | nurse | warehouse supervisor
graphic designer | lab technician | accountant | customer support lead | high school math teacher
""")
TRIP_PLACES = _items("""
the science museum | a local dairy farm | the aquarium | the botanical garden | the planetarium
a recycling center | the fire station | a chocolate factory
""")
TEAMS = _items("""
design | finance | research | customer success | platform | sales | logistics | editorial
""")
ESSAY_TOPICS = _items("""
whether homework should be limited in primary schools | the benefits and drawbacks of remote work
why public libraries still matter | the role of social media in local politics
whether cities should ban cars from their historic centers | the value of learning a second language
how video games can support learning | the ethics of keeping animals in zoos
why sleep deserves more respect | whether space exploration is worth its cost
the environmental impact of fast fashion | the value of failure | universal basic income
the four-day work week | the future of printed books | teaching history through local stories
the role of art in a technological society | whether students should wear school uniforms
the effects of mass tourism on small towns | the importance of pollinators to farming
how to make cities more walkable | the pros and cons of nuclear power | advertising aimed at children
why volunteering matters | the challenges of an aging population | the ethics of self-driving cars
the role of museums in preserving culture | privacy online | standardized testing
the benefits of team sports | urban gardening | what success really means | minimalism as a way of life
the role of luck in achievement | why wetlands deserve protection | the hidden costs of food waste
whether everyone should learn to program | teaching critical thinking in schools
lowering the voting age to 16 | the gig economy | public transport being free of charge
the place of handwriting in schools
""")
ESSAY_FORMS = _items("""
Write a short essay about {t}. | Write a 500-word essay on {t}.
Write an argumentative essay on {t}. Present both sides before giving your own view.
Write the introduction and a detailed outline for an essay on {t}.
Write a five-paragraph essay discussing {t}. | Write an opinion piece for a school newspaper on {t}.
Write a balanced op-ed about {t} for a general audience.
Draft a thesis statement and three supporting arguments about {t}.
""")
OCCASIONS = _items("""
a best friend's wedding | a colleague's retirement party | the opening of a community garden
a high school graduation | the launch of a small bookshop | a grandparent's 90th birthday
the end of a long charity bike ride | a team's first product release | a town's 200th anniversary
the farewell of a beloved school janitor
""")
BLOG_TOPICS = _items("""
starting a vegetable garden on a balcony | learning to bake sourdough bread | budget travel by train
getting back into running after an injury | building a reading habit | decluttering a small flat
first steps in birdwatching | cooking for one without waste | learning the guitar as an adult
organizing a neighborhood clean-up | keeping a sketchbook | camping with young kids
""")
CUISINES = _items("""
Ethiopian | Peruvian | Georgian | Korean | Sicilian | Lebanese | Oaxacan | Vietnamese | Basque | Nordic
Sri Lankan | Cajun
""")
DIALOGUE_PAIRS = [
    ("a lighthouse keeper", "a lost seagull"),
    ("a job applicant", "a very distracted interviewer"),
    ("a teenager", "her grandfather"),
    ("a customer", "a stubborn vending machine"),
    ("two astronauts", "mission control"),
    ("a cat", "a dog"),
    ("a chess player", "her opponent"),
    ("a barista", "a regular who never speaks"),
    ("a tourist", "a local fisherman"),
    ("a scientist", "her skeptical brother"),
]
DIALOGUE_TOPICS = _items("""
whether to move to the countryside | the best way to spend a rainy day | a missing sandwich
what happiness means | a strange noise in the night | learning to cook | a broken promise
the future of robots | choosing a name for a boat | who should do the dishes
""")
BUSINESSES = _items("""
a bicycle repair shop | a vegan bakery | a dog-walking service | a language school | a board-game cafe
an electric scooter rental | a plant nursery | a tutoring center | a second-hand clothing store
a mobile car wash | a pottery studio | a climbing gym
""")
RESTAURANT_NAMES = _items("""
The Copper Ladle | Blue Heron Kitchen | Saffron & Salt | Little Ember | The Tin Fork | Olive Street Table
Harbor Lantern | Wild Thyme
""")


def _writing(rng: random.Random) -> str:
    kind = rng.choices(
        [
            "story",
            "poem",
            "acrostic",
            "email",
            "essay",
            "speech",
            "blog",
            "cover",
            "review",
            "dialogue",
            "ad",
            "product",
            "letter",
            "opening",
        ],
        weights=[22, 16, 2, 18, 14, 5, 5, 3, 4, 4, 3, 3, 3, 3],
    )[0]
    if kind == "story":
        char, sit, con = (
            rng.choice(STORY_CHARACTERS),
            rng.choice(STORY_SITUATIONS),
            rng.choice(STORY_CONSTRAINTS),
        )
        genre = rng.choice(STORY_GENRES)
        genre = ("an " if genre[0] in "aeiou" else "a ") + genre
        forms = [
            "Write a short story about {c}. In the story, the main character {s}. {k}",
            "I need a piece of flash fiction about {c}. One day, the hero {s}. {k}",
            "Write {g} short story about {c}. The plot: the main character {s}. {k}",
        ]
        # A second "who" clause after a character that already has one reads badly.
        if " who " not in char and " that " not in char:
            forms += [
                "Can you write {g} story about {c} who {s}? {k}",
                "Tell me {g} tale about {c} who {s}. {k}",
                "Write {g} short story. The main character is {c} who {s}. {k}",
            ]
        form = rng.choice(forms)
        return form.format(c=char, s=sit, k=con, g=genre).strip()
    if kind == "poem":
        form = rng.choice(POEM_FORMS)
        subj, style = rng.choice(POEM_SUBJECTS), rng.choice(POEM_STYLES)
        art = "an" if form[0] in "aeiou" else "a"
        return rng.choice(
            [
                f"Write {art} {form} about {subj}{style}.",
                f"Compose {art} {form} about {subj}{style}.",
                f"Could you write me {art} {form} on the theme of {subj}{style}?",
            ]
        )
    if kind == "acrostic":
        return (
            f"Write an acrostic poem using the word {rng.choice(ACROSTIC_WORDS)}, about "
            f"{rng.choice(POEM_SUBJECTS)}."
        )
    if kind == "email":
        purpose = rng.choice(EMAIL_PURPOSES).format(
            product=rng.choice(PRODUCTS),
            weekday=rng.choice(WEEKDAYS),
            job=rng.choice(JOBS),
            date=_date(rng),
            place=rng.choice(TRIP_PLACES),
            team=rng.choice(TEAMS),
            amount=_money(rng, 20, 400),
            name=rng.choice(FIRST_NAMES),
        )
        tone = rng.choice(EMAIL_TONES)
        sender = rng.choice(["", f" Sign it as {_person(rng)}."])
        form = rng.choice(
            [
                "Write a {t} email {p}.{s}",
                "Draft a {t} email {p}. Keep it under 150 words.{s}",
                "Help me write an email {p}. The tone should be {t}.{s}",
                "Compose a short, {t} message {p}.{s}",
            ]
        )
        return form.format(t=tone, p=purpose, s=sender)
    if kind == "essay":
        return rng.choice(ESSAY_FORMS).format(t=rng.choice(ESSAY_TOPICS))
    if kind == "speech":
        return rng.choice(
            [
                "Write a short speech for {o}.",
                "Write a heartfelt toast for {o}. Keep it under two minutes.",
                "I have to give a speech at {o}. Can you write one that is funny but sincere?",
            ]
        ).format(o=rng.choice(OCCASIONS))
    if kind == "blog":
        return rng.choice(
            [
                "Write a blog post introduction about {b}.",
                "Write a friendly blog post with tips on {b}.",
                "Give me a catchy title and an outline for a blog post about {b}.",
            ]
        ).format(b=rng.choice(BLOG_TOPICS))
    if kind == "cover":
        years = rng.randint(1, 9)
        return (
            f"Write a cover letter for a {rng.choice(JOBS)} position at {rng.choice(COMPANIES)}. I have "
            f"{years} year{'s' if years > 1 else ''} of relevant experience and I am based in "
            f"{rng.choice(CITIES)}."
        )
    if kind == "review":
        return (
            f"Write a restaurant review of a fictional place called {rng.choice(RESTAURANT_NAMES)} that "
            f"serves {rng.choice(CUISINES)} food. "
            f"{rng.choice(['Make it glowing.', 'Make it mixed.', 'Be honest but kind.', 'Make it funny.'])}"
        )
    if kind == "dialogue":
        a, b = rng.choice(DIALOGUE_PAIRS)
        return f"Write a short dialogue between {a} and {b} about {rng.choice(DIALOGUE_TOPICS)}."
    if kind == "ad":
        return rng.choice(
            [
                "Write a slogan and a short radio advertisement for {b}.",
                "Write three taglines for {b}.",
                "Write a short social media post announcing the opening of {b} in {c}.",
            ]
        ).format(b=rng.choice(BUSINESSES), c=rng.choice(CITIES))
    if kind == "product":
        return rng.choice(
            [
                "Write an engaging product description for {p}.",
                "Write a product description for {p} aimed at first-time buyers.",
                "Write a short, honest product listing for {p} sold second-hand.",
            ]
        ).format(p=rng.choice(PRODUCTS))
    if kind == "letter":
        return rng.choice(
            [
                "Write a letter to your future self, to be opened in ten years.",
                "Write a thank-you letter to {n}, a neighbor who helped you move.",
                "Write a letter from a child at summer camp to her parents.",
                "Write a letter to the editor of a local paper about {t}.",
                "Write a short note to {n} congratulating them on a new job as a {j}.",
            ]
        ).format(n=rng.choice(FIRST_NAMES), t=rng.choice(ESSAY_TOPICS), j=rng.choice(JOBS))
    # An opening line to continue, written here, gives the model a concrete starting point.
    openings = [
        "The train stopped in the middle of the forest, and nobody knew why.",
        "Every Tuesday, the old man fed the pigeons exactly forty-two crumbs.",
        "My sister swore the painting had blinked.",
        "The letter arrived eleven years late.",
        "On the night the power went out, the whole street came outside.",
        "Nobody in the village had ever seen the baker smile until that morning.",
        "The robot had one rule: never open the blue door.",
        "When the tide went out, it did not come back.",
    ]
    return f'Continue this story for two or three paragraphs: "{rng.choice(openings)}"'


# ---------------------------------------------------------------------------------------------------
# Role-play
# ---------------------------------------------------------------------------------------------------

PERSONAS: dict[str, list[str]] = {
    "a pirate captain in the 1700s": [
        "Describe your ship and the people who sail on it.",
        "A storm is coming tonight. What orders do you give?",
        "What do you miss most when you are at sea for months?",
        "Tell me about the worst meal you ever ate aboard.",
    ],
    "a medieval blacksmith": [
        "How do you make a horseshoe?",
        "What is the hardest part of your trade?",
        "A knight wants new armor by tomorrow morning. What do you tell him?",
        "How did you learn your craft?",
    ],
    "a personal fitness trainer": [
        "I only have 20 minutes a day. What should I do?",
        "Motivate me to get off the couch this evening.",
        "Design a warm-up routine for me before a run.",
        "I keep skipping leg day. Talk me through why it matters.",
    ],
    "a detective in 1920s London": [
        "Describe the scene you have just arrived at.",
        "Question me; I am the butler and I seem nervous.",
        "Explain how you cracked your most recent case.",
        "What do you notice about me as I walk into your office?",
    ],
    "an astronaut aboard a space station": [
        "What did you have for breakfast today?",
        "Describe the view of Earth from the window right now.",
        "How do you sleep when there is no up or down?",
        "What is the strangest thing about coming back to Earth?",
    ],
    "a friendly small-town librarian": [
        "Recommend three books for a rainy weekend.",
        "How can I build a habit of reading every day?",
        "A child asks you for a book about volcanoes. What do you say?",
        "What is the oddest thing ever returned to your library?",
    ],
    "a very grumpy house cat": [
        "What do you think of the humans you live with?",
        "Describe your ideal afternoon.",
        "Why did you knock the glass off the table?",
        "Give me your review of the new cat food.",
    ],
    "a barista at a busy cafe": [
        "I cannot decide what to order. Help me choose.",
        "What is your secret to good latte art?",
        "A customer complains their coffee is too hot. How do you respond?",
        "Describe the morning rush from behind the counter.",
    ],
    "a tour guide in an old European city": [
        "Welcome our group and tell us what we will see today.",
        "What is your favorite hidden corner of the city?",
        "A tourist asks where to eat like a local. What do you suggest?",
        "Tell us a legend about the old town square.",
    ],
    "a customer service agent for an internet provider": [
        "My internet has been down since yesterday. Help me.",
        "I want to cancel my contract. Convince me to stay.",
        "Explain why my bill is higher this month.",
        "My router has a blinking orange light. What does it mean?",
    ],
    "a job interviewer at a small software company": [
        "Start the interview and ask me your first question.",
        "Tell me about the role and the team I would join.",
        "I just said my biggest weakness is impatience. How do you follow up?",
        "Ask me a question to test my problem-solving.",
    ],
    "a sports commentator": [
        "Commentate the final minute of a tied basketball game.",
        "Describe a snail race as if it were the Olympics.",
        "Narrate me trying to parallel park.",
        "Give a dramatic commentary on a chess endgame.",
    ],
    "a museum curator": [
        "Introduce the new exhibition on ancient maps.",
        "How do you decide which objects go on display?",
        "A visitor touches a fragile vase. What do you say?",
        "Describe the most surprising object in your storage rooms.",
    ],
    "a visitor from the year 2300": [
        "What does a normal school day look like in your time?",
        "What surprises you most about our century?",
        "How do people travel where you come from?",
        "What food from today do you want to try first?",
    ],
    "a Roman legionary on the northern frontier": [
        "Describe your daily routine at the fort.",
        "What do you write in a letter home?",
        "How do you feel about the cold weather here?",
        "What do you eat on a long march?",
    ],
    "a medieval court jester": [
        "Entertain the king, who is in a bad mood.",
        "Tell a riddle to the royal court.",
        "The queen asks for your honest opinion of the new castle. Answer.",
        "How did you become a jester?",
    ],
    "a park ranger in a national forest": [
        "What should I do if I meet a bear on the trail?",
        "Explain the rules for campfires in your park.",
        "What is your favorite season in the forest and why?",
        "A family has lost their way. Guide them back.",
    ],
    "a real estate agent selling a haunted house": [
        "Give me the tour of the house.",
        "Explain the strange noises in the attic.",
        "Why is the price so low?",
        "Convince a skeptical buyer that the house is a bargain.",
    ],
    "an evening news anchor": [
        "Report the news that a town's rubber duck race was won by a goose.",
        "Introduce tonight's weather forecast.",
        "Cover a story about a library book returned 60 years late.",
        "Sign off the broadcast for the night.",
    ],
    "a game master running a fantasy adventure": [
        "Start a new adventure for me; I am an elven ranger.",
        "My character opens the creaking chest. What happens?",
        "Describe the tavern where our party meets.",
        "I try to sneak past the sleeping troll. Roll and narrate the result.",
    ],
    "a travel agent": [
        "Plan a relaxing week for me somewhere warm in February.",
        "I have a small budget. Where should I go?",
        "Suggest a three-day itinerary in a city famous for food.",
        "My flight was cancelled. What are my options?",
    ],
    "an alien visiting Earth for the first time": [
        "Describe your first impression of a supermarket.",
        "What do you think umbrellas are for?",
        "Report back to your home planet about human birthday parties.",
        "Why do humans keep looking at small glowing rectangles?",
    ],
    "a patient Spanish tutor": [
        "Help me practice ordering food in Spanish.",
        "Correct my sentence: 'Yo es muy cansado.'",
        "Teach me five useful phrases for traveling.",
        "Quiz me on the days of the week.",
    ],
    "a startup founder pitching to investors": [
        "Pitch your app that matches dog owners for walks.",
        "An investor asks how you will make money. Answer.",
        "Explain why your team is the right one for this.",
        "Give a 60-second pitch for a reusable packaging service.",
    ],
    "a mountain guide": [
        "Brief our group before we climb tomorrow.",
        "What should I pack for a two-day hike?",
        "The weather is turning. Do we continue or turn back?",
        "What is the hardest climb you have ever led?",
    ],
    "a kindergarten teacher": [
        "Explain to the class why we wash our hands.",
        "Two children are fighting over a toy. What do you say?",
        "Start the morning circle time.",
        "Tell the class a story about sharing.",
    ],
    "a used-car salesperson": [
        "Sell me this 15-year-old station wagon.",
        "I think the price is too high. Respond.",
        "Why does the car make a rattling sound?",
        "Describe the car's best features.",
    ],
    "a wizard's apprentice": [
        "Describe the spell you messed up this morning.",
        "What chores does your master give you?",
        "Explain how to brew a potion for a cold.",
        "What is in your spell book?",
    ],
    "a polite robot butler": [
        "Announce the arrival of the dinner guests.",
        "I spilled juice on the carpet. What do you do?",
        "Plan tomorrow's schedule for the household.",
        "Explain why you refuse to make coffee after 9 p.m.",
    ],
    "a late-night radio DJ": [
        "Introduce the next song to your listeners.",
        "A caller is heartbroken. Talk to them on air.",
        "Read out the weather and traffic report.",
        "Open tonight's show.",
    ],
    "a farmer at a weekend market stall": [
        "Tell me about the vegetables you are selling today.",
        "What is in season right now?",
        "A customer wants a discount. How do you respond?",
        "How early did you get up this morning?",
    ],
    "an airline pilot": [
        "Make the welcome announcement to passengers.",
        "Announce that we will have turbulence for 20 minutes.",
        "Explain a delay caused by fog.",
        "Announce our descent into the destination city.",
    ],
    "a stand-up comedian": [
        "Do a short bit about self-checkout machines.",
        "Make jokes about working from home.",
        "Do five minutes about assembling furniture.",
        "Roast my houseplants, which keep dying.",
    ],
    "a debate coach": [
        "Give me feedback on this argument: 'School should start later because teenagers are tired.'",
        "How do I handle a rebuttal I did not expect?",
        "Teach me how to structure a two-minute speech.",
        "Play my opponent: argue against banning homework.",
    ],
    "a guide at a medieval castle": [
        "Show our group the great hall.",
        "What was life like for servants here?",
        "Tell us about the castle's defenses.",
        "Why is the staircase built to turn clockwise?",
    ],
    "a gardener at a botanical garden": [
        "Why are my tomato leaves turning yellow?",
        "What plants are easy for beginners?",
        "Explain how to make good compost.",
        "Give me a tour of the rose garden.",
    ],
    "an old sea captain telling stories in a harbor pub": [
        "Tell me about the strangest fish you ever caught.",
        "What was your worst storm?",
        "Why did you leave the sea?",
        "Teach me a sailor's knot.",
    ],
    "a nervous contestant on a cooking competition show": [
        "Explain to the judges what you made.",
        "Your sauce burned. What do you tell the camera?",
        "Describe your strategy for the final round.",
        "Introduce yourself to the audience.",
    ],
}
GENERIC_RP_QUESTIONS = _items("""
Introduce yourself and describe a typical day.
What advice would you give to someone who wants to do what you do?
What is the best part of your life, and what is the hardest? | Tell me about a memorable day you had recently.
What would you change about your world if you could? | Describe where you are right now in detail.
""")
RP_FRAMES = _items("""
Pretend you are {p}. {q} | You are {p}. Stay in character. {q} | Role-play as {p}. {q}
Imagine you are {p} and answer in character: {q} | From now on, act as {p}. My first request: {q}
Let's play a game: you are {p}. {q}
""")
RP_SCENARIOS = _paragraphs("""
Let's role-play: you run a small hardware store and I am a customer who bought the wrong size of screws.
Start the conversation.

Let's role-play a job interview for a {job} position. You are the interviewer. Ask me one question at a
time.

Act as a tour guide in {city}. I have one afternoon. Walk me through what we will do.

Let's play a text adventure. I wake up in {setting}. Describe what I see and give me options.

You are a hotel receptionist in {city}. I arrive late at night and my booking has disappeared. Begin.

Role-play a phone call: you are a pharmacist and I am asking whether I can take two cold medicines together.

Pretend you are my neighbor {name}, who just got a very loud parrot. I knock on your door. Start.

Act as a conversation partner in {language}. Start with simple questions about my hobbies and correct my
mistakes gently.

You are the captain of a small ferry to an island. Give the safety announcement and a welcome.

Play the role of a librarian helping me research {topic} for a school project.
""")
RP_SETTINGS = _items("""
an abandoned lighthouse | a spaceship with the lights off | a cabin in a snowy forest
an underground market | a library with no exits | a desert oasis | a train that never stops
a castle kitchen
""")
LANGUAGES = _items("""
French | German | Spanish | Italian | Portuguese | Japanese
""")


def _roleplay(rng: random.Random) -> str:
    if rng.random() < 0.2:
        return rng.choice(RP_SCENARIOS).format(
            job=rng.choice(JOBS),
            city=rng.choice(CITIES),
            setting=rng.choice(RP_SETTINGS),
            name=rng.choice(FIRST_NAMES),
            language=rng.choice(LANGUAGES),
            topic=rng.choice(ESSAY_TOPICS),
        )
    persona = rng.choice(list(PERSONAS))
    q = rng.choice(PERSONAS[persona] + PERSONAS[persona] + GENERIC_RP_QUESTIONS)
    return rng.choice(RP_FRAMES).format(p=persona, q=q)


# ---------------------------------------------------------------------------------------------------
# Logical reasoning puzzles (generated with a unique answer where the puzzle needs one)
# ---------------------------------------------------------------------------------------------------

COMPARATIVES = [
    ("is taller than", "tallest", "shortest"),
    ("is older than", "oldest", "youngest"),
    ("runs faster than", "fastest runner", "slowest runner"),
    ("scored more points than", "top scorer", "lowest scorer"),
    ("arrived earlier than", "first to arrive", "last to arrive"),
    ("lives farther from school than", "one who lives farthest", "one who lives closest"),
    ("has more books than", "one with the most books", "one with the fewest books"),
]
NONSENSE = _items("""
blickets | zorbles | frimps | wuggles | daxes | plonks | tovs | snerps | grolls | vints | quibs | mardles
flurns | tazzies
""")
REAL_CLASSES = _items("""
musicians | engineers | gardeners | cyclists | chess players | vegetarians | teachers | poets | swimmers
collectors
""")
CONDITIONALS = [
    ("it rains", "the football match is cancelled"),
    ("the alarm rings", "the office is evacuated"),
    ("Maria finishes her homework", "she goes to the cinema"),
    ("the shop has fresh bread", "Leo buys a loaf"),
    ("the temperature drops below zero", "the pond freezes"),
    ("the password is correct", "the door unlocks"),
    ("the train is late", "Omar misses his meeting"),
    ("the printer is out of paper", "the report is printed late"),
    ("a number is divisible by 6", "it is divisible by 3"),
    ("the plant is watered", "it does not wilt"),
]


def _ordering_puzzle(rng: random.Random) -> str:
    names = _pick(rng, FIRST_NAMES, rng.randint(4, 5))
    rel, top, bottom = rng.choice(COMPARATIVES)
    order = names[:]  # order[0] has the most of the property
    rng.shuffle(order)
    clues = [f"{order[i]} {rel} {order[i + 1]}." for i in range(len(order) - 1)]
    # A redundant but true clue makes the chain less obvious without changing the answer.
    i, j = sorted(rng.sample(range(len(order)), 2))
    clues.append(f"{order[i]} {rel} {order[j]}.")
    rng.shuffle(clues)
    question = rng.choice(
        [
            f"Who is the {top}?",
            f"Who is the {bottom}?",
            f"List all of them in order, from the {top} to the {bottom}.",
            f"Who is the {top}, and who is the {bottom}?",
            f"Is {order[-2]} ahead of {order[1]}? Explain.",
        ]
    )
    return f"{' '.join(clues)} {question} Explain your reasoning step by step."


def _seating_puzzle(rng: random.Random) -> str:
    n = rng.randint(4, 5)
    people = _pick(rng, FIRST_NAMES, n)
    truth = people[:]
    rng.shuffle(truth)
    pos = {p: i for i, p in enumerate(truth)}

    def clue_true(kind: str, a: str, b: str, arr: Sequence[str]) -> bool:
        where = {p: i for i, p in enumerate(arr)}
        if kind == "left":
            return where[a] < where[b]
        if kind == "next":
            return abs(where[a] - where[b]) == 1
        if kind == "notnext":
            return abs(where[a] - where[b]) != 1
        if kind == "immleft":
            return where[a] + 1 == where[b]
        if kind == "end":
            return where[a] in (0, n - 1)
        if kind == "notend":
            return where[a] not in (0, n - 1)
        return where[a] == int(b)

    texts = {
        "left": "{a} sits somewhere to the left of {b}.",
        "next": "{a} sits next to {b}.",
        "notnext": "{a} does not sit next to {b}.",
        "immleft": "{a} sits immediately to the left of {b}.",
        "end": "{a} sits at one of the ends.",
        "notend": "{a} does not sit at either end.",
        "seat": "{a} sits in seat {k}.",
    }
    clues: list[tuple[str, str, str]] = []
    candidates = list(itertools.permutations(people))
    for _ in range(60):
        if len(candidates) == 1:
            break
        kind = rng.choice(["left", "next", "notnext", "immleft", "end", "notend", "left", "immleft"])
        a, b = rng.sample(people, 2)
        if kind in ("end", "notend"):
            b = ""
        if not clue_true(kind, a, b, truth):
            continue
        remaining = [c for c in candidates if clue_true(kind, a, b, c)]
        if len(remaining) < len(candidates):
            candidates = remaining
            clues.append((kind, a, b))
    if len(candidates) > 1:
        a = rng.choice(people)
        clues.append(("seat", a, str(pos[a])))
    lines = []
    for kind, a, b in clues:
        k = int(b) + 1 if kind == "seat" else 0
        lines.append(texts[kind].format(a=a, b=b, k=k))
    rng.shuffle(lines)
    setting = rng.choice(
        [
            "sit in a row of seats numbered 1 to {n} from left to right",
            "stand in a line for a photo, positions 1 to {n} from left to right",
            "park their bikes in a row of {n} slots numbered from left to right",
        ]
    ).format(n=n)
    if "stand" in setting or "park" in setting:
        lines = [
            ln.replace("does not sit", "is not").replace("sits", "is").replace("seat", "position")
            for ln in lines
        ]
    ask = rng.choice(
        [
            "Give the full order from left to right.",
            f"Who is in position {rng.randint(1, n)}?",
            f"Who is directly to the right of {rng.choice(people)}, if anyone?",
        ]
    )
    return (
        f"{', '.join(people[:-1])} and {people[-1]} {setting}. {' '.join(lines)} {ask} Show your reasoning."
    )


def _syllogism(rng: random.Random) -> str:
    a, b, c = rng.sample(NONSENSE, 3) if rng.random() < 0.6 else rng.sample(REAL_CLASSES, 3)
    form = rng.choice(
        [
            (f"All {a} are {b}. All {b} are {c}.", f"Are all {a} {c}?"),
            (f"All {a} are {b}. Some {b} are {c}.", f"Can we conclude that some {a} are {c}?"),
            (f"No {a} are {b}. All {c} are {b}.", f"Can any {c} be {a}?"),
            (f"Some {a} are {b}. No {b} are {c}.", f"Does it follow that some {a} are not {c}?"),
            (f"All {a} are {b}. No {c} are {b}.", f"What can we say about {a} and {c}?"),
            (
                f"Every one of the {a} is one of the {b}. Nothing that is one of the {b} is one of the {c}.",
                f"Is it possible for something to be both one of the {a} and one of the {c}?",
            ),
        ]
    )
    return f"{form[0]} {form[1]} Explain whether the conclusion follows logically."


def _conditional(rng: random.Random) -> str:
    p, q = rng.choice(CONDITIONALS)
    kind = rng.randrange(4)
    if kind == 0:
        return f"If {p}, then {q}. We know that it is not true that {q}. What can we conclude, and why?"
    if kind == 1:
        return (
            f"Rule: if {p}, then {q}. Observation: {q}. Can we conclude that {p}? Explain the logical error, "
            "if any."
        )
    if kind == 2:
        return (
            f"Suppose the statement 'if {p}, then {q}' is true. Which of these must also be true: its "
            "converse, its inverse, or its contrapositive? Write each one out."
        )
    return f"If {p}, then {q}. Also, {p}. What follows? Name the rule of inference."


def _knights_knaves(rng: random.Random) -> str:
    names = _pick(rng, FIRST_NAMES, rng.choice([2, 3]))
    n = len(names)
    for _ in range(100):
        statements = []
        funcs = []
        for i in range(n):
            j = rng.choice([k for k in range(n) if k != i])
            kind = rng.randrange(5)
            if kind == 0:
                statements.append(f'{names[i]} says: "{names[j]} is a knave."')
                funcs.append(lambda t, j=j: not t[j])
            elif kind == 1:
                statements.append(f'{names[i]} says: "{names[j]} is a knight."')
                funcs.append(lambda t, j=j: t[j])
            elif kind == 2:
                statements.append(f'{names[i]} says: "{names[j]} and I are the same kind."')
                funcs.append(lambda t, i=i, j=j: t[i] == t[j])
            elif kind == 3:
                statements.append(f'{names[i]} says: "At least one of us is a knave."')
                funcs.append(lambda t: not all(t))
            else:
                statements.append(f'{names[i]} says: "Exactly one of us is a knight."')
                funcs.append(lambda t: sum(t) == 1)
        sols = [
            t
            for t in itertools.product([True, False], repeat=n)
            if all(funcs[i](t) == t[i] for i in range(n))
        ]
        if len(sols) == 1:
            break
    intro = rng.choice(
        [
            "On an island, knights always tell the truth and knaves always lie.",
            "In a village, every person is either a truth-teller who never lies or a liar who never tells "
            "the truth.",
        ]
    )
    if "village" in intro:
        statements = [s.replace("knave", "liar").replace("knight", "truth-teller") for s in statements]
    return (
        f"{intro} You meet {', '.join(names[:-1])} and {names[-1]}. {' '.join(statements)} Who is what? "
        "Explain."
    )


def _sequence(rng: random.Random) -> str:
    kind = rng.randrange(6)
    a, d = rng.randint(1, 20), rng.randint(2, 9)
    if kind == 0:
        seq = [a + d * i for i in range(5)]
    elif kind == 1:
        r = rng.choice([2, 3])
        seq = [rng.randint(1, 5) * r**i for i in range(5)]
    elif kind == 2:
        seq = [i * i + a for i in range(1, 6)]
    elif kind == 3:
        x, y = rng.randint(1, 5), rng.randint(1, 7)
        seq = [x, y]
        while len(seq) < 6:
            seq.append(seq[-1] + seq[-2])
    elif kind == 4:
        seq = [a + sum(range(1, i + 1)) * d for i in range(5)]
    else:
        seq = []
        v = a
        for i in range(6):
            seq.append(v)
            v = v * 2 if i % 2 == 0 else v - d
    shown = ", ".join(map(str, seq))
    return rng.choice(
        [
            f"What number comes next in the sequence {shown}, ...? Explain the pattern.",
            f"Find the rule behind {shown} and give the next two terms.",
            f"Here is a number pattern: {shown}. What is the next number, and why?",
        ]
    )


def _calendar(rng: random.Random) -> str:
    kind = rng.randrange(4)
    day = rng.choice(WEEKDAYS)
    if kind == 0:
        return (
            f"If today is {day}, what day of the week will it be {rng.randint(20, 400)} days from now? "
            "Explain."
        )
    if kind == 1:
        return f"If the day after tomorrow is {day}, what day was it three days before yesterday?"
    if kind == 2:
        m = rng.choice(MONTHS)
        return (
            f"If {m} 1st falls on a {day} in a non-leap year, on which day of the week does {m} "
            f"{rng.randint(15, 28)}th fall?"
        )
    return (
        f"A meeting happens every {rng.randint(3, 11)} days. The first one is on a {day}. On what weekday is "
        f"the {rng.randint(5, 20)}th meeting?"
    )


def _misc_puzzle(rng: random.Random) -> str:
    kind = rng.randrange(8)
    name = rng.choice(FIRST_NAMES)
    if kind == 0:
        a, b = rng.choice([(3, 5), (4, 7), (5, 8), (3, 7), (6, 11), (2, 9), (5, 9)])
        t = rng.choice([v for v in range(1, b) if v not in (a, b)])
        return (
            f"You have a {a}-liter jug and a {b}-liter jug and an unlimited supply of water. How can you "
            f"measure exactly {t} liters? List the steps."
        )
    if kind == 1:
        n = rng.choice([8, 9, 12, 27])
        heavier = rng.choice(["heavier", "lighter"])
        return (
            f"You have {n} coins that look identical, but one is slightly {heavier}. Using a balance scale, "
            "what is the smallest number of weighings that guarantees finding it? Describe the method."
        )
    if kind == 2:
        h, m = rng.randint(1, 12), rng.choice([5, 10, 20, 25, 35, 40, 50, 55])
        return (
            f"What is the smaller angle between the hour hand and the minute hand of a clock at {h}:{m:02d}? "
            "Show the calculation."
        )
    if kind == 3:
        steps = []
        for _ in range(rng.randint(3, 5)):
            steps.append(f"{rng.randint(1, 9)} km {rng.choice(['north', 'south', 'east', 'west'])}")
        return (
            f"{name} starts at home and walks {', then '.join(steps)}. How far is {name} from home in a "
            "straight line, and in which general direction?"
        )
    if kind == 4:
        n = rng.randint(5, 30)
        return (
            f"At a meeting, each of the {n} people shakes hands with every other person exactly once. How "
            "many handshakes happen? Explain the reasoning."
        )
    if kind == 5:
        items = rng.choice(
            [
                ("a wolf", "a goat", "a cabbage"),
                ("a fox", "a chicken", "a bag of grain"),
                ("a cat", "a mouse", "a wheel of cheese"),
            ]
        )
        return (
            f"A farmer must cross a river with {items[0]}, {items[1]} and {items[2]}. The boat carries the "
            f"farmer and one item. Left alone, {items[0]} eats {items[1]}, and {items[1]} eats {items[2]}. "
            "How does the farmer get everything across?"
        )
    if kind == 6:
        times = sorted(rng.sample(range(1, 13), 4))
        return (
            "Four hikers must cross a narrow bridge at night with one flashlight. At most two can cross at "
            f"once and they walk at the slower person's pace. Their crossing times are {times[0]}, "
            f"{times[1]}, {times[2]} and {times[3]} minutes. What is the shortest total time for all four to "
            "cross?"
        )
    boxes = rng.choice(
        [("green gloves", "yellow gloves"), ("red socks", "blue socks"), ("black marbles", "white marbles")]
    )
    x, y = rng.randint(4, 15), rng.randint(4, 15)
    return (
        f"A drawer in a dark room contains {x} {boxes[0]} and {y} {boxes[1]}, mixed together. What is the "
        "minimum number of items you must take out to be sure you have two of the same color? And to be "
        f"sure of two {boxes[0]}?"
    )


def _reasoning(rng: random.Random) -> str:
    gen = rng.choices(
        [
            _ordering_puzzle,
            _seating_puzzle,
            _syllogism,
            _conditional,
            _knights_knaves,
            _sequence,
            _calendar,
            _misc_puzzle,
        ],
        weights=[12, 14, 10, 10, 12, 14, 10, 18],
    )[0]
    return gen(rng)


# ---------------------------------------------------------------------------------------------------
# Arithmetic and mathematics
# ---------------------------------------------------------------------------------------------------

STAT_ASKS = [
    "mean, median and mode",
    "range and median",
    "mean and standard deviation",
    "interquartile range",
]
MATH_ASK = [
    "",
    " Show your work.",
    " Explain each step.",
    " Give the final answer on its own line.",
    " Please show the intermediate steps.",
]


def _poly(rng: random.Random, degree: int, var: str = "x") -> str:
    terms = []
    for p in range(degree, -1, -1):
        c = rng.randint(-9, 9)
        if c == 0 or (p == degree and c == 0):
            continue
        mag = "" if abs(c) == 1 and p > 0 else str(abs(c))
        body = f"{mag}{var}^{p}" if p > 1 else (f"{mag}{var}" if p == 1 else str(abs(c)))
        sign = "-" if c < 0 else "+"
        terms.append((sign, body))
    if not terms:
        return f"{rng.randint(2, 9)}{var}"
    first_sign, first = terms[0]
    out = ("-" if first_sign == "-" else "") + first
    for sign, body in terms[1:]:
        out += f" {sign} {body}"
    return out


def _math(rng: random.Random) -> str:
    kind = rng.randrange(30)
    ask = rng.choice(MATH_ASK)
    if kind == 0:
        return f"What is {rng.randint(12, 999)} × {rng.randint(12, 999)}?{ask}"
    if kind == 1:
        a = rng.randint(1000, 99999)
        return f"Divide {a} by {rng.randint(3, 97)} and give the quotient and remainder.{ask}"
    if kind == 2:
        f1, f2 = (rng.randint(1, 9), rng.randint(2, 12)), (rng.randint(1, 9), rng.randint(2, 12))
        op = rng.choice(["+", "-", "×", "÷"])
        return f"Compute {f1[0]}/{f1[1]} {op} {f2[0]}/{f2[1]} and simplify the result.{ask}"
    if kind == 3:
        return (
            f"What is {rng.choice([5, 12, 15, 17.5, 22, 35, 64, 80, 125])}% of {rng.randint(40, 5000)}?{ask}"
        )
    if kind == 4:
        a, x = rng.randint(2, 12), rng.randint(-10, 15)
        b = rng.randint(-30, 30)
        c = a * x + b
        return f"Solve for x: {a}x {'+' if b >= 0 else '-'} {abs(b)} = {c}.{ask}"
    if kind == 5:
        x, y = rng.randint(-6, 9), rng.randint(-6, 9)
        a, b, c, d = rng.randint(1, 7), rng.randint(1, 7), rng.randint(1, 7), rng.randint(-7, -1)
        if a * d - b * c == 0:
            d -= 1
        return (
            f"Solve the system of equations: {a}x + {b}y = {a * x + b * y} and {c}x - {abs(d)}y = "
            f"{c * x + d * y}.{ask}"
        )
    if kind == 6:
        r1, r2 = rng.randint(-9, 9), rng.randint(-9, 9)
        b, c = -(r1 + r2), r1 * r2
        return (
            f"Solve the quadratic equation x^2 {'+' if b >= 0 else '-'} {abs(b)}x {'+' if c >= 0 else '-'} "
            f"{abs(c)} = 0.{ask}"
        )
    if kind == 7:
        return f"Find the derivative of f(x) = {_poly(rng, rng.randint(2, 4))}.{ask}"
    if kind == 8:
        fn = rng.choice(
            [
                f"sin({rng.randint(2, 5)}x)",
                f"e^({rng.randint(2, 6)}x)",
                "x^2 · cos(x)",
                f"ln({rng.randint(2, 9)}x + 1)",
                "x · e^(-x)",
                f"({rng.randint(2, 5)}x + 1)^{rng.randint(3, 6)}",
                "tan(x) / x",
                f"sqrt({rng.randint(2, 9)}x^2 + 1)",
            ]
        )
        return f"Differentiate {fn} with respect to x.{ask}"
    if kind == 9:
        a, b = sorted(rng.sample(range(-3, 6), 2))
        return (
            f"Evaluate the definite integral of {_poly(rng, rng.randint(1, 3))} from x = {a} to x = {b}.{ask}"
        )
    if kind == 10:
        a, b = rng.randint(12, 400), rng.randint(12, 400)
        return (
            rng.choice(
                [
                    f"Find the greatest common divisor of {a} and {b}.",
                    f"Find the least common multiple of {a} and {b}.",
                    f"Find both the GCD and the LCM of {a} and {b}.",
                ]
            )
            + ask
        )
    if kind == 11:
        return f"Write the prime factorization of {rng.randint(60, 9999)}.{ask}"
    if kind == 12:
        n = rng.randint(50, 999)
        return rng.choice(
            [
                f"Is {n} a prime number? Explain how you checked.",
                f"Convert {n} from base 10 to binary.",
                f"Convert {n} to hexadecimal.",
                f"Convert the binary number {bin(n)[2:]} to decimal.",
            ]
        )
    if kind == 13:
        vals = [rng.randint(1, 60) for _ in range(rng.randint(6, 10))]
        return f"For the data set {', '.join(map(str, vals))}, find the {rng.choice(STAT_ASKS)}.{ask}"
    if kind == 14:
        r = rng.randint(2, 20)
        return (
            rng.choice(
                [
                    f"Find the area and circumference of a circle with radius {r} cm.",
                    f"What is the volume of a sphere with radius {r} m?",
                    f"A cylinder has radius {r} cm and height {rng.randint(3, 30)} cm. Find its volume and "
                    "surface area.",
                    f"A cone has radius {r} and height {rng.randint(3, 30)}. What is its volume?",
                ]
            )
            + ask
        )
    if kind == 15:
        a, b = rng.randint(3, 40), rng.randint(3, 40)
        return (
            rng.choice(
                [
                    f"A right triangle has legs of {a} and {b}. How long is the hypotenuse?",
                    f"A rectangle measures {a} m by {b} m. What are its perimeter, area and diagonal?",
                    f"A trapezoid has parallel sides {a} and {b} and height {rng.randint(2, 20)}. Find its "
                    "area.",
                ]
            )
            + ask
        )
    if kind == 16:
        n, k = rng.randint(5, 15), rng.randint(2, 5)
        return (
            rng.choice(
                [
                    f"How many ways can you choose {k} people from a group of {n}?",
                    f"How many different ordered podiums (1st, 2nd, 3rd) are possible among {n} runners?",
                    f"Compute {n} choose {k} and explain what it counts.",
                    f"In how many ways can {k} identical balls be put into {rng.randint(2, 5)} distinct "
                    "boxes?",
                ]
            )
            + ask
        )
    if kind == 17:
        r, b = rng.randint(2, 10), rng.randint(2, 10)
        return (
            rng.choice(
                [
                    f"A bag has {r} red and {b} blue marbles. Two are drawn without replacement. What is "
                    "the probability both are red?",
                    f"A fair coin is flipped {rng.randint(3, 8)} times. What is the probability of getting "
                    f"exactly {rng.randint(1, 3)} heads?",
                    "A card is drawn from a standard 52-card deck. What is the probability it is a "
                    f"{rng.choice(['heart or a king', 'face card', 'red ace', 'number card below 5'])}?",
                    f"A spinner has {r + b} equal sections, {r} of them green. If you spin it twice, what "
                    "is the probability of at least one green?",
                ]
            )
            + ask
        )
    if kind == 18:
        return (
            f"Simplify the expression {rng.randint(2, 9)}(x + {rng.randint(1, 9)}) - {rng.randint(2, 9)}(x - "
            f"{rng.randint(1, 9)}) + {rng.randint(1, 20)}.{ask}"
        )
    if kind == 19:
        r1, r2 = rng.randint(-8, 8), rng.randint(-8, 8)
        a = rng.randint(1, 4)
        return (
            f"Factor completely: {a}x^2 {'+' if -a * (r1 + r2) >= 0 else '-'} {abs(a * (r1 + r2))}x "
            f"{'+' if a * r1 * r2 >= 0 else '-'} {abs(a * r1 * r2)}.{ask}"
        )
    if kind == 20:
        p, r, t = rng.randint(500, 20000), rng.choice([1.5, 2, 3, 3.5, 4, 5, 6.25]), rng.randint(2, 15)
        return (
            rng.choice(
                [
                    f"${p} is invested at {r}% interest compounded annually. How much is it worth after {t} "
                    "years?",
                    f"What is the simple interest on ${p} at {r}% per year for {t} years?",
                    f"How many years does it take for money to double at {r}% annual compound interest?",
                ]
            )
            + ask
        )
    if kind == 21:
        a, d, n = rng.randint(1, 20), rng.randint(2, 9), rng.randint(10, 60)
        return (
            rng.choice(
                [
                    f"Find the sum of the first {n} terms of the arithmetic sequence starting {a}, {a + d}, "
                    f"{a + 2 * d}, ...",
                    f"What is the {n}th term of the sequence {a}, {a + d}, {a + 2 * d}, ...?",
                    f"Find the sum of all integers from {a} to {a + n * d}.",
                ]
            )
            + ask
        )
    if kind == 22:
        b = rng.choice([2, 3, 5, 10])
        return (
            rng.choice(
                [
                    f"Solve for x: {b}^x = {b ** rng.randint(2, 6)}.",
                    f"Evaluate log base {b} of {b ** rng.randint(2, 5)}.",
                    f"Solve for x: log(x) + log({rng.randint(2, 9)}) = log({rng.randint(20, 90)}).",
                ]
            )
            + ask
        )
    if kind == 23:
        m = [[rng.randint(-5, 9) for _ in range(3)] for _ in range(3)]
        if rng.random() < 0.5:
            return (
                f"Find the determinant of the 2x2 matrix [[{m[0][0]}, {m[0][1]}], [{m[1][0]}, "
                f"{m[1][1]}]].{ask}"
            )
        return (
            f"Compute the determinant of the matrix [[{', '.join(map(str, m[0]))}], "
            f"[{', '.join(map(str, m[1]))}], [{', '.join(map(str, m[2]))}]].{ask}"
        )
    if kind == 24:
        u = [rng.randint(-6, 6) for _ in range(3)]
        v = [rng.randint(-6, 6) for _ in range(3)]
        return (
            rng.choice(
                [
                    f"Find the dot product of the vectors ({', '.join(map(str, u))}) and "
                    f"({', '.join(map(str, v))}).",
                    f"Compute the cross product of ({', '.join(map(str, u))}) and "
                    f"({', '.join(map(str, v))}).",
                    f"What is the length of the vector ({', '.join(map(str, u))})?",
                ]
            )
            + ask
        )
    if kind == 25:
        a, b, c, d = (rng.randint(-9, 9) for _ in range(4))
        return (
            rng.choice(
                [
                    f"Multiply the complex numbers ({a} + {b}i) and ({c} - {abs(d)}i).",
                    f"What is the modulus of {a} + {b}i?",
                    f"Divide ({a} + {b}i) by ({c or 1} + {abs(d) or 1}i).",
                ]
            )
            + ask
        )
    if kind == 26:
        x1, y1, x2, y2 = (rng.randint(-10, 10) for _ in range(4))
        if x1 == x2:
            x2 += 1
        return (
            rng.choice(
                [
                    f"Find the slope and equation of the line through ({x1}, {y1}) and ({x2}, {y2}).",
                    f"What is the distance between the points ({x1}, {y1}) and ({x2}, {y2})?",
                    f"Find the midpoint of the segment from ({x1}, {y1}) to ({x2}, {y2}).",
                ]
            )
            + ask
        )
    if kind == 27:
        a, m = rng.randint(10, 500), rng.choice([7, 9, 11, 12, 13])
        return (
            rng.choice(
                [
                    f"What is {a} mod {m}?",
                    f"What is {rng.randint(2, 9)}^{rng.randint(5, 40)} mod {m}?",
                    f"Find the last digit of {rng.randint(2, 9)}^{rng.randint(10, 99)}.",
                ]
            )
            + ask
        )
    if kind == 28:
        v = rng.randint(2, 500)
        return (
            rng.choice(
                [
                    f"Convert {v} kilometers per hour to meters per second.",
                    f"How many seconds are in {v} hours?",
                    f"Convert {v} degrees Fahrenheit to Celsius.",
                    f"Convert {v} square meters to square feet.",
                    f"How many milliliters are in {v / 4:g} liters?",
                    f"Convert {v} miles to kilometers.",
                ]
            )
            + ask
        )
    expr = (
        f"{rng.randint(2, 30)} + {rng.randint(2, 9)} × ({rng.randint(2, 20)} - {rng.randint(1, 9)})^2 ÷ "
        f"{rng.choice([2, 4, 8])} - {rng.randint(1, 15)}"
    )
    return f"Evaluate {expr} using the correct order of operations.{ask}"


# ---------------------------------------------------------------------------------------------------
# Math word problems
# ---------------------------------------------------------------------------------------------------

SHOP_ITEMS = [
    ("notebooks", 3),
    ("pens", 2),
    ("apples", 1),
    ("candles", 6),
    ("plant pots", 5),
    ("tennis balls", 4),
    ("jars of honey", 7),
    ("loaves of bread", 4),
    ("packs of stickers", 3),
    ("bags of rice", 9),
]
VEHICLES = _items("""
a cyclist | a train | a delivery van | a ferry | a hiker | a bus | a drone
""")


def _math_word(rng: random.Random) -> str:
    kind = rng.randrange(22)
    n1, n2 = _pick(rng, FIRST_NAMES, 2)
    ask = rng.choice(["", " Explain your reasoning.", " Solve it step by step.", " Show your calculation."])
    if kind == 0:
        (i1, p1), (i2, p2) = rng.sample(SHOP_ITEMS, 2)
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        p1, p2 = p1 + rng.choice([0, 0.5, 0.25]), p2 + rng.choice([0, 0.75, 0.5])
        bill = rng.choice([20, 50, 100])
        return (
            f"{n1} buys {a} {i1} at ${p1:.2f} each and {b} {i2} at ${p2:.2f} each, paying with a ${bill} "
            f"bill. How much change does {n1} get?{ask}"
        )
    if kind == 1:
        v, t = rng.choice(VEHICLES), rng.randint(2, 6)
        d = rng.randint(20, 400)
        return (
            f"{v.capitalize()} covers {d} km in {t} hours. At the same speed, how long does it take to cover "
            f"{rng.randint(30, 600)} km?{ask}"
        )
    if kind == 2:
        d, v1, v2 = rng.randint(100, 600), rng.randint(40, 110), rng.randint(40, 110)
        return (
            f"Two cars start {d} km apart and drive toward each other, one at {v1} km/h and the other at "
            f"{v2} km/h. After how long do they meet, and how far has the faster car driven?{ask}"
        )
    if kind == 3:
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        task = rng.choice(
            [
                "paint a fence",
                "clean the house",
                "assemble a bookshelf",
                "plant a row of trees",
                "sort the mail",
            ]
        )
        return (
            f"{n1} can {task} in {a} hours and {n2} can do it in {b} hours. How long will it take if they "
            f"work together?{ask}"
        )
    if kind == 4:
        p, x, y = rng.randint(20, 400), rng.choice([10, 15, 20, 25, 30, 40]), rng.choice([5, 7, 8, 10, 20])
        item = rng.choice(
            ["jacket", "bicycle helmet", "lamp", "pair of boots", "tent", "backpack", "blender"]
        )
        return (
            f"A {item} costs ${p}. It is discounted by {x}%, and then a sales tax of {y}% is added. What is "
            f"the final price?{ask}"
        )
    if kind == 5:
        n, m, g = rng.randint(2, 6), rng.randint(5, 20), rng.randint(150, 900)
        dish = rng.choice(
            ["pancakes", "a vegetable curry", "cookies", "lemonade", "a lentil soup", "pizza dough"]
        )
        unit = rng.choice(["grams of flour", "grams of sugar", "milliliters of milk", "grams of lentils"])
        return (
            f"A recipe for {dish} that serves {n} people uses {g} {unit}. How much is needed to serve {m} "
            f"people?{ask}"
        )
    if kind == 6:
        a, b, c = rng.randint(5, 60), rng.randint(20, 400), rng.randint(300, 2500)
        item = rng.choice(["new laptop", "bicycle", "guitar", "telescope", "camera", "sewing machine"])
        return (
            f"{n1} saves ${a} each week and already has ${b}. A {item} costs ${c}. How many weeks until {n1} "
            f"can afford it?{ask}"
        )
    if kind == 7:
        y, k, n = rng.randint(5, 30), rng.randint(2, 25), rng.randint(2, 15)
        s = 2 * y + k + 2 * n
        return (
            f"{n1} is {k} years older than {n2}. In {n} years, the sum of their ages will be {s}. How old is "
            f"{n2} now?{ask}"
        )
    if kind == 8:
        a, b = rng.randint(2, 7), rng.randint(2, 7)
        total = (a + b) * rng.randint(3, 12)
        grp = rng.choice(
            [
                ("boys", "girls", "a class"),
                ("cats", "dogs", "an animal shelter"),
                ("red cars", "blue cars", "a car park"),
            ]
        )
        return (
            f"The ratio of {grp[0]} to {grp[1]} in {grp[2]} is {a}:{b}. If there are {total} in total, how "
            f"many {grp[0]} are there?{ask}"
        )
    if kind == 9:
        length, width, t = rng.randint(3, 12), rng.randint(3, 10), rng.choice([20, 25, 30, 40, 50])
        return (
            f"A room is {length} m long and {width} m wide. How many square tiles of side {t} cm are needed "
            f"to cover the floor?{ask}"
        )
    if kind == 10:
        vol, r, q = rng.randint(200, 5000), rng.randint(20, 90), rng.randint(2, 15)
        return (
            f"A pipe fills a tank of {vol} liters at {r} liters per minute, but a leak drains {q} liters per "
            f"minute. How long until the tank is full?{ask}"
        )
    if kind == 11:
        c, d, p = (
            rng.choice([5.5, 6, 6.8, 7.2, 8, 9.5]),
            rng.randint(80, 900),
            rng.choice([1.45, 1.6, 1.72, 1.89]),
        )
        return (
            f"A car uses {c} liters of fuel per 100 km. Fuel costs ${p} per liter. How much does a {d} km "
            f"trip cost?{ask}"
        )
    if kind == 12:
        p, total, done = rng.randint(10, 60), rng.randint(200, 900), rng.randint(20, 150)
        return (
            f"{n1} reads {p} pages a day. The book has {total} pages and {n1} has already read {done}. How "
            f"many more days are needed to finish?{ask}"
        )
    if kind == 13:
        perim, length = rng.randint(20, 100) * 2, 0
        length = rng.randint(perim // 8 + 1, perim // 2 - 1)
        return (
            f"A rectangular garden has a perimeter of {perim} meters and a length of {length} meters. What "
            f"is its area?{ask}"
        )
    if kind == 14:
        a, frac = rng.randint(60, 300), rng.choice(["half", "a third", "a quarter", "two fifths"])
        item = rng.choice(["muffins", "croissants", "bagels", "cupcakes"])
        return (
            f"A bakery makes {a} {item} in the morning and sells {rng.randint(10, a // 2)} before 9 a.m. "
            f"Later it sells {frac} of what is left. How many {item} remain?{ask}"
        )
    if kind == 15:
        h, m, d = rng.randint(1, 11), rng.choice([0, 10, 15, 20, 35, 45]), rng.randint(80, 190)
        ev = rng.choice(
            ["A film", "A concert", "A flight", "A football match with a break", "A theater play"]
        )
        return f"{ev} starts at {h}:{m:02d} p.m. and lasts {d} minutes. At what time does it end?{ask}"
    if kind == 16:
        a = rng.randint(2000, 90000)
        b = int(a * rng.uniform(0.7, 1.5))
        what = rng.choice(
            [
                "The population of a town",
                "The number of visitors to a museum",
                "A company's yearly sales in units",
                "The number of members of a sports club",
            ]
        )
        return f"{what} went from {a:,} to {b:,} in one year. What was the percentage change?{ask}"
    if kind == 17:
        n, bill, tip = rng.randint(3, 9), rng.randint(60, 480), rng.choice([10, 12, 15, 18, 20])
        return (
            f"{n} friends share a dinner bill of ${bill} and add a {tip}% tip. If they split it evenly, how "
            f"much does each person pay?{ask}"
        )
    if kind == 18:
        r, h = rng.choice([14, 16.5, 18, 21, 24.75, 30]), rng.randint(41, 58)
        return (
            f"{n1} earns ${r} per hour, and 1.5 times that rate for every hour over 40 in a week. Last week "
            f"{n1} worked {h} hours. What was the total pay?{ask}"
        )
    if kind == 19:
        a, b = rng.randint(10, 40), rng.randint(10, 40)
        pa, pb = rng.randint(2, 9), rng.randint(10, 20)
        return (
            f"A shop mixes {a} kg of coffee costing ${pa} per kg with {b} kg costing ${pb} per kg. What is "
            f"the price per kg of the mixture, and what should it sell for to make a 25% profit?{ask}"
        )
    if kind == 20:
        s = [rng.randint(55, 100) for _ in range(rng.randint(3, 5))]
        target = rng.randint(75, 92)
        return (
            f"{n1}'s test scores so far are {', '.join(map(str, s))}. What score is needed on the next test "
            f"to bring the average up to {target}?{ask}"
        )
    w, per = rng.randint(3, 12), rng.randint(2, 6)
    return (
        f"A school trip has {rng.randint(40, 200)} students and {w} teachers. Each minibus holds "
        f"{rng.choice([12, 15, 18, 22])} people, and each rental costs ${rng.randint(80, 300)}. How many "
        f"minibuses are needed, and what is the total cost? Each student also pays ${per} for lunch; what is "
        f"the total lunch money?{ask}"
    )


# ---------------------------------------------------------------------------------------------------
# Coding
# ---------------------------------------------------------------------------------------------------

PY_TASKS = _items("""
checks whether a string is a palindrome, ignoring spaces, case and punctuation
merges two sorted lists into one sorted list without using sort() | flattens an arbitrarily nested list
validates an email address with a regular expression
finds all primes below n with the Sieve of Eratosthenes | reverses the order of words in a sentence
removes duplicates from a list while keeping the original order
computes a moving average over a list with window size k | converts a Roman numeral to an integer
converts an integer between 1 and 3999 to a Roman numeral | checks whether two strings are anagrams
rotates a square matrix 90 degrees clockwise | finds the longest common prefix of a list of strings
performs binary search on a sorted list and returns the index or -1
groups a list of dictionaries by the value of a given key | computes the edit distance between two strings
returns the k most frequent elements of a list | implements a least-recently-used cache class
splits a list into chunks of size n | checks whether brackets ()[]{} in a string are balanced
returns the second largest distinct number in a list | implements a stack class with push, pop and peek
generates all permutations of a string | finds the first non-repeating character in a string
retries a function with exponential backoff, written as a decorator
provides a decorator that logs how long a function takes | checks whether a 9x9 Sudoku grid is valid
computes the power set of a list | finds the length of the longest substring without repeating characters
transposes a matrix given as a list of lists | implements quicksort | implements merge sort
checks whether a number is a perfect square without using math.sqrt
renames every .txt file in a folder by adding today's date as a prefix | sums the digits of an integer
finds the missing number in a list containing all of 0..n except one | implements a queue using two stacks
converts snake_case strings to camelCase | parses a web server log and counts error lines per hour
detects a cycle in a singly linked list | checks whether a year is a leap year
run-length encodes a string such as 'aaabcc' into 'a3b1c2'
generates a random password that meets given rules
finds all pairs in a list that add up to a target value | implements a trie with insert and prefix search
topologically sorts tasks given their dependencies
collapses repeated whitespace in a string into single spaces
converts a list of (name, score) tuples into a ranked leaderboard string
reads a CSV file of expenses and prints the total per category | computes the day of the week for any date
validates a credit card number with the Luhn algorithm
converts a number of seconds into 'Xh Ym Zs' format | finds the largest sum of a contiguous subarray
counts islands in a grid of '1' and '0' characters | merges overlapping intervals
checks whether a binary tree is balanced | evaluates a postfix expression
draws a text histogram from a dictionary of counts
computes compound interest for each year and prints a table
splits a bill among friends, given who paid what, and prints who owes whom
""")
PY_EXTRAS = [
    "",
    " Include type hints and a docstring.",
    " Add a few example calls.",
    " Explain its time complexity.",
    " Also write pytest unit tests for it.",
    " Do not use any external libraries.",
    " Keep it short and readable.",
    " Make sure it handles empty input.",
]
JS_TASKS = _items("""
debounces another function | deep-clones a plain object
fetches JSON from a URL with async/await and handles errors
validates a sign-up form with name, email and password fields
toggles dark mode on a web page and remembers the choice | shuffles an array in place
shows a live character count under a textarea | formats a number as a currency string
throttles a scroll event handler | turns a URL query string into an object
sorts an array of objects by a property | runs a countdown timer on the page
groups array items by a key using reduce | removes all falsy values from an array
implements a tiny event emitter class | checks whether two objects are deeply equal
makes an HTML table sortable by column | flattens a nested array without using Array.prototype.flat
memoizes a function of one argument | converts a hex color such as #1e90ff to an RGB object
returns the unique values of an array | lazy-loads images when they scroll into view
rejects a promise if it takes longer than a timeout | formats a Date as YYYY-MM-DD
paginates an array into pages of a given size | finds the most common element of an array
builds a simple to-do list with add and delete buttons
copies text to the clipboard when a button is clicked | retries a failing fetch up to three times
counts words in a string, ignoring punctuation
""")
OTHER_LANGS = _items("""
Java | C | C++ | Go | Rust | C# | Ruby | Kotlin | TypeScript | Swift
""")
SMALL_TASKS = _items("""
reads integers from standard input and prints their sum and average
prints a multiplication table up to 12 | reverses a string
counts the lines, words and characters in a file | checks whether a number is prime
finds the largest element in an array | converts Celsius to Fahrenheit for values from -10 to 40
implements a simple bank account class with deposit and withdraw
reads a text file and prints it with line numbers | implements a generic stack
sorts an array of strings by length | computes the GCD of two numbers
prints the first n rows of Pascal's triangle
simulates rolling a die 1000 times and prints the frequencies
""")
SQL_SCHEMAS = {
    "employees(id, name, department_id, salary, hire_date) and departments(id, name, city)": [
        "lists each department with its average salary",
        "finds employees who earn more than their department's average",
        "counts how many people were hired each year",
        "returns the three highest-paid employees in each department",
        "finds departments with no employees",
        "shows the total salary cost per city",
    ],
    "customers(id, name, city, signup_date), orders(id, customer_id, order_date, total)": [
        "finds customers who have never placed an order",
        "returns each customer's total spending, highest first",
        "counts orders per month in 2024",
        "finds customers whose first order was more than 30 days after signing up",
        "lists the cities with more than 50 customers",
        "returns the average order value per city",
    ],
    "students(id, name, year), courses(id, title, credits), enrollments(student_id, course_id, grade)": [
        "lists students with their total credits",
        "finds the course with the highest average grade",
        "finds students enrolled in more than four courses",
        "lists courses that no student has taken",
        "ranks students by average grade within each year",
        "counts enrollments per course",
    ],
    "books(id, title, author_id, published_year, genre), authors(id, name, country), loans(book_id, "
    "member_id, loan_date, return_date)": [
        "finds books that are currently on loan",
        "lists the five most borrowed books",
        "counts books per genre and country",
        "finds members who returned a book more than 21 days late",
        "lists authors who have books in more than two genres",
    ],
    "products(id, name, category, price), sales(id, product_id, quantity, sold_at)": [
        "returns the revenue per category for last month",
        "finds products that have not sold in 90 days",
        "computes a running total of daily revenue",
        "lists the best-selling product in each category",
        "finds days on which revenue was above the monthly average",
    ],
    "flights(id, origin, destination, departure_time, airline, price)": [
        "finds the cheapest flight for each route",
        "counts flights per airline per day",
        "lists routes served by more than one airline",
        "finds the average price of flights leaving after 6 p.m.",
    ],
}
ALGORITHMS = _items("""
Dijkstra's shortest path algorithm | A* search | quicksort | merge sort | heap sort | binary search
breadth-first search | depth-first search | the 0/1 knapsack dynamic programming solution
Kruskal's algorithm | Prim's algorithm | the Bellman-Ford algorithm | the Floyd-Warshall algorithm
the KMP string-matching algorithm | the Rabin-Karp algorithm | union-find with path compression
Bloom filters | consistent hashing | topological sorting | the two-pointer technique
the sliding window technique | backtracking for the N-Queens problem | hash tables with open addressing
red-black trees | B-trees | segment trees | Fenwick trees | the Raft consensus algorithm
gradient descent | k-means clustering | MapReduce | Huffman coding | reservoir sampling
the Fisher-Yates shuffle | quickselect | skip lists | Bresenham's line algorithm | the Euclidean algorithm
counting sort | radix sort
""")
CODE_PAIRS = _items("""
a list and a tuple in Python | == and is in Python | let, var and const in JavaScript
a process and a thread | stack and heap memory | TCP and UDP | SQL and NoSQL databases
an INNER JOIN and a LEFT JOIN | git merge and git rebase | an abstract class and an interface
a shallow copy and a deep copy | compiled and interpreted languages | synchronous and asynchronous code
REST and GraphQL | unit tests and integration tests | map and forEach in JavaScript
@staticmethod and @classmethod in Python | a generator and a list comprehension in Python
mutable and immutable objects | HashMap and TreeMap in Java | a pointer and a reference in C++
concurrency and parallelism | authentication and authorization | a virtual machine and a container
cookies and localStorage | WHERE and HAVING in SQL
""")
CODE_SNIPPETS = [
    (
        "python",
        "def f(xs):\n    out = []\n    for x in xs:\n        if x not in out:\n            out.append(x)\n "
        "   return out",
    ),
    (
        "python",
        "def avg(nums):\n    total = 0\n    for n in nums:\n        total += n\n    return total / len(nums)",
    ),
    (
        "python",
        "import collections\n\ndef top(words, k):\n    c = collections.Counter(w.lower() for w in words)\n "
        "   return [w for w, _ in c.most_common(k)]",
    ),
    ("python", "def add_item(item, bucket=[]):\n    bucket.append(item)\n    return bucket"),
    ("python", "def fact(n):\n    if n == 0:\n        return 1\n    return n * fact(n - 1)"),
    ("python", "squares = {n: n * n for n in range(10) if n % 2}\nprint(sum(squares.values()))"),
    (
        "python",
        "with open('data.txt') as fh:\n    lines = [ln.strip() for ln in fh if "
        "ln.strip()]\nprint(len(lines))",
    ),
    (
        "python",
        "def find(xs, target):\n    lo, hi = 0, len(xs)\n    while lo < hi:\n        mid = (lo + hi) // "
        "2\n        if xs[mid] < target:\n            lo = mid + 1\n        else:\n            hi = mid\n  "
        "  return lo",
    ),
    (
        "python",
        "class Counter:\n    count = 0\n    def increment(self):\n        self.count += 1\n\na, b = "
        "Counter(), Counter()\na.increment()\nprint(a.count, b.count)",
    ),
    ("python", "for i in range(3):\n    pass\nprint(i)\nprint([j for j in range(3)][-1])"),
    ("javascript", "for (var i = 0; i < 3; i++) {\n  setTimeout(() => console.log(i), 100);\n}"),
    ("javascript", "const nums = [10, 1, 5, 100];\nnums.sort();\nconsole.log(nums);"),
    (
        "javascript",
        "function sum(...args) {\n  return args.reduce((a, b) => a + b, 0);\n}\nconsole.log(sum(1, 2, 3));",
    ),
    ("javascript", "async function load(url) {\n  const res = await fetch(url);\n  return res.json();\n}"),
    ("javascript", "console.log(0.1 + 0.2 === 0.3);\nconsole.log([] + {});"),
    (
        "javascript",
        "const user = { name: 'Ana', greet() { return 'Hi ' + this.name; } };\nconst g = "
        "user.greet;\nconsole.log(g());",
    ),
    (
        "sql",
        "SELECT department_id, COUNT(*)\nFROM employees\nWHERE salary > 50000\nGROUP BY "
        "department_id\nHAVING COUNT(*) > 3;",
    ),
    (
        "sql",
        "SELECT c.name, o.total\nFROM customers c\nLEFT JOIN orders o ON o.customer_id = c.id\nWHERE "
        "o.total > 100;",
    ),
    (
        "c",
        "#include <stdio.h>\nint main(void) {\n    int a[5] = {1, 2, 3, 4, 5};\n    for (int i = 0; i <= 5; "
        'i++) printf("%d\\n", a[i]);\n    return 0;\n}',
    ),
    ("c", "char *copy(const char *s) {\n    char buf[64];\n    strcpy(buf, s);\n    return buf;\n}"),
    ("bash", 'for f in *.log; do\n  gzip "$f"\ndone'),
    ("bash", "count=$(grep -c ERROR app.log)\nif [ $count -gt 10 ]; then echo 'too many errors'; fi"),
    (
        "go",
        "func sum(xs []int) int {\n\ttotal := 0\n\tfor _, x := range xs {\n\t\ttotal += x\n\t}\n\treturn "
        "total\n}",
    ),
    ("rust", 'fn main() {\n    let s = String::from("hello");\n    let t = s;\n    println!("{}", s);\n}'),
]
SNIPPET_ASKS = _items("""
Explain what this code does, line by line: | Is there a bug in this code? If so, explain and fix it:
What does this code print or return, and why? | Suggest improvements to make this code clearer or safer:
Add helpful comments to this code: | Rewrite this code in a more idiomatic style:
""")
CODE_MISC = _items("""
Write a regular expression that matches {what}, and explain each part.
Explain Big-O notation using {algo} as an example.
How do I set up a Python virtual environment and install packages into it?
What are the SOLID principles? Give a short example for each.
Explain what a REST API is and design the endpoints for {app}.
Design the database tables for {app}. Show the SQL CREATE TABLE statements.
Write a Dockerfile for a small Python web app that listens on port 8000.
Explain how HTTPS keeps data safe, step by step.
What is recursion? Show a simple example in Python and explain the call stack.
How does garbage collection work in languages like Java or Python?
Explain what a race condition is and how a lock prevents it.
Write a git workflow guide for a team of three working on {app}.
How would you write unit tests for a function that calls an external API?
Explain the model-view-controller pattern using {app} as an example.
What is dependency injection and why is it useful?
""")
REGEX_TARGETS = _items("""
US-style phone numbers | dates in YYYY-MM-DD format | hex color codes | IPv4 addresses | UK postcodes
times in 24-hour HH:MM format | words that start with a capital letter | hashtags in a tweet
""")
APPS = _items("""
a library lending system | a recipe-sharing site | a gym class booking app | a small online shop
a to-do list app | a school timetable tool | a bike-sharing service | a personal budget tracker
a blog platform
""")


def _coding(rng: random.Random) -> str:
    kind = rng.choices(
        ["py", "js", "other", "sql", "algo", "pair", "snippet", "misc"],
        weights=[26, 12, 10, 12, 10, 8, 14, 8],
    )[0]
    if kind == "py":
        form = rng.choice(
            [
                "Write Python code that {t}.{e}",
                "How do I write Python code that {t}?{e}",
                "Implement a Python function which {t}.{e}",
                "Show me a Python solution that {t}.{e}",
            ]
        )
        return form.format(t=rng.choice(PY_TASKS), e=rng.choice(PY_EXTRAS))
    if kind == "js":
        return rng.choice(
            [
                "Write a JavaScript function that {t}.",
                "In JavaScript, how can I write code that {t}?",
                "Write modern JavaScript (ES2020 or later) that {t}. Explain it briefly.",
            ]
        ).format(t=rng.choice(JS_TASKS))
    if kind == "other":
        return rng.choice(
            [
                "Write a {l} program that {t}.",
                "Show how to write code in {l} that {t}, with comments.",
                "I'm learning {l}. Write a program that {t} and explain the syntax.",
            ]
        ).format(l=rng.choice(OTHER_LANGS), t=rng.choice(SMALL_TASKS))
    if kind == "sql":
        schema = rng.choice(list(SQL_SCHEMAS))
        q = rng.choice(SQL_SCHEMAS[schema])
        return rng.choice(
            [
                "Given the tables {s}, write a SQL query that {q}.",
                "I have a database with tables {s}. Write a query that {q}, and explain it.",
                "Using PostgreSQL and the tables {s}, write a query that {q}.",
            ]
        ).format(s=schema, q=q)
    if kind == "algo":
        return rng.choice(
            [
                "Explain how {a} works and give its time complexity.",
                "Explain {a} to a beginner, with a small example.",
                "Implement {a} in Python and explain the key idea.",
                "When would you use {a}? What are its limitations?",
            ]
        ).format(a=rng.choice(ALGORITHMS))
    if kind == "pair":
        return rng.choice(
            [
                "What is the difference between {p}?",
                "Explain the difference between {p}, with examples.",
                "When should I choose between {p}?",
            ]
        ).format(p=rng.choice(CODE_PAIRS))
    if kind == "snippet":
        lang, code = rng.choice(CODE_SNIPPETS)
        return f"{rng.choice(SNIPPET_ASKS)}\n\n```{lang}\n{code}\n```"
    return rng.choice(CODE_MISC).format(
        what=rng.choice(REGEX_TARGETS), algo=rng.choice(ALGORITHMS), app=rng.choice(APPS)
    )


# ---------------------------------------------------------------------------------------------------
# Information extraction from a short text written on the fly
# ---------------------------------------------------------------------------------------------------

SKILLS = _items("""
Python | SQL | Excel | Figma | customer interviews | forklift operation | Spanish | bookkeeping
project planning | React | laboratory safety | technical writing | data visualization | cold calling
""")
VENUES = _items("""
the old tram depot | Riverside Community Hall | the public library's main room | Harbor Park bandstand
the university's east auditorium | a rooftop terrace on Mill Street | the town square
""")
EVENT_KINDS = _items("""
book swap | jazz evening | repair cafe | science fair | charity 5K run | food festival
open-air film night | craft market | coding workshop | choir concert
""")
AIRPORT_CODES = _items("""
LIS | NBO | KIX | YYZ | KRK | EDI | SGN | TBS | MEL | YUL | OPO | ACC | BGO | CPT | DEN
""")
INGREDIENTS = _items("""
flour | butter | sugar | eggs | milk | oats | honey | cinnamon | lentils | onions | carrots | garlic
rice | coconut milk | tomatoes | spinach | chickpeas | lemon juice
""")


EVENT_NOTES = _items("""
Bring your own cup. | Parking is limited, so please cycle if you can. | Dogs on leads are welcome.
Food trucks will be on site.
""")


def _text_job(rng: random.Random) -> str:
    lo = rng.randrange(38, 90) * 1000
    return (
        f"{rng.choice(COMPANIES)} is hiring a {rng.choice(JOBS)} to join its {rng.choice(TEAMS)} team in "
        f"{rng.choice(CITIES)}. The position is "
        f"{rng.choice(['full-time', 'part-time', 'a 12-month contract'])} and pays between ${lo:,} and "
        f"${lo + rng.randrange(5, 25) * 1000:,} a year. Candidates need at least {rng.randint(1, 6)} years "
        f"of experience with {rng.choice(SKILLS)} and {rng.choice(SKILLS)}. Applications close on "
        f"{_date(rng)}. Questions can be sent to {_person(rng)} at "
        f"jobs@{rng.choice(['brightwater', 'kestrel', 'northwind', 'helix', 'lumen'])}.example."
    )


def _text_event(rng: random.Random) -> str:
    return (
        f"Join us for a {rng.choice(EVENT_KINDS)} at {rng.choice(VENUES)} in {rng.choice(CITIES)} on "
        f"{_date(rng)}, from {_clock(rng)} until late. Tickets cost ${rng.randint(0, 40)} for adults and "
        f"children under {rng.randint(10, 16)} get in free. The event is organized by {_person(rng)} with "
        f"support from {rng.choice(COMPANIES)}. {rng.choice(EVENT_NOTES)} To volunteer, contact "
        f"{_person(rng)} before {rng.choice(WEEKDAYS)}."
    )


def _text_meeting(rng: random.Random) -> str:
    p = _pick(rng, FIRST_NAMES, 4)
    tasks = _pick(
        rng,
        [
            "update the onboarding guide",
            "book the venue for the offsite",
            "send the survey to customers",
            "fix the login bug",
            "prepare the quarterly budget draft",
            "call the printer about the delay",
            "review the new logo options",
            "clean up the shared drive",
            "draft the press release",
        ],
        3,
    )
    return (
        f"Notes from the {rng.choice(TEAMS)} team meeting on {_date(rng)}. Present: {', '.join(p)}. {p[0]} "
        f"will {tasks[0]} by {rng.choice(WEEKDAYS)}. {p[1]} agreed to {tasks[1]}, and {p[2]} offered to "
        "help. The budget for the "
        f"{rng.choice(['spring campaign', 'website refresh', 'warehouse move', 'training program'])} was set "
        f"at {_money(rng, 2000, 60000, 500)}. {p[3]} asked to {tasks[2]} before the next meeting on "
        f"{_date(rng)}."
    )


def _text_review(rng: random.Random) -> str:
    prod = rng.choice(PRODUCTS)
    return (
        f"I bought {prod} from {rng.choice(COMPANIES)} in {rng.choice(MONTHS)} for {_money(rng, 25, 600)}. "
        f"{rng.choice(['Delivery took only two days.', 'It arrived a week late.', 'The box was damaged.'])} "
        f"{rng.choice(['The build quality is excellent', 'It feels a bit flimsy', 'It looks great'])}, and "
        f"{rng.choice(['setup was quick', 'the manual was confusing', 'support replied fast'])}. After "
        f"{rng.randint(2, 10)} weeks of use, "
        f"{rng.choice(['I would buy it again', 'I am returning it', 'I am mostly happy'])}. I give it "
        f"{rng.randint(1, 5)} out of 5 stars. — {_person(rng)}"
    )


def _text_order(rng: random.Random) -> str:
    items = rng.sample(SHOP_ITEMS, 3)
    lines = [
        f"{rng.randint(1, 6)} x {name} at ${price + rng.choice([0.49, 0.99, 0.25]):.2f}"
        for name, price in items
    ]
    return (
        f"Order #{rng.randint(10000, 99999)} from {rng.choice(COMPANIES)}, placed {_date(rng)} by "
        f"{_person(rng)}. Items: {'; '.join(lines)}. Shipping: ${rng.choice([0, 4.99, 7.5])}. Delivery to "
        f"{rng.randint(1, 200)} "
        f"{rng.choice(['Elm Road', 'Harbor Street', 'Linden Avenue', 'Quarry Lane', 'Station Road'])}, "
        f"{rng.choice(CITIES)}. Expected arrival: {rng.choice(WEEKDAYS)}."
    )


def _text_trip(rng: random.Random) -> str:
    a, b, c = rng.sample(AIRPORT_CODES, 3)
    return (
        f"Itinerary for {_person(rng)}: Flight "
        f"{rng.choice(['TP', 'KL', 'LH', 'AC', 'QF'])}{rng.randint(100, 999)} leaves {a} at {_clock(rng)} on "
        f"{_date(rng, (2025,))} and lands in {b} at {_clock(rng)}. After a {rng.randint(1, 5)}-hour layover, "
        f"the connecting flight departs for {c}. Hotel: "
        f"{rng.choice(['Hotel Aurora', 'The Linden Inn', 'Casa Azul', 'Harborview Lodge'])}, "
        f"{rng.randint(2, 7)} nights, breakfast included. Return flight on {_date(rng, (2025,))}. Booking "
        f"reference {''.join(rng.choice('ABCDEFGHJKLMNPQRSTUVWXYZ23456789') for _ in range(6))}."
    )


def _text_news(rng: random.Random) -> str:
    co = rng.choice(COMPANIES)
    return (
        f"{co} reported revenue of {_money(rng, 2, 900)} million for the "
        f"{rng.choice(['first', 'second', 'third', 'fourth'])} quarter, up {rng.randint(1, 30)}% from a year "
        f"earlier. Chief executive {_person(rng)} said the company would open {rng.randint(2, 12)} new "
        f"locations in {rng.choice(CITIES)} and {rng.choice(CITIES)} next year and hire about "
        f"{rng.randint(50, 900)} staff. Shares rose {rng.randint(1, 9)}.{rng.randint(0, 9)}% on "
        f"{rng.choice(WEEKDAYS[:5])}. Analysts at {rng.choice(COMPANIES)} warned that rising costs could "
        "reduce margins."
    )


def _text_listing(rng: random.Random) -> str:
    return (
        f"For sale: a {rng.randint(1, 5)}-bedroom "
        f"{rng.choice(['apartment', 'terraced house', 'cottage', 'loft'])} in {rng.choice(CITIES)}, "
        f"{rng.randint(45, 220)} square meters, built in {rng.randint(1890, 2022)}. Features "
        f"{rng.choice(['a sunny balcony', 'a small garden', 'a new kitchen', 'underfloor heating'])} and "
        f"{rng.choice(['a garage', 'a wood stove', 'a shared courtyard', 'views of the river'])}. Asking "
        f"price {_money(rng, 120000, 950000, 5000)}. Viewings on {rng.choice(WEEKDAYS)}s; contact agent "
        f"{_person(rng)}."
    )


def _text_recipe(rng: random.Random) -> str:
    ing = rng.sample(INGREDIENTS, 5)
    amounts = [
        f"{rng.choice([50, 100, 150, 200, 250, 400])} g of {ing[0]}",
        f"{rng.randint(1, 4)} tablespoons of {ing[1]}",
        f"{rng.randint(1, 3)} cups of {ing[2]}",
        f"a pinch of {ing[3]}",
        f"{rng.randint(1, 500)} ml of {ing[4]}",
    ]
    return (
        f"My {rng.choice(['grandmother', 'neighbor', 'old flatmate', 'uncle'])}'s recipe: mix {amounts[0]} "
        f"with {amounts[1]}, then stir in {amounts[2]}. Add {amounts[3]} and {amounts[4]}. Cook for "
        f"{rng.randint(10, 60)} minutes at {rng.choice([160, 180, 200, 220])} °C or until golden. Serves "
        f"{rng.randint(2, 8)}."
    )


def _text_bio(rng: random.Random) -> str:
    name = _person(rng)
    return (
        f"{name} was born in {rng.choice(CITIES)} in {rng.randint(1940, 1998)}. After studying "
        f"{rng.choice(['chemistry', 'architecture', 'music', 'economics', 'marine biology', 'history'])} at "
        f"university in {rng.choice(CITIES)}, {name.split()[0]} worked for {rng.randint(3, 20)} years at "
        f"{rng.choice(COMPANIES)}. In {rng.randint(2005, 2023)} {name.split()[0]} founded "
        f"{rng.choice(COMPANIES)}, which now employs {rng.randint(10, 800)} people. {name.split()[0]} speaks "
        f"{rng.choice(LANGUAGES)} and {rng.choice(LANGUAGES)} and lives in {rng.choice(CITIES)}."
    )


def _text_support(rng: random.Random) -> str:
    cust, agent = rng.choice(FIRST_NAMES), rng.choice(FIRST_NAMES)
    prod = rng.choice(PRODUCTS)
    return (
        f"{cust}: Hi, I ordered {prod} on {_date(rng, (2025,))} and it still hasn't arrived. Order number "
        f"{rng.randint(100000, 999999)}.\n{agent}: Sorry about that! I see it was sent to the "
        f"{rng.choice(['wrong', 'old'])} address on "
        f"{rng.choice(['Elm Road', 'Quarry Lane', 'Harbor Street'])}. I can resend it today with express "
        f"shipping at no cost.\n{cust}: Yes please, and can I get a refund of the {_money(rng, 3, 15)} "
        f"shipping fee?\n{agent}: Done. You'll see the refund within {rng.randint(2, 10)} business days."
    )


EXTRACTION_TEXTS: list[tuple[Callable[[random.Random], str], list[str]]] = [
    (_text_job, ["job title, company, city, salary range, required skills, deadline and contact person"]),
    (_text_event, ["event type, venue, date, start time, ticket prices, organizer and volunteer contact"]),
    (
        _text_meeting,
        ["attendees, each action item with its owner and deadline, the budget, and the next meeting date"],
    ),
    (
        _text_review,
        ["product, seller, price, purchase month, rating, and the reviewer's main complaints or praise"],
    ),
    (
        _text_order,
        [
            "order number, customer, each item with quantity and unit price, shipping cost and delivery "
            "address"
        ],
    ),
    (_text_trip, ["traveler, flight number, airports, times, hotel, number of nights and booking reference"]),
    (
        _text_news,
        ["company, revenue, growth, executive name, expansion cities, hiring plans and share price change"],
    ),
    (_text_listing, ["property type, city, size, bedrooms, year built, features, price and agent"]),
    (_text_recipe, ["every ingredient with its amount, cooking time, temperature and number of servings"]),
    (_text_bio, ["full name, birthplace, birth year, field of study, employers, languages and current city"]),
    (
        _text_support,
        ["customer name, agent name, product, order number, problem, and what the agent promised"],
    ),
]
EXTRACTION_ASKS = _items("""
Extract the following fields as JSON: {fields}.
From the text below, pull out the {fields}. Use a bulleted list.
Read the text and return a table with these columns where possible: {fields}.
List every person, organization, place, date and amount of money mentioned in the text.
Extract all numbers in the text and say what each one refers to.
Identify the {fields} in this text. If something is missing, write 'not stated'.
Turn this text into a structured JSON object with sensible keys.
""")


def _extraction(rng: random.Random) -> str:
    make, fields = rng.choice(EXTRACTION_TEXTS)
    ask = rng.choice(EXTRACTION_ASKS).format(fields=rng.choice(fields))
    text = make(rng)
    if rng.random() < 0.5:
        return f"{ask}\n\nText:\n{text}"
    return f"{text}\n\n{ask}"


# ---------------------------------------------------------------------------------------------------
# Science and technology explanations
# ---------------------------------------------------------------------------------------------------

# physics
# chemistry
# biology and medicine
# earth and space
# computing and engineering
# mathematics as a science
STEM_CONCEPTS = _items("""
Newton's third law | inertia | friction | terminal velocity | the Doppler effect | buoyancy | torque
conservation of momentum | kinetic and potential energy | electrical resistance | Ohm's law
magnetic fields | electromagnetic induction | the photoelectric effect | wave interference
refraction of light | total internal reflection | entropy | heat conduction | the greenhouse effect
nuclear fission | nuclear fusion | half-life | special relativity | time dilation | black holes
dark matter | the Big Bang theory | gravitational waves | semiconductors | superconductivity
the Heisenberg uncertainty principle | sound waves | resonance | centripetal force | air pressure
chemical equilibrium | pH and acidity | catalysts | oxidation and reduction | covalent bonds | ionic bonds
the periodic table's organization | isotopes | polymers | electrolysis | the mole concept
activation energy | solubility | chirality in molecules | how batteries store energy | rusting of iron
fermentation | DNA replication | natural selection | cell division by mitosis | meiosis
how vaccines train the immune system | antibiotic resistance | the role of mitochondria | enzymes
the human circulatory system | how neurons send signals | homeostasis | the nitrogen cycle | food webs
symbiosis | how the kidneys filter blood | circadian rhythms | CRISPR gene editing | stem cells
the gut microbiome | how muscles contract | plant transpiration | pollination | how viruses replicate
the carbon cycle | biodiversity | epigenetics | plate tectonics | how earthquakes happen
volcanic eruptions | the water cycle | ocean currents | the seasons | the phases of the Moon | tides
how hurricanes form | the ozone layer | glaciers | how stars are born | exoplanet detection
the life cycle of a star | auroras | the El Niño phenomenon | rock formation and the rock cycle
how the internet routes data | public-key cryptography | how a CPU executes instructions | cache memory
how neural networks learn | overfitting in machine learning | how search engines rank pages | blockchains
how GPS works | how Wi-Fi works | compression algorithms | how touchscreens detect fingers
how a refrigerator works | how jet engines produce thrust | how solar panels make electricity
how wind turbines work | lithium-ion batteries | how bridges carry loads | how 3D printers work
how noise-cancelling headphones work | quantum computing | error-correcting codes
how electric motors work | how a microwave oven heats food | how LEDs produce light
operating system scheduling | virtual memory | floating-point numbers | how databases use indexes
the concept of a limit in calculus | prime numbers and why they matter | probability distributions
statistical significance | the Pythagorean theorem | exponential growth | Bayes' theorem
the normal distribution | fractals | logarithms | the Fourier transform | correlation versus causation
game theory
""")
STEM_AUDIENCES = [
    "",
    " to a ten-year-old",
    " to a high school student",
    " in simple terms",
    " using an everyday analogy",
    " in three short paragraphs",
    " as if I am a first-year university student",
    " in five bullet points",
    " and give a real-world example",
    " and mention a common misconception about it",
]
STEM_FRAMES = _items("""
Explain {c}{a}. | Can you explain {c}{a}? | What is {c}? Please explain{a}. | Help me understand {c}{a}.
I'm studying for an exam. Explain {c}{a}. | Give me a clear explanation of {c}{a}.
""")
STEM_PAIRS = _items("""
weather and climate | a virus and a bacterium | speed and velocity | mass and weight
an atom and a molecule | mitosis and meiosis | AC and DC electricity | heat and temperature
a comet and an asteroid | DNA and RNA | nuclear fission and fusion | an element and a compound
renewable and non-renewable energy | RAM and storage | a hypothesis and a theory
a series and a parallel circuit | accuracy and precision | innate and adaptive immunity
a solution and a suspension | a meteor and a meteorite | arteries and veins | sound and light waves
machine learning and traditional programming | latency and bandwidth | a planet and a dwarf planet
conduction, convection and radiation
""")
STEM_WHY = _items("""
Why do stars twinkle? | Why does a compass point north? | Why do we see rainbows after rain?
Why do mirrors reverse left and right but not up and down? | Why does coffee keep us awake?
Why does a balloon stick to a wall after rubbing it on hair? | Why is glass transparent?
Why do astronauts float on the space station? | Why do ears pop on an airplane?
Why does the ocean look blue while water in a glass looks clear? | Why do deserts get cold at night?
Why does a kettle whistle? | Why do some trees lose their leaves in winter while others do not?
Why do we have fingerprints? | Why does sound travel faster in water than in air?
Why is the sky blue? | Why do we have leap years? | Why does ice float on water?
Why do onions make you cry? | Why does bread rise? | Why do cats purr? | Why is sea water salty?
Why do leaves change color in autumn? | Why can't we see stars during the day?
Why do airplanes leave white trails in the sky? | Why does metal feel colder than wood?
Why do we get goosebumps? | Why do boats made of steel float? | Why does popcorn pop? | Why do we yawn?
Why does a spoon look bent in a glass of water? | Why do batteries lose capacity over time?
Why is Mars red? | Why do we see lightning before we hear thunder?
Why does the Moon always show the same face to Earth? | Why does salt melt ice on roads?
Why do some materials conduct electricity and others don't? | Why do we need to sleep?
Why do birds fly in a V formation? | Why does hot air rise? | Why does a bicycle stay upright when moving?
Why is it colder at the top of a mountain? | Why do soap bubbles show rainbow colors?
Why can some animals regrow lost limbs? | Why do computers use binary?
Why does the pitch of a siren change as it passes? | Why do phones get warm when charging?
Why does fruit turn brown after being cut? | Why do rivers meander? | Why are there different blood types?
""")
STEM_TASKS = [
    "Describe a simple experiment a student could do at home to demonstrate {c}.",
    "What are the main open questions scientists still have about {c}?",
    "Write a short quiz with answers to test understanding of {c}.",
    "How was {c} discovered or developed? Give a brief history.",
    "What everyday technologies depend on {c}?",
]


def _stem(rng: random.Random) -> tuple[str, str]:
    kind = rng.choices(["explain", "pair", "why", "task"], weights=[60, 12, 10, 18])[0]
    if kind == "explain":
        c, a = rng.choice(STEM_CONCEPTS), rng.choice(STEM_AUDIENCES)
        return rng.choice(STEM_FRAMES).format(c=c, a=a), f"{c}|{a}"
    if kind == "pair":
        form = rng.choice(
            ["What is the difference between {p}?", "Compare {p}.", "Explain how {p} differ, with examples."]
        )
        prompt = form.format(p=rng.choice(STEM_PAIRS))
        return prompt, prompt
    if kind == "why":
        q = rng.choice(STEM_WHY)
        return q + rng.choice(
            ["", " Explain the science.", " Keep the answer short.", " Explain it to a child."]
        ), q
    c, task = rng.choice(STEM_CONCEPTS), rng.choice(STEM_TASKS)
    return task.format(c=c), f"{c}|{task}"


# ---------------------------------------------------------------------------------------------------
# Humanities, history and social questions
# ---------------------------------------------------------------------------------------------------

HISTORY_EVENTS = _items("""
the fall of the Western Roman Empire | the invention of the printing press | the Black Death in Europe
the voyages of Zheng He | the Protestant Reformation | the Industrial Revolution in Britain
the French Revolution | the American Civil War | the Meiji Restoration in Japan
the partition of India in 1947 | the Russian Revolution of 1917 | the Great Depression
the construction of the Panama Canal | the end of apartheid in South Africa | the fall of the Berlin Wall
the Apollo 11 Moon landing | the Silk Road trade network | the rise of the Mongol Empire
the Haitian Revolution | the abolition of the Atlantic slave trade | the founding of the United Nations
the independence of Ghana | the Spanish conquest of the Inca Empire
the Ottoman capture of Constantinople | the signing of Magna Carta | the Renaissance in Florence
the Cuban Missile Crisis | the dissolution of the Soviet Union
the civil rights movement in the United States | the unification of Germany in 1871 | the Crusades
the Mali Empire under Mansa Musa | the Cultural Revolution in China | the Marshall Plan
the suffragette movement | the building of the Great Wall of China | the Age of Enlightenment
the decolonization of Africa | the invention of the telegraph | the Dust Bowl | the Treaty of Westphalia
the Irish Famine of the 1840s
""")
HISTORY_ASKS = _items("""
What were the main causes of {e}? | What were the long-term consequences of {e}?
Why is {e} considered important? | Summarize {e} in a few paragraphs for a high school student.
Explain {e} and how it changed everyday life. | What are the different ways historians interpret {e}?
Write a short timeline of {e}. | Which people played key roles in {e}, and what did they do?
""")
HUM_CONCEPTS = _items("""
the social contract | utilitarianism | Kant's categorical imperative | existentialism | stoicism
the trolley problem | cultural relativism | the tragedy of the commons | supply and demand | inflation
opportunity cost | comparative advantage | the separation of powers | federalism | civil disobedience
the placebo effect | cognitive dissonance | confirmation bias | the bystander effect
Maslow's hierarchy of needs | social mobility | globalization | urbanization | nationalism | soft power
the welfare state | the rule of law | propaganda | the free-rider problem | moral hazard
impressionism in painting | the Harlem Renaissance | magical realism in literature | the hero's journey
Romanticism | modernist architecture | the Baroque style in music | epic poetry | satire
the unreliable narrator | oral history | linguistic relativity | the origins of writing
religious tolerance in history | the idea of human rights | populism | game theory in politics
behavioral economics | the division of labor | the concept of a public good
""")
HUM_ASKS = _items("""
Explain {c} with an example. | What is {c}, and why does it matter? | What are the main criticisms of {c}?
Explain {c} in simple terms. | How does {c} show up in everyday life?
Give a short introduction to {c} for a beginner.
""")
HUM_OPEN = _items("""
Should voting be compulsory? | What is the value of learning history at school?
How do festivals and rituals hold communities together? | Can a machine ever create real art?
Why do some languages disappear, and does it matter? | What does it mean to be a good citizen?
How has tourism changed the places people visit? | Should museums return objects taken during colonial times?
What makes a book a classic? | How do maps shape the way we see the world?
Is it better to live in a big city or a small town? | How does advertising influence what we value?
What is the role of satire in a democracy?
Why do people keep diaries and letters, and why do historians love them?
Is it ever right to break the law? Discuss with examples. | What makes a society fair?
How has the smartphone changed the way families spend time together?
Why do people believe conspiracy theories? | What can we learn from studying ancient civilizations?
Should historical monuments to controversial figures be removed? | How do languages change over time?
What is the purpose of art? | Why do empires fall? | How does social media shape our sense of identity?
What role should governments play in protecting the environment?
Is it possible to be completely objective when writing history?
Why do some countries become rich while others stay poor? | How do traditions survive when people migrate?
What makes a good leader? | Is happiness a good goal for a life?
How did the invention of writing change human societies?
What are the pros and cons of a cashless society?
How should we balance free speech with protection from harm? | Why do people vote the way they do?
What can novels teach us that history books cannot?
How does music reflect the time in which it was made? | Why is the study of philosophy still relevant?
How do cities shape the way people live? | What are the ethical issues around genetic testing?
Should rich countries accept more refugees? Give both sides.
""")
HUM_COMPARE = [
    ("the Athenian democracy", "modern democracies"),
    ("Baroque music", "Classical-era music"),
    ("the Tang dynasty", "the Song dynasty"),
    ("the printing press", "the internet"),
    ("Romantic poetry", "modernist poetry"),
    ("Machiavelli", "Confucius"),
    ("Plato", "Aristotle"),
    ("capitalism", "socialism"),
    ("direct democracy", "representative democracy"),
    ("the Renaissance", "the Enlightenment"),
    ("Stoicism", "Epicureanism"),
    ("the Roman Republic", "the Roman Empire"),
    ("Confucianism", "Taoism"),
    ("realism", "impressionism"),
    ("a parliamentary system", "a presidential system"),
    ("Greek tragedy", "Shakespearean tragedy"),
    ("Keynesian economics", "monetarism"),
    ("the Iliad", "the Odyssey"),
    ("Gothic architecture", "Romanesque architecture"),
    ("Hobbes", "Locke"),
    ("the Aztec Empire", "the Inca Empire"),
]


def _humanities(rng: random.Random) -> tuple[str, str]:
    kind = rng.choices(["history", "concept", "open", "compare"], weights=[42, 38, 10, 10])[0]
    if kind == "history":
        prompt = rng.choice(HISTORY_ASKS).format(e=rng.choice(HISTORY_EVENTS))
        return prompt, prompt
    if kind == "concept":
        prompt = rng.choice(HUM_ASKS).format(c=rng.choice(HUM_CONCEPTS))
        return prompt, prompt
    if kind == "open":
        q = rng.choice(HUM_OPEN)
        return q + rng.choice(
            ["", " Answer in about 200 words.", " Give arguments on more than one side."]
        ), q
    a, b = rng.choice(HUM_COMPARE)
    form = rng.choice(
        [
            "Compare and contrast {a} and {b}.",
            "What are the key differences between {a} and {b}?",
            "Explain how {a} and {b} are similar and how they differ.",
        ]
    )
    return form.format(a=a, b=b), form.format(a=a, b=b)


# ---------------------------------------------------------------------------------------------------
# Translation (sentences written for this file)
# ---------------------------------------------------------------------------------------------------

EN_SENTENCES = _items("""
The bakery on the corner opens at six every morning.
Could you tell me where the nearest train station is?
My grandmother grew up in a small village near the sea.
We missed the last bus, so we walked home in the rain.
The museum is closed on Mondays but open late on Thursdays.
I have been learning to play the piano for two years.
Please turn off the lights when you leave the room.
The children built a snowman in the garden this afternoon. | Our flight was delayed because of the storm.
He forgot his umbrella at the restaurant again. | The library has a new section for graphic novels.
Can I pay by card, or do you only accept cash? | She wants to study medicine after finishing school.
The river flooded the fields after a week of heavy rain.
I would like a table for four people at eight o'clock.
Our neighbors have a dog that barks at the mail carrier.
The concert was so loud that my ears were ringing afterwards. | Do you know if this soup contains nuts?
They painted the kitchen yellow to make it feel brighter. | The meeting has been moved to next Tuesday.
If it is sunny tomorrow, we will have a picnic by the lake.
The cat sleeps on the windowsill all afternoon. | I am sorry, but I do not understand the question.
This book was translated into more than thirty languages.
The hotel room had a beautiful view of the mountains. | We need to buy milk, eggs and a loaf of bread.
My brother repairs old bicycles in his spare time.
The exhibition explores how cities have changed over a century.
How long does it take to get to the airport by taxi?
The teacher asked the students to write a short poem.
Every summer, the town organizes a festival with music and dancing.
I lost my keys somewhere between home and the office. | The doctor told him to drink more water and rest.
Our team finished the project two days ahead of schedule.
The market sells fresh fish, vegetables and flowers. | Would you mind opening the window a little?
The new bridge will connect the two halves of the city.
I usually read the news while drinking my morning coffee. | The garden is full of tomatoes this year.
Please send me the document before Friday. | The train to the coast leaves from platform three.
She speaks four languages and is learning a fifth. | It has not rained here for almost two months.
The old castle on the hill is now a hotel. | We celebrated my father's birthday with a big family dinner.
The shop around the corner sells the best ice cream in town.
I think this street is too narrow for such a big truck.
The scientists published their results in a journal last week.
Can you recommend a good book for a long flight? | The price of vegetables has risen since the spring.
He runs five kilometers before breakfast every day. | The children are playing football in the park.
I will call you as soon as I arrive at the hotel. | Our apartment is small, but it has a lovely balcony.
The firefighters rescued a kitten from a tall tree. | Learning a new language takes patience and practice.
The wind was so strong that several trees fell down. | Where can I buy tickets for the boat tour?
My sister works as a nurse at the city hospital. | We are planning to visit our cousins in the autumn.
The recipe calls for two cups of flour and a pinch of salt.
The road is closed because of construction work. | He apologized for arriving late to the interview.
This painting was made more than three hundred years ago. | I prefer tea to coffee in the afternoon.
The students are preparing for their final exams. | The company plans to open a new office next year.
Please keep your passport with you at all times. | The lake freezes every winter, and people skate on it.
My phone battery is almost empty. | The village has only one shop and one school.
Could you speak a little more slowly, please? | They adopted two cats from the animal shelter.
The sunset over the harbor was breathtaking. | We should leave early to avoid the traffic.
Her first novel was published when she was twenty-five. | The bus stop is right in front of the pharmacy.
I need to renew my driving license this month. | The farmers hope for rain before the harvest.
This song reminds me of my childhood. | The bridge was built by engineers from three countries.
Is breakfast included in the price of the room? | Our teacher always encourages us to ask questions.
The city plans to plant ten thousand trees. | I forgot to bring my notebook to class today.
The weather forecast says it will snow tonight. | We watched an old film and ate popcorn.
The waiter recommended the fish of the day. | My uncle keeps bees on the roof of his building.
The post office is next to the town hall.
""")
FOREIGN_SENTENCES: dict[str, list[str]] = {
    "French": [
        "Le marché du samedi est toujours plein de monde.",
        "Nous avons pris le train de nuit pour aller à Marseille.",
        "Ma voisine cultive des tomates sur son balcon.",
        "Il faut réserver une table si vous venez ce soir.",
        "Les enfants ont construit une cabane dans le jardin.",
        "Je cherche une pharmacie ouverte le dimanche.",
        "Le musée propose des visites guidées en anglais.",
        "Il a plu toute la journée, alors nous sommes restés à la maison.",
        "Mon frère apprend à jouer de la guitare depuis l'été dernier.",
        "Pouvez-vous m'indiquer le chemin de la gare ?",
        "La boulangerie ferme à midi le mercredi.",
        "Nous avons fêté l'anniversaire de ma grand-mère au restaurant.",
        "Le chat dort sur le canapé depuis ce matin.",
        "Cette rue était autrefois le centre du village.",
        "Je voudrais échanger ce pull contre une taille plus grande.",
        "Le film commence à vingt heures trente.",
        "Les étudiants préparent un exposé sur l'histoire de la ville.",
        "Il fait trop chaud pour travailler dans le jardin.",
        "Elle a oublié son parapluie dans le bus.",
        "Le pont a été reconstruit après l'inondation.",
        "On a vu des dauphins pendant la traversée.",
        "Le médecin m'a conseillé de marcher tous les jours.",
        "Nous partons en vacances à la montagne la semaine prochaine.",
        "Je n'ai pas encore lu ce livre, mais on m'en a dit du bien.",
        "La réunion est reportée à jeudi matin.",
        "Ce vin vient d'un petit vignoble près de la rivière.",
        "Mes parents habitent dans une vieille maison en pierre.",
        "Le bruit des travaux m'a réveillé très tôt.",
        "Il est interdit de nager quand le drapeau est rouge.",
        "Nous avons besoin de trois bénévoles pour samedi.",
    ],
    "German": [
        "Der Zug nach Hamburg hat heute zwanzig Minuten Verspätung.",
        "Meine Schwester arbeitet seit einem Jahr in einer Buchhandlung.",
        "Wir haben am Wochenende einen langen Spaziergang im Wald gemacht.",
        "Kannst du mir bitte das Salz geben?",
        "Das Museum ist montags geschlossen.",
        "Im Winter friert der See fast jedes Jahr zu.",
        "Ich habe meinen Schlüssel in der Jacke vergessen.",
        "Die Kinder spielen nach der Schule im Hof Fußball.",
        "Unser Nachbar repariert alte Uhren in seiner Werkstatt.",
        "Der Bäcker an der Ecke verkauft das beste Brot der Stadt.",
        "Wegen des Sturms wurden alle Fähren abgesagt.",
        "Ich möchte zwei Fahrkarten nach Leipzig kaufen.",
        "Die Besprechung wurde auf Freitag verschoben.",
        "Mein Großvater erzählt gern Geschichten aus seiner Jugend.",
        "Das Wasser im Fluss ist nach dem Regen sehr hoch.",
        "Wir suchen eine Wohnung mit Balkon in der Nähe des Parks.",
        "Der Arzt sagt, ich soll mehr schlafen.",
        "In diesem Restaurant gibt es auch vegetarische Gerichte.",
        "Die Brücke wird nächstes Jahr renoviert.",
        "Sie lernt Japanisch, weil sie im Sommer nach Tokio reist.",
        "Der Hund unserer Freunde hat Angst vor Gewittern.",
        "Bitte schalten Sie Ihr Handy während der Vorstellung aus.",
        "Wir haben den Garten im Frühling neu angelegt.",
        "Das Konzert war ausverkauft, deshalb sind wir zu Hause geblieben.",
        "Am Bahnhof gibt es einen kleinen Markt mit frischem Obst.",
        "Meine Eltern feiern bald ihren vierzigsten Hochzeitstag.",
        "Die Straße ist wegen Bauarbeiten gesperrt.",
        "Ich trinke morgens lieber Tee als Kaffee.",
        "Der Lehrer hat uns eine schwierige Hausaufgabe gegeben.",
        "Nach dem Essen haben wir noch lange am Tisch gesessen.",
    ],
    "Spanish": [
        "El mercado del barrio abre muy temprano los sábados.",
        "Mi abuela prepara la mejor sopa de lentejas del mundo.",
        "Perdimos el último autobús y tuvimos que volver andando.",
        "¿Sabes a qué hora cierra la biblioteca hoy?",
        "Los niños están jugando en la playa con sus primos.",
        "El tren hacia la costa sale del andén dos.",
        "Este verano queremos visitar los pueblos de la montaña.",
        "Mi hermano trabaja como cocinero en un hotel.",
        "Hace demasiado calor para salir a correr al mediodía.",
        "La reunión se ha cambiado al jueves por la tarde.",
        "He perdido mis gafas en algún lugar de la casa.",
        "El museo tiene una exposición nueva sobre barcos antiguos.",
        "¿Puedo pagar con tarjeta o solo aceptan efectivo?",
        "Las calles del centro se llenan de gente durante las fiestas.",
        "Mi gato duerme todo el día junto a la ventana.",
        "El médico me dijo que bebiera más agua.",
        "Vamos a pintar la cocina de un color más claro.",
        "La tienda de la esquina vende fruta muy fresca.",
        "Mis vecinos tienen un huerto en la azotea.",
        "El puente viejo fue reparado el año pasado.",
        "Llovió tanto que el río se desbordó.",
        "Estoy aprendiendo a tocar la guitarra con vídeos.",
        "Por favor, cierra la puerta cuando salgas.",
        "La película que vimos anoche era muy divertida.",
        "Nuestro equipo ganó el partido en el último minuto.",
        "Quisiera reservar una habitación para dos noches.",
        "La panadería cierra los domingos por la tarde.",
        "Mi prima estudia biología en la universidad.",
        "El viento derribó varios árboles en el parque.",
        "Siempre leo un poco antes de dormir.",
    ],
    "Chinese": [
        "我每天早上骑自行车去上班。",
        "这家餐厅的饺子非常好吃。",
        "明天可能会下雨，记得带伞。",
        "我们周末打算去山里露营。",
        "请问去火车站怎么走？",
        "我的妹妹正在学习弹钢琴。",
        "图书馆星期一不开门。",
        "他把钥匙忘在办公室了。",
        "这座桥是二十年前建成的。",
        "我想买两张去上海的火车票。",
        "老师让我们写一篇关于家乡的作文。",
        "公园里有很多人在跳舞。",
        "这本书已经被翻译成很多种语言。",
        "我们在海边看了日落。",
        "会议改到下周三上午了。",
        "我奶奶住在一个安静的小村子里。",
        "这家商店的水果很新鲜。",
        "天气太热了，我们待在家里吧。",
        "他每天晚上都会跑步半个小时。",
        "你能帮我拍一张照片吗？",
        "这个城市的地铁非常方便。",
        "我们家的猫喜欢在窗台上睡觉。",
        "医生说我应该多喝水，多休息。",
        "今年的春节我们回老家过。",
        "这条路因为施工暂时关闭了。",
        "她会说四种语言。",
        "我们需要买牛奶、鸡蛋和面包。",
        "博物馆里有一个关于古代船只的展览。",
        "昨天晚上的音乐会非常精彩。",
        "请在离开房间时关灯。",
    ],
}
TRANSLATE_TO = [
    'Translate the following sentence into {lang}: "{s}"',
    'How would you say "{s}" in {lang}?',
    'Translate into {lang}, keeping the tone natural: "{s}"',
    "Please translate this English sentence to {lang}:\n{s}",
    'Translate "{s}" into {lang} and explain any word choices that are tricky.',
]
TRANSLATE_FROM = [
    'Translate this {lang} sentence into English: "{s}"',
    'What does "{s}" mean in English?',
    "Translate from {lang} to English: {s}",
    "Please translate the following {lang} text into English and explain the grammar briefly:\n{s}",
]
TARGET_LANGS = ["French", "German", "Spanish", "Chinese"]


def _translation(rng: random.Random) -> str:
    if rng.random() < 0.6:
        n = rng.choices([1, 2, 3], weights=[6, 3, 1])[0]
        s = " ".join(rng.sample(EN_SENTENCES, n))
        lang = rng.choice(TARGET_LANGS)
        if lang == "Chinese" and rng.random() < 0.4:
            lang = rng.choice(["Chinese (Simplified)", "Mandarin Chinese"])
        return rng.choice(TRANSLATE_TO).format(lang=lang, s=s)
    lang = rng.choice(TARGET_LANGS)
    n = rng.choices([1, 2], weights=[7, 3])[0]
    sep = "" if lang == "Chinese" else " "
    s = sep.join(rng.sample(FOREIGN_SENTENCES[lang], n))
    if rng.random() < 0.15:
        other = rng.choice([x for x in TARGET_LANGS if x != lang])
        return f'Translate this {lang} text into {other}: "{s}"'
    return rng.choice(TRANSLATE_FROM).format(lang=lang, s=s)


# ---------------------------------------------------------------------------------------------------
# Summarization of a paragraph written here (or assembled from slots)
# ---------------------------------------------------------------------------------------------------

# Blank lines separate the paragraphs.
PARAGRAPHS = _paragraphs("""
The town of Eastbrook has voted to turn its disused railway line into a walking and cycling path. The line
closed in 1978, and for decades the track bed was overgrown with brambles. Volunteers began clearing a short
section three years ago, and the idea quickly gained support from local schools and businesses. The council
will spend about two million dollars on surfacing, lighting and four small bridges. Supporters say the path
will give children a safe route to school and bring visitors to the town's cafes. Some residents whose
gardens back onto the line worry about noise and privacy, and the council has promised to plant hedges along
the most sensitive stretches.

Honeybees communicate the location of food through a behavior known as the waggle dance. A forager returning
to the hive moves in a figure-eight pattern, waggling her body during the straight middle part. The angle of
that straight run relative to vertical tells other bees the direction of the food relative to the sun. The
length of the waggle run tells them how far away it is. Researchers have shown that bees which watch the
dance fly more directly to the food than bees searching on their own. The dance is one of the few known
examples of symbolic communication in insects.

Small businesses in the region are struggling to find workers with practical trade skills. A survey of 400
employers found that two thirds had left a job unfilled for more than three months. Electricians, plumbers
and welders were the hardest roles to fill. Many owners said young people are rarely encouraged to consider
apprenticeships at school. In response, a group of firms has partnered with the local college to offer paid
training places starting in September. The program will cover tuition and guarantee interviews for everyone
who completes it.

The first public libraries in many countries were funded by wealthy donors who believed that access to books
would improve society. Before that, most collections belonged to universities, monasteries or private
subscribers who paid a yearly fee. Free libraries changed who could read widely, especially workers who
could not afford books of their own. Over time, libraries added newspapers, children's rooms and reference
desks. Today many also lend laptops, offer language classes and provide a quiet, heated place to work.
Librarians argue that these services are more important than ever, even as budgets shrink.

A new study followed 2,000 adults for ten years to see how daily walking affected their health. Participants
who walked at least 7,000 steps a day had a noticeably lower risk of heart disease than those who walked
fewer than 4,000. The benefit appeared to level off above about 10,000 steps. Walking pace also mattered:
brisk walkers did better than slow walkers who covered the same distance. The authors caution that the study
shows an association, not proof of cause and effect. Still, they say the results support simple advice: move
more, and walk a little faster when you can.

Coral reefs cover a tiny fraction of the ocean floor but support about a quarter of all marine species.
Reef-building corals live in partnership with algae that provide them with food through photosynthesis. When
the water becomes too warm, corals expel these algae and turn white, a process called bleaching. Bleached
corals are not dead, but they are starving and can die if high temperatures last too long. Scientists are
testing ways to help reefs recover, including breeding heat-tolerant corals and growing fragments in
underwater nurseries. These efforts help locally, but researchers stress that limiting ocean warming is the
only long-term solution.

After eighteen months of delays, the city's new central bus station opened on Monday. The building replaces
a cramped terminal from the 1960s and has twenty-four departure bays, a waiting hall with free Wi-Fi and
bicycle parking for 300 bikes. Travelers praised the bright design but complained that the signs were
confusing on the first morning. Several regional services also ran late while drivers learned the new
layout. The transport authority said staff would be stationed in the hall for the first two weeks to help
passengers. The final cost was about fifteen percent above budget.

Sourdough bread is made without commercial yeast. Instead, bakers use a starter, a mixture of flour and
water in which wild yeasts and lactic acid bacteria have been allowed to grow. The yeasts produce gas that
makes the dough rise, while the bacteria produce acids that give the bread its tangy flavor. Because these
microbes work slowly, sourdough usually needs a long fermentation, often overnight. Many bakers say the slow
process improves the texture and keeps the bread fresh for longer. A starter can be kept alive for years if
it is fed regularly with fresh flour and water.

The company announced on Thursday that it will move to a four-day working week for all office staff from
next spring. Employees will work the same number of hours over four days or accept a small reduction in
hours with no cut in pay, depending on their team. A six-month trial last year found that sick days fell by
a third and customer satisfaction stayed the same. Managers reported that meetings became shorter and more
focused. Warehouse and delivery staff are not included in the change yet, and their union has asked for
talks. The company said it hopes to find a model that works for them by the end of next year.

Ancient Roman concrete has survived for two thousand years in harbors and buildings, while much modern
concrete cracks within decades. Researchers studying samples from Roman structures found small white lumps
of lime scattered through the material. These lumps were once thought to be a sign of poor mixing. New
evidence suggests they allowed the concrete to repair itself: when water seeped into a crack, it dissolved
some of the lime, which then recrystallized and sealed the gap. Engineers are now testing modern mixtures
that copy this self-healing effect.

Our school's robotics club started five years ago with four students and a borrowed laptop. This year it has
thirty members and reached the national finals for the first time. The team's robot had to sort colored
blocks and stack them in under two minutes. In the final round, a loose wire caused the arm to stop halfway
through the task. The students repaired it in the ten-minute break and finished in fourth place. The club's
teacher said she was prouder of how calmly the team solved the problem than of the result itself.

Migratory birds travel thousands of kilometers each year between breeding and wintering grounds. They find
their way using several cues at once, including the position of the sun, the pattern of stars and the
Earth's magnetic field. Some species also seem to use smell and familiar landmarks such as coastlines and
mountain ranges. Young birds of many species make their first migration alone, which suggests that much of
the route is inherited rather than learned. Light pollution and the loss of stopover habitats such as
wetlands make these journeys more dangerous than in the past.

The price of cocoa has more than doubled in the past year after poor harvests in West Africa. Heavy rains
followed by a long dry spell damaged crops, and a plant disease spread through many older farms. Chocolate
makers have responded by raising prices, making bars smaller and using more fillings such as nuts and
wafers. Farmers have seen only part of the higher prices because many sell through fixed contracts agreed
months earlier. Experts say it could take several years for production to recover, since new cocoa trees
take three to five years to bear fruit.

Volunteers in a coastal village have restored a stone lighthouse that had stood empty for forty years. The
work took four summers and was funded almost entirely by small donations and a yearly music festival.
Inside, the team repaired the spiral staircase, replaced broken windows and cleaned the original brass
fittings. The lighthouse no longer guides ships, but it now houses a small museum about local fishing
families. Visitors can climb to the lantern room on weekends from April to October. The organizers hope the
museum's ticket sales will pay for future maintenance.

Sleep plays a central role in memory. During deep sleep, the brain replays patterns of activity from the
day, which appears to help move new information into long-term storage. Studies in which people learned word
lists or motor skills found that they performed better after a night's sleep than after the same amount of
time awake. Even a short nap can give a measurable boost. Poor sleep, by contrast, makes it harder to
concentrate and to form new memories. Researchers therefore advise students to avoid all-night study
sessions before exams.

A regional airline has begun testing a small electric plane on a forty-minute route between two islands. The
aircraft carries nine passengers and recharges in about half an hour while it is on the ground. Because
electric motors have fewer moving parts than jet or piston engines, the airline expects maintenance costs to
fall sharply. The main limitation is range: current batteries allow only short hops with a safety reserve.
The airline plans to carry paying passengers next year if regulators approve the design. Engineers say
larger electric aircraft will need much better batteries than exist today.

Many people believe that goldfish have a memory of only three seconds, but experiments show otherwise. In
one study, goldfish learned to push a lever to get food and remembered the trick weeks later. Other fish
have been trained to respond to particular sounds or colors at feeding time. Some species of wrasse can even
pass versions of the mirror test, which is often used to study self-recognition. Researchers say the myth
may persist because fish faces show little expression, making it hard for people to read their behavior.

The community garden on Alder Street has become one of the neighborhood's busiest meeting places. It began
eight years ago on an empty lot where a factory had been demolished. Today it has sixty raised beds, a
shared tool shed and a small orchard of apple and plum trees. Each spring the gardeners hold a seedling
swap, and in autumn they cook a meal for the whole street using their harvest. The lot's owner has now
offered to sell the land to the garden's members at a reduced price. They have until the end of the year to
raise the money.

Before clocks were standardized, every town kept its own local time based on the position of the sun. Noon
in one town might be several minutes earlier or later than noon in the next. This caused little trouble when
travel was slow, but the spread of railways made it a serious problem for timetables. Railway companies
began using a single standard time across their networks, and governments later adopted time zones. The
change was controversial at first, with some people insisting on keeping 'God's time' rather than 'railway
time'.

A local theater company is staging a play entirely in the city's old swimming baths, which have been closed
since 2009. The audience sits on the tiled steps of the drained pool while the actors perform on a platform
at the deep end. The play tells the story of three generations of a family who worked at the baths. The
director said the echoing space forced the cast to rethink how they use their voices. Tickets for the first
two weeks sold out within hours, and extra performances have been added in June.

Researchers have developed a paper-thin sensor that can be stuck to the skin like a plaster to measure
sweat. The device contains tiny channels that draw sweat past chemical detectors, which measure salt, sugar
and lactate levels. A small antenna sends the readings to a phone. Athletes could use it to know when to
drink during training, and doctors hope it could one day help monitor certain illnesses without needle
tests. The team says the sensor costs less than a dollar to produce, but it has so far been tested on only
fifty people.

The village of Molenbeek has held a cheese market on its main square every Thursday for more than three
hundred years. Farmers arrive before dawn and stack the round cheeses on wooden sledges. Buyers test the
cheeses by tapping them and tasting small samples drawn with a hollow iron tool. Deals are still sealed with
a series of hand claps. Today the market is also a tourist attraction, and guides explain the traditions in
several languages. Organizers say the challenge is to keep it a real market rather than just a show.

Public transport ridership in the city has returned to pre-pandemic levels for the first time. Figures
released this week show that weekday trips on buses and trams grew by twelve percent compared with last
year. The increase was strongest on routes that received more frequent services and new low-floor vehicles.
Officials also credit a cheaper monthly pass that was introduced in January. However, weekend ridership is
still below its earlier peak, and the authority is considering later evening services to attract more
passengers.

The invention of the shipping container in the 1950s transformed world trade. Before containers, cargo was
loaded piece by piece by large teams of dock workers, and a ship could spend a week or more in port.
Standard steel boxes could be moved directly from ships to trucks and trains with cranes, cutting loading
times to hours. The cost of shipping goods fell dramatically, making it cheaper to manufacture products far
from where they are sold. The change also led to the decline of many old city-center docks and the jobs that
went with them.

A family-run ice cream shop has won a national award for a flavor made with roasted pumpkin and brown
butter. The shop opened twelve years ago in a former bicycle repair workshop. The owners make every batch in
the back room and change the menu weekly depending on what local farms can supply. They say the award has
brought a flood of new customers, with queues stretching down the street on sunny afternoons. Despite the
attention, the family has no plans to open a second shop, saying they want to keep making everything by
hand.

Octopuses are among the most intelligent invertebrates. They can solve puzzles, open jars and escape from
tanks through surprisingly small gaps. Unlike vertebrates, most of their neurons are located in their arms
rather than their central brain, and each arm can respond to touch and taste on its own. Octopuses also
change the color and texture of their skin in a fraction of a second to blend in or to signal. Because most
species live only one or two years, scientists are puzzled about why such complex brains evolved in such
short-lived animals.

The national weather service has issued a warning for strong winds along the northern coast on Saturday.
Gusts of up to 110 kilometers per hour are expected in exposed areas, along with heavy rain in the
afternoon. Ferry operators have already cancelled several crossings, and organizers of an outdoor market
have postponed it by a week. Residents are advised to secure garden furniture and avoid walking near cliffs.
Conditions are expected to improve by Sunday morning, although seas will remain rough for another day.

Learning to play a musical instrument as an adult is easier than many people think. Adults often progress
quickly at first because they can understand theory and practice with focus. The main obstacles are usually
time and self-criticism rather than ability. Teachers recommend short daily practice sessions instead of
long weekly ones, and choosing music you genuinely enjoy. Playing with others, whether in a community band
or with friends, helps keep motivation high. Many adult learners also report that music lessons reduce
stress and give them a welcome break from screens.

The old textile mill on the river has been converted into sixty apartments, a bakery and a shared workspace.
The developers kept the original brick walls, iron columns and the tall chimney, which has become a local
landmark. Solar panels on the roof and a heat pump that draws warmth from the river supply much of the
building's energy. Twenty of the apartments are being offered at below-market rent to local workers. Some
residents had hoped the site would become a park, but most now say the renovation has brought life back to a
neglected part of town.

Tardigrades, also known as water bears, are microscopic animals that can survive extreme conditions. When
their surroundings dry out, they curl into a compact state and almost completely stop their metabolism. In
this state they can survive freezing, intense heat, high radiation and even the vacuum of space for short
periods. When water returns, they revive within hours. Scientists are studying the special proteins that
protect their cells, hoping to find ways to preserve vaccines and other medicines without refrigeration.
""")
FACILITIES = _items("""
swimming pool | public library branch | skate park | community health center | covered market | music school
cycling bridge | youth center | sports hall | concert hall
""")
COMPANY_PLANS = _items("""
close two of its regional offices | move its headquarters to a smaller building
switch its delivery fleet to electric vans | stop sending paper invoices
open a training academy for new staff
merge its sales and support teams | offer every employee a paid volunteering day each month
""")
COMPANY_REASONS = _items("""
costs have risen sharply | more customers now use its app | demand has shifted to other regions
it wants to cut its carbon emissions | it is struggling to recruit staff
""")
SCHOOLS = [
    "Hillcrest Secondary School",
    "St. Brendan's College",
    "Riverside Primary",
    "the Northgate Academy",
]
CAUSES = _items("""
a local animal shelter | new playground equipment | a children's hospital ward | flood relief
the town's food bank
""")
FUNDRAISERS = _items("""
a sponsored walk | a bake sale and concert | a charity football tournament | a second-hand book fair
""")
FINDINGS = _items("""
people who garden regularly report lower stress levels | city trees noticeably cool streets in summer
children who read for pleasure have larger vocabularies | commuters who cycle take fewer sick days
short breaks during lectures improve recall | traffic noise changes the songs of city birds
""")

FACILITY_NOTES = _items("""
The design includes a green roof and rainwater storage.
Neighbors had complained about noise during construction.
The opening was delayed twice because of supply problems.
""")
COMPANY_NOTES_REPORT = _items("""
Staff were told at a meeting on the same day.
The company expects the change to take about a year.
Competitors made similar moves last year.
""")
SCHOOL_NOTES = _items("""
Local shops donated prizes.
Parents helped with transport.
The total beat last year by a wide margin.
""")
STUDY_NOTES = _items("""
The effect was small but consistent.
The effect was strongest in older participants.
Results were similar across income groups.
""")

TEAM_NAMES = _items("""
Harbor City FC | Eastfield Rovers | Kingsbridge United | Millbrook Athletic | Northgate Wanderers
Riverside Rangers | Stonebridge Town | Westport Albion
""")
MATCH_NOTES = _items("""
a penalty early in the second half settled the game.
the visitors had a goal ruled out for offside just before the break.
the home goalkeeper saved two shots in the final ten minutes.
a late header from a substitute made the result safe.
""")
WEATHER_EVENTS = [
    ("heavy snow", "Up to 40 centimeters fell overnight, and several main roads were closed."),
    (
        "a severe thunderstorm",
        "Lightning struck a power station, leaving thousands of homes without electricity.",
    ),
    ("flooding", "The river burst its banks after three days of rain, and low-lying streets were evacuated."),
    ("a heat wave", "Temperatures passed 40 °C, and the city opened air-conditioned public halls."),
    ("strong winds", "Falling trees blocked railway lines, and a crane was damaged at a building site."),
]
FINDS = _items("""
the remains of a wooden boat | a hoard of silver coins | a burial site with pottery and jewelry
the foundations of a large farmhouse | a workshop full of bronze tools | a well-preserved mosaic floor
""")
FIND_NOTES = _items("""
the objects suggest the area was an important trading post.
the quality of the finds surprised the whole team.
it is the most complete site of its kind found in the region.
local volunteers helped to dig through the wet soil.
""")
LAUNCH_NOTES = _items("""
its battery lasts twice as long. | it is made partly from recycled plastic.
it can be repaired with ordinary tools. | it connects to a new companion app.
""")
EXHIBITS = _items("""
paintings by women artists of the nineteenth century | photographs of the city's harbor
maps made by early explorers | posters from the golden age of rail travel | everyday objects from Roman homes
""")
EXHIBIT_NOTES = _items("""
One room recreates an artist's studio. | Audio guides are available in six languages.
A children's trail runs through every gallery. | Several works were restored especially for the show.
""")
WEATHER_OUTLOOKS = ["ease by the weekend", "improve within two days", "stay difficult until Thursday"]
LAUNCH_COMPLAINTS = ["the short warranty", "the high price", "the limited color options", "the confusing app"]
RAIL_WORKS = _items("""
replace an old bridge | upgrade the signaling system | rebuild a tunnel | install overhead electric wires
""")


def _report(rng: random.Random) -> str:
    """A short news report assembled from slots, with numbers in a plausible range for each story."""
    kind = rng.randrange(10)
    person = _person(rng)
    if kind == 0:
        facility = rng.choice(FACILITIES)
        return (
            f"{rng.choice(CITIES)} opened a new {facility} on {_date(rng)}. The project cost "
            f"{_money(rng, 400_000, 20_000_000, 10_000)} and took {rng.randint(5, 30)} months to build. "
            f"Mayor {person} said the {facility} would serve about {rng.randrange(200, 5000, 50)} residents "
            f"a week. {rng.choice(FACILITY_NOTES)} Critics argued that the money could have been spent on "
            f"{rng.choice(['road repairs', 'school buildings', 'public housing', 'more bus services'])}. The "
            f"first {rng.choice(['month', 'two weeks', 'three months'])} will be free of charge, after which "
            "a small fee will apply."
        )
    if kind == 1:
        return (
            f"{rng.choice(COMPANIES)} said on {rng.choice(WEEKDAYS[:5])} that it will "
            f"{rng.choice(COMPANY_PLANS)}. The decision affects roughly {rng.randrange(40, 3000, 10)} "
            f"employees across {rng.randint(2, 12)} sites. A spokesperson, {person}, said the change was "
            f"needed because {rng.choice(COMPANY_REASONS)}. {rng.choice(COMPANY_NOTES_REPORT)} Unions have "
            f"asked for a meeting before the plan takes effect on {_date(rng)}."
        )
    if kind == 2:
        return (
            f"Students at {rng.choice(SCHOOLS)} raised {_money(rng, 800, 25_000, 50)} for "
            f"{rng.choice(CAUSES)} by organizing {rng.choice(FUNDRAISERS)}. The event ran over "
            f"{rng.randint(1, 5)} days and involved more than {rng.randint(15, 200)} volunteers. Teacher "
            f"{person} said the students planned everything themselves, from the budget to the posters. "
            f"{rng.choice(SCHOOL_NOTES)} The school hopes to make the event a yearly tradition."
        )
    if kind == 4:
        home, away = rng.sample(TEAM_NAMES, 2)
        won, lost = rng.randint(1, 5), 0
        lost = rng.randint(0, won - 1)
        return (
            f"{home} beat {away} {won}-{lost} on {rng.choice(WEEKDAYS)} in front of "
            f"{rng.randrange(800, 40_000, 100):,} fans. {_person(rng)} opened the scoring after "
            f"{rng.randint(3, 40)} minutes, and {rng.choice(MATCH_NOTES)} The win lifts {home} to "
            f"{rng.choice(['second', 'third', 'fourth', 'fifth'])} place with {rng.randint(3, 12)} games "
            f"left. Coach {person} praised the team's patience but warned that the next match, away at "
            f"{rng.choice([t for t in TEAM_NAMES if t not in (home, away)])}, would be much harder."
        )
    if kind == 5:
        event = rng.choice(WEATHER_EVENTS)
        return (
            f"{event[0].capitalize()} hit {rng.choice(CITIES)} on {_date(rng)}. {event[1]} About "
            f"{rng.randint(12, 300)} flights were cancelled and {rng.randint(5, 120)} schools closed for the "
            f"day. Emergency services answered more than {rng.randrange(100, 3000, 10)} calls. Officials "
            "urged residents to avoid unnecessary travel, and forecasters expect conditions to "
            f"{rng.choice(WEATHER_OUTLOOKS)}."
        )
    if kind == 6:
        return (
            f"Archaeologists working near {rng.choice(CITIES)} have uncovered {rng.choice(FINDS)} dating "
            f"back about {rng.randrange(600, 5000, 100):,} years. The site was found during construction of "
            f"{rng.choice(['a new road', 'a school gym', 'a housing estate', 'a water pipeline'])}. Project "
            f"lead {person} said {rng.choice(FIND_NOTES)} The objects will be cleaned and studied over the "
            f"next {rng.randint(2, 18)} months before going on display at the regional museum."
        )
    if kind == 7:
        product = rng.choice(PRODUCTS)
        return (
            f"{rng.choice(COMPANIES)} has launched a new version of {product}, priced at "
            f"{_money(rng, 30, 900)}. The company says it is {rng.randint(10, 40)}% lighter than the "
            f"previous model and {rng.choice(LAUNCH_NOTES)} Early reviewers praised the design but "
            "criticized "
            f"{rng.choice(LAUNCH_COMPLAINTS)}. It goes on sale in {rng.randint(3, 30)} countries on "
            f"{_date(rng, (2025,))}."
        )
    if kind == 8:
        return (
            f"A new exhibition at the {rng.choice(CITIES)} City Museum brings together "
            f"{rng.randint(40, 300)} {rng.choice(EXHIBITS)}, many shown in public for the first time. "
            f"Curator {person} spent {rng.randint(2, 6)} years tracking down pieces held by private "
            f"collectors. {rng.choice(EXHIBIT_NOTES)} The exhibition runs until {_date(rng, (2025, 2026))}, "
            f"and tickets cost {_money(rng, 6, 25)}, with free entry on the first Sunday of each month."
        )
    if kind == 9:
        a, b = rng.sample(CITIES, 2)
        return (
            f"Rail services between {a} and {b} will be suspended for {rng.randint(2, 9)} weeks from "
            f"{_date(rng, (2025,))} while engineers {rng.choice(RAIL_WORKS)}. Replacement buses will run "
            f"every {rng.choice([15, 20, 30])} minutes, but journeys will take about {rng.randint(20, 75)} "
            f"minutes longer. The operator, represented by {person}, apologized for the disruption and said "
            f"the work would allow {rng.choice(['faster', 'more frequent', 'longer'])} trains to run from "
            "next year."
        )
    return (
        f"A team of researchers led by {person} has found that {rng.choice(FINDINGS)}. The study followed "
        f"{rng.randrange(120, 20_000, 10)} participants in {rng.choice(CITIES)} over {rng.randint(2, 15)} "
        f"years. {rng.choice(STUDY_NOTES)} The researchers say more work is needed before firm conclusions "
        f"can be drawn, and they plan a larger study starting in {rng.choice(MONTHS)}."
    )


SUMMARY_ASKS = _items("""
Summarize the following paragraph in one sentence. | Summarize this text in three bullet points.
Give a short summary (under 40 words) of the passage below. | Write a TL;DR for this paragraph.
Summarize the key points of this text for a busy reader.
Read the passage and write a two-sentence summary. | Summarize the paragraph below for a ten-year-old.
What is the main idea of this passage? Answer in one or two sentences.
Write a headline and a one-sentence summary for this text.
Condense this paragraph to about half its length.
""")


def _summarization(rng: random.Random) -> tuple[str, str]:
    ask = rng.choice(SUMMARY_ASKS)
    # Hand-written paragraphs are few, so most summaries are of generated reports to keep inputs varied.
    if rng.random() < 0.3:
        idx = rng.randrange(len(PARAGRAPHS))
        text, key = PARAGRAPHS[idx], f"{idx}:{ask}"
    else:
        text = _report(rng)
        key = text
    if rng.random() < 0.5:
        return f"{ask}\n\n{text}", key
    return f"{text}\n\n{ask}", key


# ---------------------------------------------------------------------------------------------------
# Open-domain factual questions
# ---------------------------------------------------------------------------------------------------

COUNTRIES = _items("""
Portugal | Kenya | Japan | Canada | Poland | Chile | Scotland | Vietnam | Georgia | Australia | Ghana
Slovenia | Norway | Peru | Morocco | Spain | New Zealand | Italy | Argentina | Egypt | Thailand | Finland
Mexico | India | Brazil | Turkey | Iceland | South Korea | Nigeria | Greece | Indonesia | Colombia
""")
ELEMENTS = _items("""
gold | silver | iron | sodium | potassium | lead | tin | mercury | copper | helium | neon | zinc | calcium
tungsten | uranium | chlorine | magnesium | carbon | nitrogen | oxygen
""")
BOOKS = _items("""
Pride and Prejudice | One Hundred Years of Solitude | Things Fall Apart | War and Peace | Don Quixote
The Tale of Genji | Moby-Dick | Frankenstein | The Little Prince | Crime and Punishment | Jane Eyre
Dracula | The Odyssey | Les Misérables | The Metamorphosis | Beloved | Madame Bovary | The Divine Comedy
Hamlet | Nineteen Eighty-Four | The Great Gatsby | Wuthering Heights | Anna Karenina | Journey to the West
""")
LANDMARKS = _items("""
Machu Picchu | the Alhambra | Angkor Wat | the Acropolis | Petra | the Sagrada Família | the Taj Mahal
Table Mountain | the Forbidden City | Chichen Itza | Uluru | the Parthenon | Stonehenge | the Colosseum
Neuschwanstein Castle | the Golden Gate Bridge | Mount Kilimanjaro | the Atacama Desert | Lake Baikal
the Great Barrier Reef | Victoria Falls | the Hagia Sophia | Mont-Saint-Michel | the Galápagos Islands
""")
ACRONYMS = _items("""
NASA | UNESCO | DNA | GDP | HTML | LED | GPS | WHO | NATO | CPU | PDF | URL | USB | ATM | LASER | SCUBA
RADAR | SONAR | HTTP | FAQ | AI | VAT | MRI | OPEC | JPEG | ISBN
""")
INVENTIONS = _items("""
the telephone | the light bulb | the printing press | penicillin | the World Wide Web | the steam engine
the bicycle | the airplane | the radio | dynamite | the thermometer | paper | the compass | the microscope
the phonograph | the vaccine against smallpox | the periodic table | the jet engine
""")
ANIMALS = _items("""
blue whale | cheetah | giraffe | honeybee | emperor penguin | axolotl | koala | octopus | elephant
hummingbird | sloth | arctic tern | platypus | camel | red panda | snow leopard | salmon | bat
""")
QA_FREE = _items("""
How many bones are in the adult human body? | What is the longest river in Africa?
What is the largest desert in the world? | How far is the Moon from the Earth?
Which planet has the most moons? | What is the smallest country in the world?
What is the speed of light? | How many players are on a rugby union team? | Which ocean is the deepest?
When did the first person walk on the Moon? | What is the hardest natural substance?
How many time zones does Russia have? | What is the most spoken language in the world?
What is the tallest building in the world? | Who was the first woman to win a Nobel Prize?
How many strings does a standard violin have? | What is the freezing point of water in Fahrenheit?
What is the largest organ of the human body? | Which gas do plants absorb from the air?
How long does light from the Sun take to reach Earth? | What is the currency of Switzerland?
In which year did the Second World War end? | What is the capital of Australia?
Which instrument has 88 keys? | How many hearts does an octopus have?
What is the main ingredient of guacamole? | Who painted the ceiling of the Sistine Chapel?
What is the largest moon of Saturn? | Which is the largest island in the world?
How many sides does a dodecagon have? | What does a seismograph measure?
How many teeth does an adult human have? | Which country has the most islands?
What language has the most native speakers in South America? | How tall is Mount Everest?
What is the chemical formula for table salt? | Which blood type is the universal donor?
What year did the Titanic sink? | Who composed The Four Seasons?
How many chambers does the human heart have? | What is the boiling point of water at sea level in Celsius?
Which bird is known for mimicking human speech? | What is the oldest university still in operation?
How many countries are in the European Union? | What is the coldest place on Earth?
Who developed the theory of general relativity? | What is a group of crows called?
Which vitamin does the body make when exposed to sunlight? | What is the longest bone in the human body?
How many minutes are in a week? | What is the national animal of Scotland? | Where is the Atacama Desert?
What is the square root of 144? | Which continent has the most countries?
What is the fastest land animal? | How old is the universe, approximately?
What is the main language spoken in Brazil? | Who wrote the Iliad?
Which planet is known as the Red Planet? | What is the most abundant gas in Earth's atmosphere?
What do bees make from nectar? | How long is a marathon? | What is the largest mammal on land?
How many Olympic rings are there, and what do they represent? | What is the capital city of Canada?
Which metal is liquid at room temperature? | What is the study of fungi called?
Who discovered penicillin?
""")


def _qa(rng: random.Random) -> tuple[str, str]:
    kind = rng.randrange(12)
    if kind == 0:
        c = rng.choice(COUNTRIES)
        q = rng.choice(
            [
                f"What is the capital of {c}?",
                f"What currency is used in {c}?",
                f"What languages are spoken in {c}?",
                f"What is the population of {c}, roughly?",
                f"What is {c} best known for?",
                f"Which countries border {c}?",
                f"What is the highest mountain in {c}?",
                f"When did {c} become independent or unified?",
            ]
        )
        return q, q
    if kind == 1:
        e = rng.choice(ELEMENTS)
        q = rng.choice(
            [
                f"What is the chemical symbol for {e}?",
                f"What is the atomic number of {e}?",
                f"What is {e} commonly used for?",
                f"Is {e} a metal, a nonmetal or a metalloid?",
            ]
        )
        return q, q
    if kind == 2:
        b = rng.choice(BOOKS)
        q = rng.choice(
            [
                f"Who wrote {b}?",
                f"When was {b} first published?",
                f"What is {b} about? Keep it brief.",
                f"Who is the main character of {b}?",
            ]
        )
        return q, q
    if kind == 3:
        lm = rng.choice(LANDMARKS)
        q = rng.choice(
            [
                f"Where is {lm} located?",
                f"Why is {lm} famous?",
                f"How old is {lm}?",
                f"What is the best time of year to visit {lm}?",
            ]
        )
        return q, q
    if kind == 4:
        a = rng.choice(ACRONYMS)
        q = rng.choice([f"What does {a} stand for?", f"What does the acronym {a} mean?"])
        return q, a
    if kind == 5:
        inv = rng.choice(INVENTIONS)
        q = rng.choice(
            [f"Who invented {inv}?", f"When was {inv} invented?", f"Who is credited with {inv}, and when?"]
        )
        return q, q
    if kind == 6:
        an = rng.choice(ANIMALS)
        q = rng.choice(
            [
                f"How long does a {an} live?",
                f"What does a {an} eat?",
                f"Where do {an}s live in the wild?",
                f"How big does a {an} get?",
                f"What is a surprising fact about the {an}?",
            ]
        )
        return q, q
    q = rng.choice(QA_FREE)
    return q + rng.choice(["", "", " Answer briefly.", " Give a one-sentence answer."]), q


# ---------------------------------------------------------------------------------------------------
# Retrieval-augmented questions over passages about invented entities
# ---------------------------------------------------------------------------------------------------

INVENTED_PLACES = _items("""
Varnholm | Ostrava Ridge | Kellmarsh | Tern Island | Brisco Falls | Marrow Bay | Ullendale | Sankt Oren
Pellucid Lake | Corvin Heights | Amberley Cove | Dunmarrow | Quillon | Westerhaven | Lark Valley | Fennick
Harrowgate Point | Isla Verenda | Mosswick | Calder Springs
""")
RIVERS = _items("""
Orra | Vell | Kasta | Brenning | Loisse | Tamar Gale | Quen | Selby | Ardmore | Nith Vale
""")


BRIDGE_NOTES = _items("""
It carries both road and rail traffic. | Only pedestrians and cyclists may use it today.
A toll was charged until the 1990s.
""")
COMPANY_NOTES = _items("""
It is still family owned. | It was listed on the stock exchange in 2004.
Its first workshop was a converted barn.
""")


def _bridge_passage(rng: random.Random, name: str) -> tuple[str, dict[str, str]]:
    f = {
        "river": rng.choice(RIVERS),
        "year": str(rng.randint(1850, 2015)),
        "length": str(rng.randint(120, 2400)),
        "designer": _person(rng),
        "material": rng.choice(["steel", "stone", "reinforced concrete", "timber and steel"]),
        "place": rng.choice(INVENTED_PLACES),
    }
    text = (
        f"The {name} Bridge crosses the {f['river']} River near {f['place']}. It opened in {f['year']} and "
        f"is {f['length']} meters long. The bridge was designed by the engineer {f['designer']} and is built "
        f"mainly of {f['material']}. {rng.choice(BRIDGE_NOTES)}"
    )
    return text, f


def _company_passage(rng: random.Random, name: str) -> tuple[str, dict[str, str]]:
    f = {
        "year": str(rng.randint(1890, 2019)),
        "founder": _person(rng),
        "place": rng.choice(INVENTED_PLACES),
        "product": rng.choice(
            [
                "bicycle gears",
                "weather instruments",
                "children's books",
                "herbal teas",
                "marine paint",
                "hearing aids",
                "wooden toys",
                "industrial fans",
            ]
        ),
        "staff": str(rng.randint(12, 9000)),
    }
    text = (
        f"{name} was founded in {f['year']} by {f['founder']} in {f['place']}. The company is known for its "
        f"{f['product']} and employs about {f['staff']} people. {rng.choice(COMPANY_NOTES)}"
    )
    return text, f


def _species_passage(rng: random.Random, name: str) -> tuple[str, dict[str, str]]:
    f = {
        "habitat": rng.choice(
            [
                "cloud forests",
                "salt marshes",
                "alpine meadows",
                "coral lagoons",
                "river caves",
                "dry scrubland",
            ]
        ),
        "size": str(rng.randint(3, 90)),
        "food": rng.choice(["seeds", "small insects", "algae", "fallen fruit", "snails", "nectar"]),
        "year": str(rng.randint(1820, 2021)),
        "place": rng.choice(INVENTED_PLACES),
        "status": rng.choice(["common", "vulnerable", "endangered", "rarely seen"]),
    }
    text = (
        f"The {name} is a small animal found in the {f['habitat']} around {f['place']}. Adults reach about "
        f"{f['size']} centimeters in length and feed mainly on {f['food']}. It was first described by "
        f"scientists in {f['year']} and is currently considered {f['status']}."
    )
    return text, f


def _festival_passage(rng: random.Random, name: str) -> tuple[str, dict[str, str]]:
    f = {
        "place": rng.choice(INVENTED_PLACES),
        "month": rng.choice(MONTHS),
        "year": str(rng.randint(1700, 2010)),
        "visitors": f"{rng.randint(2, 300) * 1000:,}",
        "event": rng.choice(
            [
                "a lantern parade",
                "a boat race",
                "a cheese-rolling contest",
                "an all-night concert",
                "a kite competition",
                "a bread-baking contest",
            ]
        ),
    }
    text = (
        f"The {name} Festival takes place every {f['month']} in {f['place']}. It was first held in "
        f"{f['year']} and now attracts around {f['visitors']} visitors. The highlight is {f['event']} on the "
        "final evening."
    )
    return text, f


ENTITY_KINDS: list[
    tuple[Callable[[random.Random, str], tuple[str, dict[str, str]]], list[str], list[str], str]
] = [
    (
        _bridge_passage,
        ["Harlow", "Kettering", "Ashby", "Morrow", "Blackwater", "Linden", "Fairholme", "Corrie"],
        [
            "When did the {n} Bridge open?",
            "Who designed the {n} Bridge?",
            "Which river does the {n} Bridge cross?",
            "How long is the {n} Bridge?",
            "What is the {n} Bridge made of?",
        ],
        "Which opened first, the {a} Bridge or the {b} Bridge? Give both years.",
    ),
    (
        _company_passage,
        [
            "Gallowin Works",
            "Pennick & Sons",
            "Trellis Instruments",
            "Oakum Paints",
            "Vireo Audio",
            "Bramble Press",
            "Kittering Teas",
            "Sable Fans",
        ],
        [
            "Who founded {n}?",
            "When was {n} founded?",
            "What is {n} known for?",
            "How many people does {n} employ?",
            "Where was {n} founded?",
        ],
        "Which company is older, {a} or {b}, and by how many years?",
    ),
    (
        _species_passage,
        [
            "marsh skink",
            "amber-throated warbler",
            "cave loach",
            "velvet shrew",
            "lantern beetle",
            "spotted reed frog",
            "dusky pika",
            "crested newt-lizard",
        ],
        [
            "What does the {n} eat?",
            "Where does the {n} live?",
            "How big is the {n}?",
            "When was the {n} first described?",
            "What is the conservation status of the {n}?",
        ],
        "Which was described by scientists earlier, the {a} or the {b}? Which one is larger?",
    ),
    (
        _festival_passage,
        ["Salt Moon", "Ember", "Green Tide", "Harvest Bell", "Lantern Hill", "Northwind", "Copper Kite"],
        [
            "In which month is the {n} Festival held?",
            "When was the {n} Festival first held?",
            "How many visitors does the {n} Festival attract?",
            "What is the highlight of the {n} Festival?",
        ],
        "Which is older, the {a} Festival or the {b} Festival, and which draws more visitors?",
    ),
]
# One question per entry of PARAGRAPHS (same order), answerable from that paragraph alone.
PARAGRAPH_QUESTIONS = _items("""
How much will the Eastbrook council spend on the new path, and what worries some residents?
What does the angle of the waggle run tell other bees?
Which jobs were the hardest for employers to fill, according to the survey?
Who funded many of the first public libraries, and why?
At roughly what number of daily steps did the health benefit level off?
What causes coral bleaching, and are bleached corals dead?
How many departure bays does the new bus station have, and what did travelers complain about?
What gives sourdough bread its tangy flavor?
What did the company's six-month trial of a shorter week find?
How do the lumps of lime help Roman concrete repair itself?
What went wrong for the robotics team in the final round, and where did they finish?
Which cues do migratory birds use to find their way?
Why have cocoa prices risen, and why have farmers not fully benefited?
How was the restoration of the lighthouse paid for?
What happens in the brain during deep sleep that helps memory?
What is the main limitation of the electric plane being tested?
What evidence shows that goldfish remember things for longer than people think?
What has the owner of the lot offered the community gardeners?
Why did the spread of railways make local time a problem?
Where does the audience sit during the play in the old swimming baths?
What does the skin sensor measure, and how many people has it been tested on?
How are deals sealed at the Molenbeek cheese market?
What reasons do officials give for the rise in public transport ridership?
How did shipping containers change the time ships spent in port?
Which flavor won the ice cream shop its award? | Where are most of an octopus's neurons located?
What are residents advised to do before the strong winds arrive?
How do teachers recommend adult music learners practice? | How is the converted mill supplied with energy?
Why are scientists interested in the proteins of tardigrades?
""")
RAG_INTROS = [
    "Given these passages:\n\n{ps}\n\nAnswer the question: {q}",
    "Use only the information in the documents below to answer.\n\n{ps}\n\nQuestion: {q}",
    "Context:\n{ps}\n\nBased on the context above, {ql} If the answer is not in the context, say so.",
    "Read the passages and answer the question, citing the passage number you used.\n\n{ps}\n\nQuestion: {q}",
    "{ps}\n\nAccording to these passages, {ql}",
]


def _rag(rng: random.Random) -> str:
    if rng.random() < 0.3:
        # Real-world style passages: the answer is in one paragraph, the others are distractors.
        idx = rng.sample(range(len(PARAGRAPHS)), rng.randint(2, 3))
        rng.shuffle(idx)
        target = rng.choice(idx)
        ps = "\n\n".join(f"[{i + 1}] {PARAGRAPHS[j]}" for i, j in enumerate(idx))
        q = PARAGRAPH_QUESTIONS[target]
        return rng.choice(RAG_INTROS).format(ps=ps, q=q, ql=q[0].lower() + q[1:])
    make, names, questions, compare = rng.choice(ENTITY_KINDS)
    chosen = rng.sample(names, rng.randint(2, 4))
    passages = [make(rng, name)[0] for name in chosen]
    kind = rng.random()
    if kind < 0.7:
        q = rng.choice(questions).format(n=rng.choice(chosen))
    elif kind < 0.85:
        a, b = rng.sample(chosen, 2)
        q = compare.format(a=a, b=b)
    else:
        # A question whose answer is absent tests whether the model admits it.
        absent = rng.choice([n for n in names if n not in chosen])
        q = rng.choice(questions).format(n=absent)
    ps = "\n\n".join(f"[{i + 1}] {p}" for i, p in enumerate(passages))
    return rng.choice(RAG_INTROS).format(ps=ps, q=q, ql=q[0].lower() + q[1:])


# ---------------------------------------------------------------------------------------------------
# Assembly
# ---------------------------------------------------------------------------------------------------

Generator = Callable[[random.Random], "str | tuple[str, str]"]
GENERATORS: dict[str, Generator] = {
    "writing": _writing,
    "roleplay": _roleplay,
    "reasoning": _reasoning,
    "math": _math,
    "math_word": _math_word,
    "coding": _coding,
    "extraction": _extraction,
    "stem": _stem,
    "humanities": _humanities,
    "translation": _translation,
    "summarization": _summarization,
    "qa": _qa,
    "rag": _rag,
}


def _category_prompts(category: str, count: int, seed: int) -> list[str]:
    """Draw ``count`` distinct prompts of one category.

    A generator may return ``(prompt, key)``: the key names the substance of the prompt (a topic, a
    paragraph + instruction, ...) so that rewordings of the same request are not drawn twice.
    """
    # A string seed is hashed with SHA-512 by ``random``, so it is stable across runs and platforms.
    rng = random.Random(f"specexport-prompts:{seed}:{category}")
    gen = GENERATORS[category]
    out: list[str] = []
    seen: set[str] = set()
    attempts = 0
    while len(out) < count:
        attempts += 1
        if attempts > 500 * count + 1000:
            raise RuntimeError(
                f"category {category!r} cannot produce {count} distinct prompts (got {len(out)})"
            )
        res = gen(rng)
        prompt, key = (res, res) if isinstance(res, str) else res
        prompt = prompt.strip()
        if prompt in seen or ("key:" + key) in seen:
            continue
        seen.update((prompt, "key:" + key))
        out.append(prompt)
    return out


def build_prompts(n: int | None = None, seed: int = 0) -> list[dict]:
    """Return ``n`` prompts (default ``13 * 340``) spread evenly over :data:`CATEGORIES`, in a shuffled order.

    Each item is ``{"id": "<category>-<index>", "category": ..., "prompt": ...}``. The result depends only
    on ``(n, seed)``; for a fixed seed, a category's first k prompts are the same whatever ``n`` is.
    """
    if n is None:
        n = DEFAULT_PER_CATEGORY * len(CATEGORIES)
    if n < 0:
        raise ValueError("n must be non-negative")
    base, extra = divmod(n, len(CATEGORIES))
    items: list[dict] = []
    seen: set[str] = set()
    for ci, category in enumerate(CATEGORIES):
        count = base + (1 if ci < extra else 0)
        for i, prompt in enumerate(_category_prompts(category, count, seed)):
            if prompt in seen:  # the same text from two categories would bias the data; never expected
                raise RuntimeError(f"duplicate prompt across categories: {prompt[:60]!r}")
            seen.add(prompt)
            items.append({"id": f"{category}-{i:04d}", "category": category, "prompt": prompt})
    # Mixing categories makes every shard of generated data (and any prefix of the file) representative.
    random.Random(f"specexport-prompts:{seed}:order").shuffle(items)
    return items


def write_jsonl(items: Sequence[dict], path: str | Path) -> Path:
    """Write prompt dicts as UTF-8 JSON lines and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for item in items:
            fh.write(json.dumps(item, ensure_ascii=False) + "\n")
    return path


def main(argv: Sequence[str] | None = None) -> None:
    """CLI: write the training prompt set as JSONL and print the count per category."""
    ap = argparse.ArgumentParser(description="Write the self-distillation training prompts as JSONL.")
    ap.add_argument("--out", required=True, help="output .jsonl path")
    ap.add_argument(
        "--n",
        type=int,
        default=None,
        help=f"number of prompts (default {DEFAULT_PER_CATEGORY * len(CATEGORIES)})",
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    items = build_prompts(args.n, args.seed)
    path = write_jsonl(items, args.out)
    counts: dict[str, int] = {}
    for item in items:
        counts[item["category"]] = counts.get(item["category"], 0) + 1
    print(f"wrote {len(items)} prompts to {path} ({path.stat().st_size / 1e6:.2f} MB)")
    for category in CATEGORIES:
        print(f"  {category:14s} {counts.get(category, 0)}")


if __name__ == "__main__":
    main()

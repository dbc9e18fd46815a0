"""Word lists shared by the memory gate and keyphrase extraction (hand-written for chat text)."""
from __future__ import annotations

import re

WORD_RE = re.compile(r"[A-Za-z][A-Za-z0-9'’\-]*|\d+(?:[.,:/]\d+)*")

# function words: carry no topic on their own
FUNCTION_WORDS = frozenset("""
a an the and or but if so as at by for from in into of off on onto out over to up with about
above after again against all am any are aren't be because been before being below between both
can can't cannot could couldn't did didn't do does doesn't doing don't down during each few further
had hadn't has hasn't have haven't having he he'd he'll he's her here here's hers herself him himself
his how how's i i'd i'll i'm i've is isn't it it's its itself let's me more most mustn't my myself
no nor not only other ought our ours ourselves own same shan't she she'd she'll she's should
shouldn't some such than that that's their theirs them themselves then there there's these they
they'd they'll they're they've this those through too under until very was wasn't we we'd we'll
we're we've were weren't what what's when when's where where's which while who who's whom why
why's will won't would wouldn't you you'd you'll you're you've your yours yourself yourselves
just also even still yet ever never always often sometimes maybe perhaps quite rather really
much many lot lots bit kind sort thing things stuff something anything everything nothing
someone anyone everyone one ones well oh ah um uh hmm like got get gets getting go goes going
gone went come came make made take took know knew think thought feel felt see saw seen say said
tell told want wanted need needed try tried look looking seem seems way ways now today yesterday
tomorrow tonight soon later ago time times day days week weeks month months year years lately
recently yeah yes yep nope ok okay sure right totally definitely absolutely actually honestly
literally basically pretty super especially
""".split())

# words that make up greetings, thanks, laughter, agreement and farewells
PHATIC_WORDS = frozenset("""
hey hi hello hiya howdy yo heya greetings morning afternoon evening night good great nice cool
awesome amazing wonderful fantastic lovely glad happy thanks thank thx ty appreciate appreciated
welcome bye goodbye cya ya see later care take talk soon catch chat haha hahaha hehe lol lmao rofl
wow omg oh ah aw aww yay woohoo congrats congratulations cheers sounds sound fun love that's so
too same agreed agree true exactly indeed sure ok okay yeah yes yep definitely absolutely totally
of course you your again doing been how what's up going well fine alright all right really
nice-to-meet meet meeting to too be it is was this that me i'm am hope hear hearing
""".split())

GREETING_MARKERS = frozenset("""
hey hi hello hiya howdy yo heya thanks thank thx ty bye goodbye cya congrats congratulations
cheers welcome
""".split())

LAUGH_RE = re.compile(r"^(?:(?:ha|he|hi|ja){2,}h?|lo+l|lmao+|rofl|xd+|a*w+|o+h+|y+a+y+)$")

FIRST_PERSON = frozenset("i i'm i've i'd i'll my mine me myself".split())
FIRST_PERSON_PLURAL = frozenset("we we're we've we'd we'll our ours".split())

# verbs/nouns that mark preferences, plans, goals, life events and possessions
SIGNAL_WORDS = frozenset("""
love loves loved like likes liked enjoy enjoyed enjoying prefer prefers preferred favorite
favourite hate hated dislike want wanted wish hope hoping plan plans planning planned goal goals
dream dreams decided decide aim aiming intend going started start starting began begin finished
finish working work job career study studying learning learned learnt moved move moving bought buy
adopted adopt married marry wedding divorced pregnant born graduated graduate joined join quit
volunteer volunteering visited visit visiting traveled travelled trip vacation hobby hobbies class
classes course school college university kids kid son daughter husband wife partner mom dad mother
father sister brother friend friends family dog cat pet birthday allergic diet vegan party parties
concert festival camping hiking painting paint game games team book books novel movie movies show
race marathon competition contest project business store shop house home apartment car garden music
band guitar piano song songs recipe cooking baking charity fundraiser conference workshop
""".split())

MONTHS = frozenset("""
january february march april june july august september october november december jan feb mar
apr jun jul aug sep sept oct nov dec monday tuesday wednesday thursday friday saturday sunday
""".split())

TEMPORAL_WORDS = frozenset("""
yesterday tomorrow tonight today weekend last next ago week weeks month months year years
""".split())


def words(text: str) -> list[str]:
    """Word and number tokens of ``text`` (original case, curly apostrophes normalized)."""
    return [w.replace("’", "'") for w in WORD_RE.findall(text or "")]

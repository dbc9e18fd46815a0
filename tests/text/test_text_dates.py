"""Date mentions resolved against the session time (memlib.text.dates): relative, absolute, habitual."""
from datetime import datetime, timezone

from memlib.text.dates import Granularity, resolve_dates, rewrite_relative

A = datetime(2023, 5, 8, 13, 56, tzinfo=timezone.utc)


def _one(text):
    ms = resolve_dates(text, A)
    assert len(ms) == 1, ms
    return ms[0]


def test_relative_expressions_resolve_against_anchor():
    assert _one("I went there yesterday").resolved.date().isoformat() == "2023-05-07"
    assert _one("two days ago it rained").resolved.date().isoformat() == "2023-05-06"
    assert _one("last Saturday we ran").resolved.date().isoformat() == "2023-05-06"
    m = _one("we will move next month")
    assert (m.resolved.year, m.resolved.month, m.granularity) == (2023, 6, Granularity.MONTH)
    m = _one("I went camping last week")
    assert m.granularity is Granularity.WEEK and m.resolved.date().isoformat() == "2023-05-01"


def test_absolute_expressions():
    m = _one("I graduated in 2022")
    assert m.resolved.year == 2022 and m.granularity is Granularity.YEAR and not m.relative
    assert _one("the show is on 8 May").resolved.date().isoformat() == "2023-05-08"


def test_future_tense_prefers_future():
    assert _one("I'm going to the beach on Saturday").resolved.date().isoformat() == "2023-05-13"


def test_rewrite_relative():
    assert rewrite_relative("Yesterday I went out.", A) == "On 7 May 2023 I went out."
    assert rewrite_relative("I graduated in 2022.", A) == "I graduated in 2022."
    assert resolve_dates("no dates here at all", A) == []


def test_a_weekday_said_of_a_habit_is_not_one_day():
    """'every Sunday' or 'on Saturday mornings' is a habit: no date, the text is left as written
    (it used to read 'Every on 14 May 2023' and 'on 13 May 2023 mornings')."""
    for text in ("Every Sunday I call my mom.", "I go hiking on Saturday mornings.",
                 "She visits each Friday night.", "every other Tuesday we play chess",
                 "Saturday nights are for games", "I usually run on Sunday evenings.",
                 "the market is held every Wednesday and Saturday"):
        assert resolve_dates(text, A) == [], text
        assert rewrite_relative(text, A) == text
    # one day stays one day, the part of the day included
    assert _one("We met on Saturday.").resolved.date().isoformat() == "2023-05-06"
    assert _one("it rained all Saturday").resolved.date().isoformat() == "2023-05-06"
    assert rewrite_relative("On Saturday morning we went out.", A) == "On 6 May 2023 morning we went out."
    assert _one("every week, and last Saturday too").resolved.date().isoformat() == "2023-05-06"


def test_dateparser_is_called_by_one_thread_at_a_time_and_resolves_as_alone():
    """dateparser is not thread-safe, and a run in the driver builds tenants on threads: its parser
    runs under a lock (a spy on the real parser, widened by a pause, never sees two calls at once),
    and each thread's dates are those a lone call resolves."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from dateparser.date import DateDataParser

    texts = [f"{n} days ago we met" for n in range(2, 14)]
    alone = {t: _one(t).resolved for t in texts[::2]}
    real, busy, most, guard = DateDataParser.get_date_data, [0], [0], threading.Lock()

    def spy(self, *args, **kwargs):
        with guard:
            busy[0] += 1
            most[0] = max(most[0], busy[0])
        time.sleep(0.02)
        try:
            return real(self, *args, **kwargs)
        finally:
            with guard:
                busy[0] -= 1

    DateDataParser.get_date_data = spy
    try:
        with ThreadPoolExecutor(4) as pool:
            got = dict(zip(texts, pool.map(lambda t: _one(t).resolved, texts)))
    finally:
        DateDataParser.get_date_data = real
    assert most[0] == 1, most
    assert {t: got[t] for t in alone} == alone

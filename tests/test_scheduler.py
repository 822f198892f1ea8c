"""The scheduler on its own, without a model: its settings, the rows a StepPlan holds (prompt chunks under the
prefill budget, whole prompts, drafts, who gets logits), its KV accounting (admission, _kv_after, what _fit frees
and in which order) and what it says when a request fails. A step is run the way the executor runs it, on made-up
logits that favour token 1 (every draft, of token 2, is rejected), so each decoding step adds one row of KV."""

from __future__ import annotations

import itertools
import math
import re

import pytest
import torch

from leapdecode.controller import StepCost
from leapdecode.drafters.base import Draft, Drafter
from leapdecode.drafters.none import NoDrafter
from leapdecode.engine.request import Request
from leapdecode.engine.scheduler import Scheduler, SchedulerConfig
from leapdecode.errors import LeapDecodeError
from leapdecode.kv.slots import SequenceKV, room_for
from leapdecode.params import DraftConfig, RequestParams

FIXED = DraftConfig(draft_length=2, max_draft_length=3, adaptive_draft_length=False)  # k = 2 at every step
PLAIN = DraftConfig()  # adaptive: nothing measured, no drafts
SEQUENCE_OPTIONS = dict(eos_ids=set(), context_length=512)
REQUEST_IDS = itertools.count()  # ids unique across a test's requests, as the engine's are
BAD_START, BAD_PROPOSE = 77, 66  # a prompt starting with one of these makes its drafter raise there


class Twos(Drafter):
    """Proposes k tokens 2; raises in start or propose for a prompt that starts with BAD_START or BAD_PROPOSE."""

    def start(self, prompt_ids, sampling):
        if prompt_ids[0] == BAD_START:
            raise RuntimeError("planted start fault")

    def propose(self, context, k):
        if context[0] == BAD_PROPOSE:
            raise RuntimeError("planted propose fault")
        return Draft([2] * k)


class Linear(StepCost):
    """Made-up step costs: R seconds for R rows (exact, so limits can be hit on the dot)."""

    def __init__(self):
        super().__init__()
        self.seconds = {1: 1.0}

    def __call__(self, rows):
        return float(rows)


class Spiked(Linear):
    """Linear, but one noisy measurement: 39 rows measured dear."""

    def __call__(self, rows):
        return 1000.0 if rows == 39 else float(rows)


SARATHI = dict(max_decode_slowdown=2.0)  # a reading step at most twice a decode-only one


def make(kv_tokens=10_000, draft=FIXED, whole_prompts=False, **config) -> Scheduler:
    return Scheduler(
        SchedulerConfig(**config),
        draft,
        Twos,
        SEQUENCE_OPTIONS,
        layers=1,
        kv_tokens=kv_tokens,
        whole_prompts=whole_prompts,
    )


def add(scheduler: Scheduler, *prompts) -> list[Request]:
    requests = [Request(next(REQUEST_IDS), list(p), RequestParams(max_new_tokens=50), None, None) for p in prompts]
    scheduler.incoming.extend(requests)
    return requests


def holding(rows: int, *more: int) -> SequenceKV:
    """A slot with `rows` rows written (capacity room_for(rows)), then `more` rows after them in later writes."""
    kv, length = SequenceKV(1), 0
    for n in (rows, *more):
        kv.write(0, length, torch.zeros(1, n, 1), torch.zeros(1, n, 1))
        length += n
    return kv


def run(scheduler: Scheduler, plan) -> None:
    """What the executor does with a plan, without a model."""
    for s in plan.segments:
        s.kv.write(0, s.past, torch.zeros(1, s.n, 1), torch.zeros(1, s.n, 1))
    for entry in plan.logits:
        request = entry.request
        if entry.read_to_end:
            scheduler.prefix_cache.insert(request.prompt_ids, request.kv)
        logits = torch.zeros(entry.rows, 8)
        logits[:, 1] = 1.0
        _, rejected = request.seq.accept(logits)
        request.kv.truncate(request.kv.length - rejected)


def step(scheduler: Scheduler):
    plan = scheduler.schedule()
    if plan is not None:
        run(scheduler, plan)
    return plan


# ---- settings ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(max_batch_tokens=0), "max_batch_tokens must be a positive integer, got 0"),
        (dict(max_sequences=2.0), "max_sequences must be a positive integer, got 2.0"),
        (dict(prefix_cache_tokens=-1), "prefix_cache_tokens must be >= 0, got -1"),
        (dict(prefix_cache_tokens=1.5), "prefix_cache_tokens must be >= 0, got 1.5"),
        (dict(prefix_cache_tokens=True), "prefix_cache_tokens must be >= 0, got True"),
        (dict(max_decode_slowdown=0.99), "max_decode_slowdown must be >= 1, got 0.99"),
        (dict(kv_cache_bytes=0), "kv_cache_bytes must be a positive integer, got 0"),
        (dict(kv_cache_bytes=2.0), "kv_cache_bytes must be a positive integer, got 2.0"),
    ],
)
def test_a_bad_setting_is_refused_in_its_own_words(options, message):
    with pytest.raises(LeapDecodeError, match=f"^{re.escape(message)}$"):
        SchedulerConfig(**options)


def test_the_smallest_settings_are_allowed():
    for options in (
        dict(max_batch_tokens=1, max_sequences=1, prefix_cache_tokens=0, max_decode_slowdown=1, kv_cache_bytes=1),
        dict(max_decode_slowdown=1.5),
    ):
        config = SchedulerConfig(**options)
        assert all(getattr(config, k) == v for k, v in options.items())


def test_serve_and_bench_batch_take_the_slowdown_bound_and_default_to_none(capsys):
    """`--max-decode-slowdown` reaches the engine's settings (inf by default, as SchedulerConfig's); a value that is
    not a number is refused by the parser (exit 2, one line)."""
    from leapdecode.cli import build_parser
    from leapdecode.serve.cli import engine_options

    parser = build_parser()
    assert (
        engine_options(parser.parse_args(["serve"]))["max_decode_slowdown"]
        == math.inf
        == SchedulerConfig().max_decode_slowdown
    )
    assert engine_options(parser.parse_args(["serve", "--max-decode-slowdown", "2"]))["max_decode_slowdown"] == 2.0
    assert parser.parse_args(["bench-batch", "--out", "o", "--max-decode-slowdown", "3.5"]).max_decode_slowdown == 3.5
    with pytest.raises(SystemExit) as exit:
        parser.parse_args(["serve", "--max-decode-slowdown", "fast"])
    assert exit.value.code == 2 and "expected a number, got 'fast'" in capsys.readouterr().err


def test_the_prefix_cache_gets_at_most_half_the_kv_rows_and_none_for_whole_prompts():
    default = Scheduler(SchedulerConfig(), FIXED, Twos, SEQUENCE_OPTIONS, layers=1, kv_tokens=159)
    assert default.whole_prompts is False and default.prefix_cache.max_tokens == 79  # whole rows: 159 // 2
    assert make(kv_tokens=159, prefix_cache_tokens=40).prefix_cache.max_tokens == 40
    assert make(kv_tokens=159, whole_prompts=True).prefix_cache.max_tokens == 0


# ---- admission --------------------------------------------------------------------------------------------------


def test_nothing_to_run_plans_nothing_and_the_peak_starts_at_zero():
    scheduler = make()
    assert scheduler.schedule() is None
    scheduler.note_peak()
    assert scheduler.peak_kv_tokens == 0
    add(scheduler, [5, 6, 7])
    step(scheduler)
    scheduler.note_peak()
    assert scheduler.peak_kv_tokens == room_for(3)  # the slot; a 3-token prompt leaves no block in the cache


def test_a_removed_request_leaves_whichever_queue_holds_it():
    scheduler = make(max_sequences=1)
    running, waiting = add(scheduler, [5, 6, 7], [8, 9])
    step(scheduler)
    assert scheduler.running == [running] and list(scheduler.waiting) == [waiting]
    scheduler.remove(waiting)  # a cancel before admission
    assert scheduler.running == [running] and not scheduler.waiting
    scheduler.remove(running)
    assert not scheduler.running and scheduler.schedule() is None


def test_admissions_are_counted_and_the_newest_is_preempted_first():
    scheduler = make(kv_tokens=1_000, prefix_cache_tokens=0)
    requests = add(scheduler, [5, 6, 7], [8, 9], [10])
    step(scheduler)
    assert [r.admitted for r in requests] == [1, 2, 3]
    scheduler.kv_tokens = 67 + 66 + 65 - 1  # the budget tightens: one row short of the three slots (room_for 3, 2, 1)
    plan = scheduler.schedule()
    assert scheduler.preemptions == 1 and list(scheduler.waiting) == [requests[2]]
    assert requests[2].kv is None and requests[2].reading == requests[2].seq.context  # reads its context again
    assert [e.request for e in plan.logits] == requests[:2]
    run(scheduler, plan)
    scheduler.kv_tokens = 1_000
    step(scheduler)
    assert requests[2].admitted == 4 and scheduler.running == requests


@pytest.mark.parametrize(
    "kv_tokens, prompt, whole, admitted",
    [
        (138, 3, False, True),  # 67 rows held + room_for(7): its first chunk (3) and a full draft (3 + 1)
        (137, 3, False, False),
        (151, 40, False, True),  # 67 + room_for(16 + 4): a long prompt's first chunk is MIN_CHUNK rows
        (150, 40, False, False),
        (175, 40, True, True),  # 67 + room_for(40 + 4): a whole prompt is read at once
        (174, 40, True, False),
    ],
)
def test_a_new_request_waits_until_its_first_step_fits_beside_the_running_ones(kv_tokens, prompt, whole, admitted):
    scheduler = make(kv_tokens=kv_tokens, prefix_cache_tokens=0, whole_prompts=whole)
    (first,) = add(scheduler, [5, 6, 7])
    step(scheduler)
    assert scheduler.kv_in_use == room_for(3) == 67
    (second,) = add(scheduler, range(10, 10 + prompt))
    scheduler._admit()
    assert scheduler.running == ([first, second] if admitted else [first])
    assert list(scheduler.waiting) == ([] if admitted else [second])


def test_a_drafter_that_fails_to_start_fails_its_request_alone_and_the_next_one_is_admitted():
    scheduler = make()
    bad, good = add(scheduler, [BAD_START, 5, 6], [5, 6, 7])
    plan = scheduler.schedule()
    assert plan.failed == [(bad, "its drafter failed: RuntimeError: planted start fault")]
    assert scheduler.running == [good] and [e.request for e in plan.logits] == [good]


def test_each_sequence_has_the_configured_draft_lengths_and_plans_no_k_of_its_own():
    """The batch plan reads a sequence's acceptance, never its single-request k: its controller keeps no step costs,
    so updating it stays cheap (with the engine's costs it re-planned k for every sequence at every step)."""
    scheduler = make(draft=FIXED)
    (request,) = add(scheduler, [5, 6, 7])
    scheduler.schedule()
    controller = request.seq.controller
    assert (controller.k, controller.k_max, controller.adaptive) == (2, 3, False)
    scheduler = make(draft=PLAIN)
    (request,) = add(scheduler, [5, 6, 7])
    scheduler.costs.record(1, 1.0)
    step(scheduler)
    controller = request.seq.controller
    assert controller.costs is not scheduler.costs and not controller.costs
    k = controller.k
    step(scheduler)
    assert controller.k == k  # no plan of its own


def test_fixed_draft_lengths_stay_within_the_row_budget():
    """k = 2 for each of four streams would be 12 rows; under max_batch_tokens every stream keeps its row and the
    drafts fill the rest, in order."""
    scheduler = make(draft=FIXED, max_batch_tokens=6)
    add(scheduler, [5], [6], [7], [8])
    step(scheduler)  # the four prompts, one row each
    plan = step(scheduler)
    assert [s.n for s in plan.segments] == [3, 1, 1, 1]
    scheduler.config = SchedulerConfig(max_batch_tokens=9)
    assert [s.n for s in step(scheduler).segments] == [3, 3, 2, 1]


def test_a_prompt_advances_even_when_streams_could_fill_every_row():
    """Two streams and a row budget of 2: a prompt being read still gets a row per step (half the budget; at
    most MIN_CHUNK), so it is read and decodes instead of waiting for the streams to end."""
    scheduler = make(draft=PLAIN, max_batch_tokens=2)
    streams = add(scheduler, [5], [6])
    step(scheduler)
    (reading,) = add(scheduler, [10, 11, 12])
    plans = [step(scheduler) for _ in range(4)]
    assert [[(s.kv is reading.kv, s.n) for s in p.segments] for p in plans[:3]] == [[(False, 1), (True, 1)]] * 3
    assert reading.decoding and all(r.decoding for r in streams)
    assert len(plans[3].segments) == 2  # then streams take turns, the read request among them


# ---- the plan ---------------------------------------------------------------------------------------------------


def test_drafts_wait_while_a_prompt_is_read_and_are_counted_once_it_is():
    scheduler = make(draft=FIXED, max_batch_tokens=32)
    (streaming,) = add(scheduler, [5, 6, 7])
    step(scheduler)
    (reading,) = add(scheduler, range(10, 50))
    plan = step(scheduler)
    assert [(s.kv, s.n) for s in plan.segments] == [(streaming.kv, 1), (reading.kv, 31)]
    assert plan.drafted == 0 and not plan.decode_only
    step(scheduler)  # the rest of the prompt (9 rows)
    plan = step(scheduler)
    assert [s.n for s in plan.segments] == [3, 3] and plan.drafted == 4 and plan.decode_only


def test_streams_beyond_the_row_budget_take_turns():
    scheduler = make(draft=PLAIN, max_batch_tokens=3)
    requests = add(scheduler, [5], [6], [7])
    step(scheduler)  # the three prompts, one row each
    scheduler.config = SchedulerConfig(max_batch_tokens=2)
    served = [[requests.index(e.request) for e in step(scheduler).logits] for _ in range(3)]
    assert served == [[0, 1], [2, 0], [1, 2]]


class Stairs(StepCost):
    """Made-up step costs in stairs of 6 rows (a product's row tiles): 1-6 rows 6 s, 7-12 rows 12 s."""

    def __init__(self, rows=range(1, 13)):
        super().__init__()
        for r in rows:
            self.record(r, 6.0 * ((r + 5) // 6))


def test_plain_steps_serve_as_many_streams_as_give_the_most_tokens_a_second_in_turns():
    """7 streams: a 7-row step costs 12 s (0.58 tokens/s), a 6-row one 6 s (1): six are served a step, in turns, and
    the gate is told the load of all seven. Counts past the stair's edge are all served."""
    scheduler = make(draft=PLAIN)
    requests = add(scheduler, *([5 + i] for i in range(7)))
    step(scheduler)  # the seven prompts
    scheduler.costs, scheduler.gate.choose = Stairs(), lambda n: 0  # the gate runs plain steps
    served = [[requests.index(e.request) for e in step(scheduler).logits] for _ in range(7)]
    assert all(len(s) == 6 for s in served) and [sum(i in s for s in served) for i in range(7)] == [6] * 7
    assert scheduler.schedule().streams == 7
    scheduler.costs = Stairs(range(1, 8))  # 7 and 12 rows cost alike, but 12 is not measured: 6 of 7 still pay
    assert scheduler._streams_served(7) == 6 and scheduler._streams_served(12) == 12
    scheduler.costs = Stairs(range(7, 13))  # fewer than 7 never measured: nothing to weigh
    assert scheduler._streams_served(7) == 7


def test_a_drafter_that_never_drafts_gets_no_draft_rows_and_its_streams_take_turns():
    """Drafter "none" under a gate that lets drafts through: the planner gives it no rows (it would propose nothing),
    so its steps are plain and serve the streams that give the most tokens a second."""
    scheduler = Scheduler(SchedulerConfig(), PLAIN, NoDrafter, SEQUENCE_OPTIONS, layers=1, kv_tokens=10_000)
    add(scheduler, *([5 + i] for i in range(7)))
    step(scheduler)
    scheduler.costs, scheduler.gate.choose = Stairs(), lambda n: 1
    assert scheduler._draft_lengths([r for r in scheduler.running], 256) == [0] * 7
    assert len(scheduler.schedule().logits) == 6


def test_drafts_must_beat_the_plain_step_that_serves_fewer_streams():
    """7 streams, acceptance 0.6: drafting 5 rows into the 12-row stair yields 10 tokens in 12 s (0.83/s), more than
    all 7 plain (0.58/s) but less than 6 plain in 6 s (1/s): the plan drafts nothing and 6 are served."""
    scheduler = make(draft=PLAIN)
    add(scheduler, *([5 + i] for i in range(7)))
    step(scheduler)
    scheduler.costs, scheduler.gate.choose = Stairs(range(1, 25)), lambda n: 1  # 13-18 rows 18 s, 19-24 24 s
    assert scheduler._draft_lengths(list(scheduler.running), 256) == [0] * 7
    assert len(scheduler.schedule().logits) == 6
    scheduler.costs = Stairs(range(7, 25))  # fewer streams never measured: drafting beats 7 plain
    assert sum(scheduler._draft_lengths(list(scheduler.running), 256)) == 5


def test_drafts_the_costs_rule_out_are_verified_once_every_reprobe_steps():
    """One stream, two rows timed once three times dearer than one (a slow moment; nothing but a draft visits two
    rows again): the plan drafts nothing where the gate asks for drafts, and after REPROBE_STEPS such steps one step
    drafts k_init anyway, so that the estimate gets timed again; then the estimates rule again."""
    from leapdecode.controller import REPROBE_STEPS

    scheduler = make(draft=PLAIN)
    add(scheduler, [5])
    step(scheduler)
    scheduler.costs, scheduler.gate.choose = StepCost(), lambda n: 1
    scheduler.costs.seconds = {1: 1.0, 2: 3.0}
    running = list(scheduler.running)
    k_init = running[0].seq.controller.k_init
    for _ in range(REPROBE_STEPS):
        assert scheduler._draft_lengths(running, 256) == [0]
    # k_init, within the rows the planner explores: up to twice the largest size measured (2 rows)
    assert scheduler._draft_lengths(running, 256) == [min(k_init, 2 * 2 - 1)] == [3]
    assert scheduler._draft_lengths(running, 256) == [0]
    assert scheduler._draft_lengths(running, 1 + 2) == [0]  # the count starts again after a reprobe
    scheduler.gate.choose = lambda n: 0  # plain steps the gate chose are not drafts the costs ruled out
    for _ in range(2 * REPROBE_STEPS):
        assert scheduler._draft_lengths(running, 256) == [0]


def test_streams_are_all_served_where_costs_rise_smoothly_or_drafts_are_fixed():
    scheduler = make(draft=PLAIN)
    scheduler.costs = Linear()
    for r in range(2, 20):
        scheduler.costs.record(r, float(r))
    assert [scheduler._streams_served(n) for n in (1, 2, 7, 13)] == [1, 2, 7, 13]
    fixed = make(draft=FIXED)  # fixed draft lengths: every stream drafts, none waits
    add(fixed, *([5 + i] for i in range(7)))
    step(fixed)
    fixed.costs = Stairs()
    assert len(fixed.schedule().logits) == 7


def test_by_default_prompt_chunks_fill_the_row_budget_beside_the_streams():
    """No bound on how much dearer a reading step gets (the default, as vLLM's chunked prefill): beside one stream,
    the first prompt whole (40 rows) and the next one's first 23 rows fill the 64-row budget."""
    scheduler = make(draft=FIXED, max_batch_tokens=64)
    (streaming,) = add(scheduler, [5, 6, 7])
    step(scheduler)
    scheduler.forward_costs = Linear()
    first, second = add(scheduler, range(10, 50), range(60, 100))
    plan = scheduler.schedule()
    assert [(s.kv, s.n) for s in plan.segments] == [(streaming.kv, 1), (first.kv, 40), (second.kv, 23)]
    assert scheduler._prefill_budget(4, 256, rest=100) == 256


def test_prompt_chunks_ride_along_up_to_the_prefill_budget():
    """Costs R seconds for R rows: beside one stream (1 row, 1 s) a step may cost 2 s under a bound of 2, but a
    prompt advances by at least MIN_CHUNK rows: 17 rows in all, the first prompt's chunk 16; the second prompt
    waits."""
    scheduler = make(draft=FIXED, max_batch_tokens=64, **SARATHI)
    (streaming,) = add(scheduler, [5, 6, 7])
    step(scheduler)
    scheduler.forward_costs = Linear()
    first, second = add(scheduler, range(10, 50), range(60, 100))
    plan = scheduler.schedule()
    assert [(s.kv, s.n) for s in plan.segments] == [(streaming.kv, 1), (first.kv, 16)]


def test_a_short_prompt_is_read_whole_where_no_chunk_keeps_the_slowdown():
    """Beside one stream (1 s) no chunk keeps 2 s: MIN_CHUNK rows cost 17 s. A 30-row prompt fits in a step of at most
    2 x 17 s, so it is read whole (31 rows) rather than in a 16-row chunk and then another."""
    scheduler = make(draft=FIXED, max_batch_tokens=64, **SARATHI)
    (streaming,) = add(scheduler, [5, 6, 7])
    step(scheduler)
    scheduler.forward_costs = Linear()
    (prompt,) = add(scheduler, range(10, 40))
    plan = scheduler.schedule()
    assert [(s.kv, s.n) for s in plan.segments] == [(streaming.kv, 1), (prompt.kv, 30)]


def test_a_wave_of_prompts_is_read_against_the_step_of_the_streams_it_will_join():
    """4 streams decode (4 s a step) while 16 new requests' prompts (12 rows each) are read. Bounded by the 4 streams'
    step, the wave would go in one prompt a step (the MIN_CHUNK floor: 20 rows); bounded by the step of the 20
    streams it will be (20 s), a step holds 40 rows: three prompts whole (under a bound of 2)."""
    scheduler = make(max_batch_tokens=256, **SARATHI)
    streaming = add(scheduler, *([5 + i, 6] for i in range(4)))
    step(scheduler)
    assert all(r.decoding for r in streaming)
    scheduler.forward_costs = Linear()
    wave = add(scheduler, *(range(20 + 12 * i, 32 + 12 * i) for i in range(16)))
    plan = scheduler.schedule()
    assert [(s.kv, s.n) for s in plan.segments] == [(r.kv, 1) for r in streaming] + [(r.kv, 12) for r in wave[:3]]
    assert scheduler._prefill_budget(4, 256, rest=12) == 20  # the streams decoding now alone: one prompt a step


def test_a_lone_prompt_takes_the_whole_row_budget_whatever_steps_cost():
    scheduler = make(max_batch_tokens=64)
    scheduler.forward_costs = Linear()
    (request,) = add(scheduler, range(10, 50))
    plan = scheduler.schedule()
    assert [s.n for s in plan.segments] == [40] and plan.logits[0].read_to_end


def test_whole_prompts_that_do_not_fit_wait_and_smaller_ones_behind_them_go():
    scheduler = make(whole_prompts=True, max_batch_tokens=32)
    first, second, third = add(scheduler, range(10, 30), range(30, 50), range(50, 60))
    plan = scheduler.schedule()
    assert [(s.kv, s.n) for s in plan.segments] == [(first.kv, 20), (third.kv, 10)]


def test_a_drafter_that_fails_to_propose_fails_its_request_alone():
    scheduler = make(draft=FIXED)
    bad, good = add(scheduler, [BAD_PROPOSE, 5, 6], [5, 6, 7])
    step(scheduler)
    plan = scheduler.schedule()
    assert plan.failed == [(bad, "the drafter failed: RuntimeError: planted propose fault")]
    assert [(e.request, e.rows) for e in plan.logits] == [(good, 3)] and plan.drafted == 2


def test_a_request_too_long_for_the_kv_budget_fails_in_words():
    scheduler = make(kv_tokens=66, prefix_cache_tokens=0)
    (request,) = add(scheduler, [5, 6, 7])  # alone it needs room_for(3) = 67 rows
    plan = scheduler.schedule()
    assert plan.failed == [(request, "it needs more KV memory than the engine's KV budget (kv_cache_bytes)")]
    assert plan.ids == []


# ---- the prefill budget -----------------------------------------------------------------------------------------


def test_the_prefill_budget_is_the_most_rows_within_the_slowdown():
    scheduler = make(**SARATHI)
    assert scheduler._prefill_budget(20, 256) == 256  # nothing measured yet
    scheduler.forward_costs = Linear()
    assert scheduler._prefill_budget(20, 256) == 40  # 2 x 20 s: 40 rows, on the dot
    assert scheduler._prefill_budget(21, 256) == 42
    assert scheduler._prefill_budget(20, 30) == 30  # the row budget caps it
    assert scheduler._prefill_budget(4, 256) == 20  # at least MIN_CHUNK prompt rows
    # 8 s cannot be kept beside 4 rows (MIN_CHUNK more cost 20 s): a prompt whose rest fits within 2 x 20 s is read
    # whole, a longer one (or one the row budget cannot hold) advances by MIN_CHUNK, a shorter one fits the floor
    assert scheduler._prefill_budget(4, 256, rest=36) == 40
    assert [scheduler._prefill_budget(4, 256, rest=37), scheduler._prefill_budget(4, 30, rest=30)] == [20, 20]
    assert scheduler._prefill_budget(4, 256, rest=10) == 20
    assert scheduler._prefill_budget(20, 256, rest=100) == 40  # where the bound can be kept, it is
    assert scheduler._prefill_budget(4, 256, rest=100, joining=16) == 40  # against the 20 streams it will be
    slower = make(max_decode_slowdown=1.5)
    slower.forward_costs = Linear()
    assert slower._prefill_budget(20, 256) == 36  # 30 rows would do; the MIN_CHUNK floor is higher


def test_the_prefill_budget_reads_forward_costs_not_whole_steps():
    """Whole steps' costs include drafting, spent only where drafts were made: a reading step of as many rows pays
    none of it, so the rows drafted steps visit (here 21-40, a head's batch forward dear) must not shrink chunks."""
    scheduler = make(**SARATHI)
    scheduler.forward_costs = Linear()
    for rows in range(20, 41):
        scheduler.costs.record(rows, 1000.0 if rows > 20 else 20.0)
    assert scheduler._prefill_budget(20, 256) == 40


def test_the_prefill_budget_bisects_a_noisy_cost_curve():
    """Measured costs need not grow with the row count; the search is a bisection for the largest count within the
    limit (midpoints rounded up by one: probes 50, 43, 39, 37, 38), so one dear measurement on its path (39 rows)
    stops it below, though 40 is within the limit. This pins the probes, not a rule: another bisection may differ."""
    scheduler = make(**SARATHI)
    scheduler.forward_costs = Spiked()
    assert scheduler._prefill_budget(20, 64) == 38


# ---- KV accounting ----------------------------------------------------------------------------------------------


def test_kv_after_counts_each_slot_at_the_capacity_its_rows_need():
    scheduler = make(prefix_cache_tokens=0)
    decoding, idle = Request(0, [5, 6, 7], RequestParams(), None, None), Request(1, [5], RequestParams(), None, None)
    decoding.kv, idle.kv = holding(3), holding(3, 64)  # 67 rows of room each; the idle one full
    scheduler.running = [decoding, idle]
    assert idle.kv.length == idle.kv.capacity == 67
    assert scheduler._kv_after([decoding], [63], []) == 67 + 67  # 3 + 1 + 63 rows: the slot as it is
    assert scheduler._kv_after([decoding], [64], []) == room_for(68) + 67  # one more: it grows


def test_kv_after_counts_the_blocks_a_prompt_read_to_its_end_leaves_in_the_prefix_cache():
    scheduler = make()
    request = Request(0, list(range(10, 30)), RequestParams(), None, None)
    request.kv = SequenceKV(1)
    scheduler.running = [request]
    assert scheduler._kv_after([], [], [(request, 20)]) == room_for(20) + 16  # one whole block of 16
    assert scheduler._kv_after([], [], [(request, 19)]) == room_for(19)  # not read to its end: no block


def test_a_step_that_just_fits_keeps_everything():
    scheduler = make(kv_tokens=2 * room_for(3), prefix_cache_tokens=0)
    first, second = add(scheduler, [5, 6, 7], [8, 9, 10])
    plan = scheduler.schedule()
    assert [(s.kv, s.n) for s in plan.segments] == [(first.kv, 3), (second.kv, 3)]


def test_a_step_over_the_budget_drops_the_newest_prompt_chunk_before_preempting():
    scheduler = make(kv_tokens=2 * room_for(3) - 1, prefix_cache_tokens=0)
    first, second = add(scheduler, [5, 6, 7], [8, 9, 10])
    plan = scheduler.schedule()
    assert [(s.kv, s.n) for s in plan.segments] == [(first.kv, 3)]
    assert scheduler.preemptions == 0 and scheduler.running == [first, second]


def test_a_step_over_the_budget_evicts_only_the_prefix_blocks_it_must():
    scheduler = make(kv_tokens=130)  # the prefix cache may hold 65 rows
    scheduler.prefix_cache.insert(list(range(100, 148)), holding(48))  # three blocks
    (request,) = add(scheduler, range(10, 29))  # 83 rows of slot, and one block once read: 17 rows too many
    plan = scheduler.schedule()
    assert [s.n for s in plan.segments] == [19] and scheduler.prefix_cache.tokens == 16  # two blocks evicted

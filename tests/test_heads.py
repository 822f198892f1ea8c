"""Draft heads: training learns the target's continuations, checkpoints round-trip, bad input gets a clear error.
(Losslessness of the head drafter is part of the property test in test_lossless.py.)"""

from __future__ import annotations

import pytest
import torch
from conftest import greedy_records, tiny_head, tiny_model

from leapdecode.controller import DraftLengthController
from leapdecode.decode import decode
from leapdecode.drafters import make_drafter
from leapdecode.errors import LeapDecodeError
from leapdecode.heads.model import load_head
from leapdecode.lab.heads.train import IGNORE, Windows, evaluate, features
from leapdecode.runner import Runner
from leapdecode.sampling import SamplingConfig


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=5)


def held_out(model, head):
    records = greedy_records(model, 10, seed=99)
    index = torch.full((model.config.vocab_size,), IGNORE)
    index[head.vocab_ids] = torch.arange(len(head.vocab_ids))
    return evaluate(head, Windows(features(model, records), records, index, depth=3))


def started_drafters(head, contexts, features):
    """One head drafter per context, started on it and given its feature (no prompt lookup, no confidence floor)."""
    from leapdecode.drafters.head import HeadDrafter

    drafters = []
    for context, feature in zip(contexts, features):
        drafter = HeadDrafter(head, lookup_ngram=0, confidence=0.0)
        drafter.start(context, None)
        drafter.see_hidden(feature)
        drafters.append(drafter)
    return drafters


def test_training_learns_the_targets_continuations(target):
    trained, summary = tiny_head(target, trained=True)
    random_head, _ = tiny_head(target, trained=False)
    good, bad = held_out(target, trained), held_out(target, random_head)
    assert good["mean_accepted"] > 0.8 and good["mean_accepted"] > 3 * bad["mean_accepted"], (good, bad)
    assert summary["val"]["top1_per_step"][0] > 0.4


def test_head_drafts_are_accepted_in_decoding(target):
    head, _ = tiny_head(target, trained=True)
    prompt = greedy_records(target, 1, seed=123)[0]["prompt_ids"]
    out, stats = decode(
        Runner(target),
        prompt,
        make_drafter("head", head=head),
        sampling=SamplingConfig(),
        controller=DraftLengthController(k_init=3, adaptive=False),
        max_new_tokens=30,
        eos_ids=set(),
        context_length=512,
    )
    assert len(out) == 30 and stats.accepted_draft_tokens > 0 and stats.forward_passes < 30


def test_unsure_drafts_stop_early(target):
    """With a confidence threshold the head stops once its draft's estimated probability of acceptance falls under
    it (or would be expected to); a token that fell under is still proposed (the calibration scores it against the
    step's outcome) but not drafted."""
    head, _ = tiny_head(target, trained=False)
    context = greedy_records(target, 1, seed=7)[0]["prompt_ids"]
    feature = torch.randn(target.config.hidden_size, generator=torch.Generator().manual_seed(0))
    lengths, proposed = {}, {}
    for confidence in (0.0, 0.999):
        drafter = make_drafter("head", head=head, lookup_ngram=0, confidence=confidence)
        drafter.start(context, None)
        drafter.see_hidden(feature)
        lengths[confidence] = len(drafter.propose(context, 6).tokens)
        proposed[confidence] = len(drafter.proposal[0]) if drafter.proposal else 0
    # 0.999: not even the first head step may expect to reach it (the head's mean acceptance is under it)
    assert lengths == {0.0: 6, 0.999: 0} and proposed == {0.0: 6, 0.999: 0}
    with pytest.raises(LeapDecodeError, match="confidence threshold must be in"):
        make_drafter("head", head=head, confidence=1.5)


def test_checkpoint_round_trip(target, tmp_path):
    head, _ = tiny_head(target, trained=True)
    head.save(tmp_path, {"summary": {"answer_tokens": 1}})
    loaded = load_head(tmp_path).attach(target)
    for name, value in head.state_dict().items():
        expected = value.to(torch.bfloat16).float() if value.is_floating_point() else value
        assert torch.equal(loaded.state_dict()[name], expected), name
    assert loaded.meta["summary"] == {"answer_tokens": 1}


def test_clear_errors(target):
    with pytest.raises(LeapDecodeError, match="no trained draft head for 'nope'"):
        load_head("nope")
    head, _ = tiny_head(target, trained=False)
    other = tiny_model("llama", seed=6, vocab=80)
    with pytest.raises(LeapDecodeError, match="trained for tiny"):
        head.attach(other)
    with pytest.raises(LeapDecodeError, match="needs a trained draft head"):
        make_drafter("head")


def test_head_also_scores_the_requests_own_tokens(target):
    """Tokens outside the trained vocabulary that occur in the prompt or output are proposed when they score best."""
    from leapdecode.drafters.head import HeadDrafter
    from leapdecode.heads.model import DraftHead, HeadConfig

    config = HeadConfig(hidden_size=64, intermediate_size=32, target_vocab_size=96, target="tiny")
    head = DraftHead(config, torch.arange(0, 96, 2)).attach(target)  # trained on even tokens only
    drafter = HeadDrafter(head)
    drafter.start([7, 9, 11, 8], None)
    drafter.observe([7, 9, 11, 8, 13], 1)
    assert drafter.extra_ids == [7, 9, 11, 13]
    assert len(drafter._extra_weight) == 0, "observing without drafting gathered output-head rows"
    allowed = torch.tensor(sorted(set(range(0, 96, 2)) | {7, 9, 11, 13}))
    full = target.get_output_embeddings().weight.detach()
    picks = []
    for seed in range(40):
        feature = torch.randn(64, generator=torch.Generator().manual_seed(seed))
        scores = full[allowed] @ feature
        picks.append(int(allowed[scores.argmax()]))
        token, probability = drafter._top1(feature, head.logits(feature))
        assert int(token) == picks[-1]
        assert probability == pytest.approx(float(scores.softmax(-1).max()), rel=1e-4)
    assert set(picks) & {7, 9, 11, 13}, "no seed exercised a request token"


def test_cli_rejects_nonsense_before_loading_anything(tmp_path, capsys):
    from leapdecode.cli import main

    assert main(["heads", "train", "--out", str(tmp_path), "--epochs", "0"]) == 2
    assert main(["generate", "hi", "--drafter", "ngram", "--head", str(tmp_path)]) == 2
    assert main(["heads", "train", "--out", str(tmp_path), "--rounds", "self,tweets"]) == 2
    assert main(["heads", "train", "--out", str(tmp_path), "--rounds", "categories"]) == 2
    assert main(["heads", "train", "--out", str(tmp_path), "--writer", "qwen2.5-coder-1.5b"]) == 2
    assert main(["heads", "train", "--out", str(tmp_path), "--init", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[:2] == [
        "leapdecode: error: --vocab, --depth, --epochs, --batch-size and --lr must be positive",
        "leapdecode: error: --head goes with --drafter head",
    ]
    assert err[2] == "leapdecode: error: --rounds takes self and categories, got self,tweets"
    assert err[3:5] == ["leapdecode: error: --writer goes with --rounds categories, and it needs one"] * 2
    assert err[5].startswith("leapdecode: error: no trained draft head for") and len(err) == 6


def test_questions_the_target_writes_become_prompts():
    import random

    from leapdecode.lab.heads.prompts import SUBJECTS, question_requests, subject_round, written_question

    assert (
        written_question('A curious student might ask: "What is the difference between a hawk and an owl?"')
        == "What is the difference between a hawk and an owl?"
    )
    assert written_question("Why do people enjoy picnics?\nThey are fun.") == "Why do people enjoy picnics?"
    for unusable in ["Why atoms?", "How to make a wooden chair.", "Why would a child ask about backups?", "", "  "]:
        assert written_question(unusable) is None, unusable
    assert len(question_requests()) == 3 * len(SUBJECTS)
    chats = subject_round(random.Random(0), ["Why do owls hunt at night?"])
    assert len(chats) == 1 + 2 * len(SUBJECTS) and [{"role": "user", "content": "Why do owls hunt at night?"}] in chats


def test_open_round_samples_questions_reproducibly(tmp_path):
    from tiny_hf import make_tiny_hf_dir
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from leapdecode.lab.heads.data import answer
    from leapdecode.lab.heads.prompts import AREAS, OPEN_REQUESTS, open_question_requests

    requests = open_question_requests(3)
    assert len(requests) == 3 * len(AREAS) * len(OPEN_REQUESTS) and len({r[0]["content"] for r in requests}) == len(
        AREAS
    ) * len(OPEN_REQUESTS)
    path = make_tiny_hf_dir(tmp_path)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    chats = [[{"role": "user", "content": "hello world"}]] * 6
    greedy = [r["answer_ids"] for r in answer(model, tokenizer, chats, 8)]
    sampled = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        sampled.append([r["answer_ids"] for r in answer(model, tokenizer, chats, 8, temperature=5.0, top_k=0)])
    assert all(row == greedy[0] for row in greedy)
    assert sampled[0] == sampled[1] and sampled[0] != sampled[2] and len({tuple(r) for r in sampled[0]}) > 1


def test_training_continues_from_a_head(target):
    """With init, training starts from that head's weights and keeps its vocabulary and width (a learning rate of
    almost nothing leaves its agreement as it was)."""
    from leapdecode.lab.heads.train import HeadTrainConfig, train_head

    trained, _ = tiny_head(target, trained=True)
    cfg = HeadTrainConfig(vocab=5, intermediate=64, epochs=1, batch_size=64, lr=1e-12, val_share=0.2)
    continued, _ = train_head(target, greedy_records(target, 8, seed=3), cfg, "tiny", log=lambda *a: None, init=trained)
    assert torch.equal(continued.vocab_ids, trained.vocab_ids)
    assert continued.config.intermediate_size == trained.config.intermediate_size
    assert held_out(target, continued) == held_out(target, trained)


def test_category_requests_become_target_prompts():
    import random

    from leapdecode.lab.bench.make_suites import MT_BENCH_CATEGORIES, SINGLE_TURN_CATEGORIES
    from leapdecode.lab.heads.category_prompts import CATEGORIES, LONG, target_prompt, writer_requests

    assert set(CATEGORIES) == set(MT_BENCH_CATEGORIES + SINGLE_TURN_CATEGORIES)
    requests = writer_requests(random.Random(0), 3)
    assert (
        len(requests) == 3 * (len(CATEGORIES) - len(LONG)) + len(LONG)
        and len({chat[0]["content"] for _, _, chat in requests}) > 30
    )
    passage = "Tides rise and fall twice a day because the moon pulls on the oceans."
    assert target_prompt("rag", "German", passage) is None  # no question to answer
    assert target_prompt("rag", "German", f"{passage}\nQuestion: Why do tides rise?").endswith(
        f"Passage: {passage}\n\nQuestion: Why do tides rise?"
    )
    assert target_prompt("translation", "French", "Le maire a ouvert la nouvelle ligne de tram hier.").startswith(
        "Translate the following French text into English."
    )
    assert (
        target_prompt("qa", "", '"When did the first tram run in Lisbon?"') == "When did the first tram run in Lisbon?"
    )
    looping = "The first bicycle was made of wood and iron. " * 3
    assert target_prompt("summarization", "", looping) is None and target_prompt("qa", "", "Why?") is None


def test_category_round_answers_the_requests_a_writer_wrote(tmp_path):
    from types import SimpleNamespace

    from tiny_hf import make_tiny_hf_dir
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from leapdecode.lab.heads.category_prompts import CATEGORIES, LONG
    from leapdecode.lab.heads.data import build_dataset, load_dataset

    path = make_tiny_hf_dir(tmp_path / "model", context=1024)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    writer = SimpleNamespace(model=model, tokenizer=tokenizer)
    out = tmp_path / "data.jsonl"
    records = build_dataset(
        model, tokenizer, out, max_new_tokens=64, rounds=("categories",), writer=writer, per_category=2
    )
    # two requests per category, one per passage category (22 in all), wrapped into the target's prompts: a random
    # writer never writes "Question:", so the RAG request is dropped, and so is a reply cut short by an early EOS;
    # then follow-ups to a quarter of the answers
    prompts = [r["chat"][0]["content"] for r in records]
    for wrapper in ("Translate the following", "Extract every person", "Summarize the following article"):
        assert sum(p.startswith(wrapper) for p in prompts) == 1, wrapper
    assert not any(p.startswith("Answer the question using only the information") for p in prompts)
    follow = [
        r
        for r in records
        if len(r["chat"]) == 4
        or r["chat"][0]["content"].startswith(
            ("Rewrite", "Summarize the following text", "Answer the question using only the documents")
        )
    ]
    firsts = len(records) - len(follow)
    assert 2 * (len(CATEGORIES) - len(LONG)) <= firsts <= 21 and len(follow) == firsts // 4
    assert load_dataset(out) == [{"prompt_ids": r["prompt_ids"], "answer_ids": r["answer_ids"]} for r in records]
    assert all(0 < len(r["answer_ids"]) <= 64 for r in records)
    with pytest.raises(LeapDecodeError, match="'categories' needs a writer model"):
        build_dataset(model, tokenizer, out, rounds=("categories",))


def test_cli_continues_training_a_head_on_given_answers(tmp_path):
    import json

    from tiny_hf import make_tiny_hf_dir
    from transformers import AutoModelForCausalLM

    from leapdecode.cli import main

    path = make_tiny_hf_dir(tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(path)
    start, _ = tiny_head(model, trained=False)
    start.vocab_ids = start.vocab_ids[::2].clone()  # a vocabulary the data would not pick
    start.save(tmp_path / "start")
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in greedy_records(model, 6, seed=1, length=20)))
    args = ["heads", "train", "--model", str(path), "--data", str(data), "--init", str(tmp_path / "start")]
    assert main([*args, "--epochs", "1", "--out", str(tmp_path / "out")]) == 0
    head = load_head(tmp_path / "out")
    assert torch.equal(head.vocab_ids, start.vocab_ids) and head.meta["summary"]["answers"] == 6
    assert head.meta["summary"]["vocab"] == len(start.vocab_ids)  # what the head has, not the --vocab setting


def rule(drafter, context, k):
    """The head drafter's rule, step by step: the lookup's copy where it finds one (cut where the estimated
    probability that all of it is accepted falls under the floor); else the head's top-1 tokens while that
    probability stays at or above the floor, and only while the next token may expect to stay there."""
    from leapdecode.drafters.head import HEAD_PRIOR
    from leapdecode.kernels import packed_kernels

    if k == 0 or drafter.feature is None:
        return []
    copies_only = drafter.tiers[drafter.tier] == "copies"
    if drafter.lookup:
        drafter.lookup.floor = drafter.stop_below
        drafter.lookup.min_ngram = 1 if copies_only else drafter.lookup_ngram
        copied = drafter.lookup.propose(context, k).tokens
        if copied or copies_only:
            return list(copied)
    feature, token, tokens, probability = drafter.feature, torch.tensor(context[-1]), [], 1.0
    group = ("head", True)
    with torch.inference_mode(), packed_kernels(True):
        while len(tokens) < k:
            feature = drafter.head.step(feature, token)
            best, p = drafter._top1(feature, drafter.head.logits(feature))
            probability *= drafter.calibration.rate(group, min(int(p * 20), 19), p)
            if probability < drafter.stop_below:
                break
            tokens.append(best)
            token = torch.tensor(best)
            if probability * drafter.calibration.mean(group, HEAD_PRIOR) < drafter.stop_below:
                break
    return tokens


def test_drafts_made_together_equal_drafts_made_alone(target):
    """The engine drafts all sequences of a head in one batch (HeadDrafter.propose_many): each gets the draft it
    would get alone, whatever its lookup copied, its k, its own extra tokens or where its confidence stops it."""
    from leapdecode import kernels
    from leapdecode.drafters.head import HeadDrafter

    head, _ = tiny_head(target, trained=True)
    gen = torch.Generator().manual_seed(3)
    drafters, contexts = [], []
    for i in range(6):
        drafter = HeadDrafter(head, confidence=0.1 if i % 2 else 0.0)
        context = torch.randint(0, 96, (12 + i,), generator=gen).tolist()
        if i == 3:
            context += context[4:7] * 2  # a repeat: the lookup copies what followed it
        drafter.start(context, None)
        drafter.see_hidden(torch.randn(64, generator=gen) * 3)
        drafters.append(drafter)
        contexts.append(context)
    drafters[4].see_hidden(None)  # no feature: no draft
    drafters[1].tier = drafters[3].tier = 0  # the engine's gate may ask for copies alone
    ks = [1, 4, 6, 12, 3, 0]
    with kernels.configured(linear="native"):  # a row's bits independent of the batch (the panel kernel)
        together = HeadDrafter.propose_many(drafters, contexts, ks)
        alone = [d.propose(c, k) for d, c, k in zip(drafters, contexts, ks)]
        by_rule = [rule(d, c, k) for d, c, k in zip(drafters, contexts, ks)]
    assert [d.tokens for d in together] == [d.tokens for d in alone] == by_rule
    assert [len(d.tokens) for d in together][4:] == [0, 0] and all(len(d.tokens) <= k for d, k in zip(together, ks))
    assert any(0 < len(d.tokens) < k for d, k in zip(together, ks))  # a confidence stop was exercised
    assert together[3].tokens == contexts[3][4:7], "the lookup's copy is the draft"


def test_the_copies_tier_drafts_copies_from_one_matching_token_and_never_steps_the_head(target, monkeypatch):
    """Tier "copies" (set by the engine's gate): the lookup alone, from a match of one token on; the whole tier
    (-1) copies from two matching tokens on and else rolls the head."""
    from leapdecode.drafters.head import HeadDrafter

    head, _ = tiny_head(target, trained=True)
    context = [7, 30, 31, 32, 8, 9, 10, 30]  # the last token occurred once before, the last two never
    drafter = HeadDrafter(head, confidence=0.0)
    drafter.start(context, None)
    drafter.see_hidden(torch.randn(64, generator=torch.Generator().manual_seed(0)))
    assert drafter.tiers == ("copies", "head") and drafter.tier == -1
    whole = drafter.propose(context, 3).tokens
    assert whole and whole != [31, 32, 8]  # no two-token match: the head's tokens
    drafter.tier = 0
    monkeypatch.setattr(head, "step", lambda *a: pytest.fail("the head stepped in the copies tier"))
    assert drafter.propose(context, 3).tokens == [31, 32, 8]
    assert drafter.propose(context + [11], 3).tokens == []  # no match at all: no draft, no head step
    assert HeadDrafter(head, lookup_ngram=0).tiers == ("head",)  # no lookup: the head is its only way


def test_int8_products_follow_fp32_and_work_row_by_row():
    """heads.precision.Int8Linear: within int8 weight and bf16 input rounding of the fp32 product, and each row's
    result the same whatever other rows share the call (batched drafting gives each sequence its own draft)."""
    from leapdecode.heads.precision import Int8Linear, int8_available

    if not int8_available():
        pytest.skip("this torch has no weight-only int8 product")
    gen = torch.Generator().manual_seed(0)
    weight, x = torch.randn(96, 64, generator=gen), torch.randn(7, 64, generator=gen)
    layer = Int8Linear(weight)
    exact, got = x @ weight.T, layer(x)
    bound = (x.abs() @ weight.abs().T) * (2.0**-8 + 1 / 254) * 1.05  # bf16 input rounding + half a quantum per weight
    assert got.dtype == torch.float32 and bool(((got - exact).abs() <= bound).all())
    assert bool(((got - exact).abs() > 0).any())  # it is not the fp32 product in disguise
    assert all(torch.equal(layer(x[i : i + 1])[0], got[i]) for i in range(len(x)))


def test_int8_head_drafts_together_as_alone_and_agrees_with_fp32(target):
    """The int8 copy of a trained head: batched drafts equal drafts made alone (the engine's case) and its tokens
    mostly agree with the fp32 head's; the fp32 head is left as it was."""
    from leapdecode.drafters.head import HeadDrafter
    from leapdecode.heads.precision import int8_available, int8_head

    if not int8_available():
        pytest.skip("this torch has no weight-only int8 product")
    head, _ = tiny_head(target, trained=True)
    quantized = int8_head(head)
    assert head.out_linear is None and type(head.fuse) is torch.nn.Linear and quantized.out_linear is not None
    gen = torch.Generator().manual_seed(4)
    contexts = [torch.randint(0, 96, (10 + i,), generator=gen).tolist() for i in range(5)]
    features = [torch.randn(64, generator=gen) * 3 for _ in contexts]
    drafts = {}
    for name, h in (("fp32", head), ("int8", quantized)):
        drafters = started_drafters(h, contexts, features)
        together = HeadDrafter.propose_many(drafters, contexts, [4] * len(contexts))
        alone = [d.propose(c, 4) for d, c in zip(drafters, contexts)]
        assert [d.tokens for d in together] == [d.tokens for d in alone]
        drafts[name] = [t for d in together for t in d.tokens]
    same = sum(a == b for a, b in zip(drafts["fp32"], drafts["int8"]))
    assert same >= 0.8 * len(drafts["fp32"])


def test_the_attached_head_runs_in_the_precision_measured_fastest(target, monkeypatch, tmp_path):
    """drafters.factory.attached_head times fp32, bf16 and (where torch has it) int8 on the head and keeps the
    fastest; `fastest` picks the quickest candidate by its measured step. The clock here is a fake one that each
    candidate advances by its cost, so the choice does not hang on how busy the host is."""
    from types import SimpleNamespace

    from leapdecode.heads import precision

    head, _ = tiny_head(target, trained=False)
    now = [0.0]
    monkeypatch.setattr(precision, "time", SimpleNamespace(perf_counter=lambda: now[0]))

    class Costing:
        config = head.config

        def __init__(self, cost, first_cost=None):
            self.cost, self.first_cost = cost, first_cost

        def draft_step(self, feature, token):
            now[0] += self.cost if self.first_cost is None else self.first_cost
            self.first_cost = None
            return head.draft_step(feature, token)

    cold = Costing(1e-4, first_cost=1.0)  # the fastest, once past a cold first step: the best repeat counts
    assert precision.fastest({"fp32": Costing(1e-3), "bf16": cold}, repeats=2, steps=3) == "bf16"
    assert precision.fastest({"fp32": Costing(1e-4), "bf16": Costing(1e-3)}, repeats=2, steps=3) == "fp32"

    class Broken(Costing):
        def draft_step(self, feature, token):
            raise RuntimeError("this kernel does not take that shape")

    assert precision.fastest({"fp32": Costing(1e-3), "int8": Broken(1e-4)}, repeats=2, steps=3) == "fp32"

    from leapdecode.drafters.factory import attached_head

    head.save(tmp_path / "head")
    for wanted in ("bfloat16", "int8") if precision.int8_available() else ("bfloat16",):
        monkeypatch.setattr(precision, "fastest", lambda candidates, wanted=wanted: wanted)
        chosen = attached_head(SimpleNamespace(model=tiny_model("llama", seed=5)), tmp_path / "head")
        assert chosen.precision == wanted
        assert (chosen.out_linear is not None) == (wanted == "int8")
        assert chosen.embed_norm.weight.dtype == (torch.bfloat16 if wanted == "bfloat16" else torch.float32)


def test_the_q8_heads_native_step_follows_its_torch_route_row_by_row(target):
    """kernels.head_step: a q8 head's step and slice scores in one native call agree with its torch route to fp32
    rounding, give each row the bits it gets alone (batched drafting), and draft as that route does; with the
    native elementwise operations turned off the head keeps the torch route."""
    from leapdecode import kernels
    from leapdecode.drafters.head import HeadDrafter
    from leapdecode.heads.precision import q8_available, q8_head

    if not q8_available():
        pytest.skip("the native kernels are not built here")
    head, _ = tiny_head(target, trained=True)
    quantized = q8_head(head)
    native = quantized.native_step
    assert native is not None and head.native_step is None
    gen = torch.Generator().manual_seed(5)
    features, tokens = torch.randn(5, 64, generator=gen) * 3, torch.randint(0, 96, (5,), generator=gen)
    with torch.inference_mode(), kernels.packed_kernels(True):
        got, scores = quantized.draft_step(features, tokens)
        stepped = quantized.step(features, tokens)
        expected = quantized.logits(stepped)
        assert torch.allclose(got, stepped, rtol=1e-4, atol=1e-4) and torch.allclose(scores, expected, atol=1e-3)
        assert not torch.equal(got, features)
        for i in range(len(features)):
            one, one_scores = native(features[i : i + 1], tokens[i : i + 1])
            assert torch.equal(one[0], got[i]) and torch.equal(one_scores[0], scores[i])
    contexts = [torch.randint(0, 96, (10 + i,), generator=gen).tolist() for i in range(4)]
    drafts = {}
    for route in ("native", "torch"):
        quantized.native_step = native if route == "native" else None
        drafters = started_drafters(quantized, contexts, features)
        together = HeadDrafter.propose_many(drafters, contexts, [4] * len(contexts))
        assert [d.tokens for d in together] == [d.propose(c, 4).tokens for d, c in zip(drafters, contexts)]
        drafts[route] = [d.tokens for d in together]
    assert drafts["native"] == drafts["torch"]  # a near tie could part them; these features have none
    with kernels.configured(elementwise="torch"):
        assert q8_head(head).native_step is None

